// SPDX-License-Identifier: GPL-2.0-only
//
// usnvme's fio ioengine: the fio side. Compiled against the headers of the fio version that
// loads it (`cargo xtask fio-engine`); reads fio's structures and calls the engine's narrow C
// interface (tools/fio/src/ffi.rs), which sees none of them.
//
// One fio job (thread=1) is one engine job: its files are opened once per job at `setup` (the
// process's controllers are shared by every job), its I/O queues made at `init` on the job's
// own thread, fio's I/O buffers come from DMA memory (`iomem_alloc`), and an I/O's token is its
// io_u.

#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fio.h"
#include "optgroup.h"

#define ERR_LEN 512

struct usnvme_files;
struct usnvme_job;
struct usnvme_done {
	uint64_t token;
	bool failed;
};

/* How a job reaches remote subsystems (tools/fio/src/ffi.rs RemoteOptions). */
struct usnvme_remote_options {
	const char *hostnqn; /* NULL or empty: this machine's */
	bool hdr_digest;
	bool data_digest;
	uint32_t keep_alive_tmo;
	uint32_t reconnect_delay;
	int32_t ctrl_loss_tmo;
};

/* tools/fio/src/ffi.rs */
struct usnvme_files *usnvme_fio_files_open(const char **names, size_t count, const uint64_t *bs,
					   size_t bs_count,
					   const struct usnvme_remote_options *remote,
					   uint64_t *sizes, char *err, size_t err_len);
void usnvme_fio_files_close(struct usnvme_files *files);
struct usnvme_job *usnvme_fio_job_new(const struct usnvme_files *files, uint32_t depth,
				      uint64_t max_io, bool paced, char *err, size_t err_len);
void usnvme_fio_job_free(struct usnvme_job *job);
int usnvme_fio_alloc_buffers(struct usnvme_job *job, size_t len, uint8_t **start, char *err,
			     size_t err_len);
void usnvme_fio_free_buffers(struct usnvme_job *job);
int usnvme_fio_queue(struct usnvme_job *job, uint32_t file, uint32_t op, uint64_t offset,
		     uint64_t len, const uint8_t *buf, uint64_t token);
void usnvme_fio_commit(struct usnvme_job *job);
int usnvme_fio_reap(struct usnvme_job *job, uint32_t min, uint32_t max, int64_t timeout_ns,
		    const struct usnvme_done **events);
void usnvme_fio_failure(char *buf, size_t len);

/* the op codes of usnvme_fio_queue */
enum { OP_READ = 0, OP_WRITE = 1, OP_TRIM = 2, OP_FLUSH = 3 };

/*
 * The engine's options (td->eo), fio's way: `--hostnqn=NQN --hdr_digest=1 …` on the command
 * line or in a job file, listed by `fio --enghelp=/path/to/libusnvme_fio.so`. Named as nvme-cli's
 * `connect` names them, with its defaults; they apply to the job's remote (tcp://) files.
 */
struct usnvme_options {
	void *pad; /* fio's: the first member of every engine's options */
	char *hostnqn;
	unsigned int hdr_digest;
	unsigned int data_digest;
	unsigned int keep_alive_tmo;
	unsigned int reconnect_delay;
	int ctrl_loss_tmo;
};

static struct fio_option usnvme_options[] = {
	{
		.name = "hostnqn",
		.lname = "usnvme host NQN",
		.type = FIO_OPT_STR_STORE,
		.off1 = offsetof(struct usnvme_options, hostnqn),
		.help = "Host NQN to connect to remote subsystems as (default: /etc/nvme/hostnqn, "
			"else one derived from /etc/machine-id)",
		.category = FIO_OPT_C_ENGINE,
		.group = FIO_OPT_G_INVALID,
	},
	{
		.name = "hdr_digest",
		.lname = "usnvme header digest",
		.type = FIO_OPT_BOOL,
		.off1 = offsetof(struct usnvme_options, hdr_digest),
		.def = "0",
		.help = "Ask remote subsystems for header digests (CRC32C over each PDU header)",
		.category = FIO_OPT_C_ENGINE,
		.group = FIO_OPT_G_INVALID,
	},
	{
		.name = "data_digest",
		.lname = "usnvme data digest",
		.type = FIO_OPT_BOOL,
		.off1 = offsetof(struct usnvme_options, data_digest),
		.def = "0",
		.help = "Ask remote subsystems for data digests (CRC32C over each PDU's data)",
		.category = FIO_OPT_C_ENGINE,
		.group = FIO_OPT_G_INVALID,
	},
	{
		.name = "keep_alive_tmo",
		.lname = "usnvme Keep Alive timeout",
		.type = FIO_OPT_INT,
		.off1 = offsetof(struct usnvme_options, keep_alive_tmo),
		.def = "5",
		.minval = 0,
		.maxval = 3600,
		.help = "Keep Alive Timeout asked of remote subsystems, in seconds (0: none)",
		.category = FIO_OPT_C_ENGINE,
		.group = FIO_OPT_G_INVALID,
	},
	{
		.name = "reconnect_delay",
		.lname = "usnvme reconnect delay",
		.type = FIO_OPT_INT,
		.off1 = offsetof(struct usnvme_options, reconnect_delay),
		.def = "10",
		.minval = 1,
		.maxval = 3600,
		.help = "Seconds between attempts to reconnect to a remote subsystem that went away",
		.category = FIO_OPT_C_ENGINE,
		.group = FIO_OPT_G_INVALID,
	},
	{
		.name = "ctrl_loss_tmo",
		.lname = "usnvme controller loss timeout",
		.type = FIO_OPT_INT,
		.off1 = offsetof(struct usnvme_options, ctrl_loss_tmo),
		.def = "600",
		.minval = -1,
		.maxval = 86400,
		.help = "Seconds after losing a remote subsystem before its I/O fails (0: at once, "
			"-1: never)",
		.category = FIO_OPT_C_ENGINE,
		.group = FIO_OPT_G_INVALID,
	},
	{
		.name = NULL,
	},
};

/* A job's engine state (td->io_ops_data). */
struct usnvme_td {
	struct usnvme_files *files;
	struct usnvme_job *job;
	const struct usnvme_done *events;
};

static int usnvme_setup(struct thread_data *td)
{
	struct usnvme_td *s = td->io_ops_data;
	struct fio_file *f;
	unsigned int i;
	const char **names;
	uint64_t *sizes;
	const struct usnvme_options *o = td->eo;
	struct usnvme_remote_options remote = { 0 };
	char err[ERR_LEN] = "";
	const uint64_t bs[] = {
		td->o.min_bs[DDIR_READ],  td->o.max_bs[DDIR_READ],  td->o.min_bs[DDIR_WRITE],
		td->o.max_bs[DDIR_WRITE], td->o.min_bs[DDIR_TRIM],  td->o.max_bs[DDIR_TRIM],
	};

	if (s)
		return 0; /* set up already (setup_files runs again without create_serialize) */
	if (!td->o.use_thread) {
		log_err("fio: usnvme: the engine needs thread=1 (--thread): its jobs share the "
			"drives one process opened\n");
		return 1;
	}
	if (!td->files_index) {
		log_err("fio: usnvme: no filename= given (a drive such as 0000.01.00.0)\n");
		return 1;
	}
	s = calloc(1, sizeof(*s));
	names = calloc(td->files_index, sizeof(*names));
	sizes = calloc(td->files_index, sizeof(*sizes));
	if (!s || !names || !sizes) {
		log_err("fio: usnvme: out of memory\n");
		goto fail;
	}
	for (i = 0; i < td->files_index; i++)
		names[i] = td->files[i]->file_name;
	if (o) {
		remote.hostnqn = o->hostnqn;
		remote.hdr_digest = o->hdr_digest;
		remote.data_digest = o->data_digest;
		remote.keep_alive_tmo = o->keep_alive_tmo;
		remote.reconnect_delay = o->reconnect_delay;
		remote.ctrl_loss_tmo = o->ctrl_loss_tmo;
	}
	s->files = usnvme_fio_files_open(names, td->files_index, bs, sizeof(bs) / sizeof(bs[0]),
					 o ? &remote : NULL, sizes, err, sizeof(err));
	if (!s->files) {
		log_err("fio: usnvme: %s\n", err);
		goto fail;
	}
	for (i = 0; i < td->files_index; i++) {
		f = td->files[i];
		f->real_file_size = sizes[i];
		f->filetype = FIO_TYPE_BLOCK;
		fio_file_set_size_known(f);
	}
	td->io_ops_data = s;
	free(names);
	free(sizes);
	return 0;
fail:
	free(s);
	free(names);
	free(sizes);
	return 1;
}

/* Whether fio may sleep with I/Os queued but not yet reaped: a rate or a think time. */
static bool usnvme_paced(struct thread_data *td)
{
	int d;

	if (td->o.thinktime)
		return true;
	for (d = 0; d < DDIR_RWDIR_CNT; d++)
		if (td->o.rate[d] || td->o.rate_iops[d])
			return true;
	return false;
}

static int usnvme_init(struct thread_data *td)
{
	struct usnvme_td *s;
	char err[ERR_LEN] = "";
	uint64_t max_io = 0;
	int d;

	/* without create_serialize, fio inits a job before it sets its files up */
	if (!td->io_ops_data && usnvme_setup(td))
		return 1;
	s = td->io_ops_data;
	for (d = 0; d < DDIR_RWDIR_CNT; d++)
		if (td->o.max_bs[d] > max_io)
			max_io = td->o.max_bs[d];
	s->job = usnvme_fio_job_new(s->files, td->o.iodepth, max_io, usnvme_paced(td), err,
				    sizeof(err));
	if (!s->job) {
		log_err("fio: usnvme: %s\n", err);
		return 1;
	}
	return 0;
}

static void usnvme_cleanup(struct thread_data *td)
{
	struct usnvme_td *s = td->io_ops_data;

	if (!s)
		return;
	usnvme_fio_job_free(s->job);
	usnvme_fio_files_close(s->files);
	free(s);
	td->io_ops_data = NULL;
}

static int usnvme_iomem_alloc(struct thread_data *td, size_t total)
{
	struct usnvme_td *s = td->io_ops_data;
	char err[ERR_LEN] = "";
	uint8_t *start = NULL;

	if (!s || !s->job) {
		log_err("fio: usnvme: I/O buffers asked for before the job was set up\n");
		return 1;
	}
	if (usnvme_fio_alloc_buffers(s->job, total, &start, err, sizeof(err))) {
		log_err("fio: usnvme: %s\n", err);
		return 1;
	}
	td->orig_buffer = (char *)start;
	return 0;
}

static void usnvme_iomem_free(struct thread_data *td)
{
	struct usnvme_td *s = td->io_ops_data;

	if (s && s->job)
		usnvme_fio_free_buffers(s->job);
	td->orig_buffer = NULL;
}

/* The drives were attached at setup: nothing to open per file. */
static int usnvme_open_file(struct thread_data *td, struct fio_file *f)
{
	return 0;
}

static int usnvme_close_file(struct thread_data *td, struct fio_file *f)
{
	return 0;
}

static enum fio_q_status usnvme_queue(struct thread_data *td, struct io_u *io_u)
{
	struct usnvme_td *s = td->io_ops_data;
	uint32_t op;
	int rc;

	fio_ro_check(td, io_u);
	switch (io_u->ddir) {
	case DDIR_READ:
		op = OP_READ;
		break;
	case DDIR_WRITE:
		op = OP_WRITE;
		break;
	case DDIR_TRIM:
		op = OP_TRIM;
		break;
	case DDIR_SYNC:
	case DDIR_DATASYNC:
		op = OP_FLUSH;
		break;
	default:
		io_u->error = EINVAL;
		return FIO_Q_COMPLETED;
	}
	rc = usnvme_fio_queue(s->job, io_u->file->fileno, op, io_u->offset, io_u->xfer_buflen,
			      io_u->xfer_buf, (uint64_t)(uintptr_t)io_u);
	if (rc == 0)
		return FIO_Q_QUEUED;
	if (rc == 1)
		return FIO_Q_BUSY;
	io_u->error = EINVAL; /* why: errdetails */
	return FIO_Q_COMPLETED;
}

static int usnvme_commit(struct thread_data *td)
{
	struct usnvme_td *s = td->io_ops_data;

	usnvme_fio_commit(s->job);
	return 0;
}

static int usnvme_getevents(struct thread_data *td, unsigned int min, unsigned int max,
			    const struct timespec *t)
{
	struct usnvme_td *s = td->io_ops_data;
	int64_t timeout_ns = t ? (int64_t)t->tv_sec * 1000000000 + t->tv_nsec : -1;

	return usnvme_fio_reap(s->job, min, max, timeout_ns, &s->events);
}

static struct io_u *usnvme_event(struct thread_data *td, int event)
{
	struct usnvme_td *s = td->io_ops_data;
	const struct usnvme_done *done = &s->events[event];
	struct io_u *io_u = (struct io_u *)(uintptr_t)done->token;

	io_u->error = done->failed ? EIO : 0;
	return io_u;
}

/* fio prints it under its own line for a failed I/O: the device and the NVMe status. */
static char *usnvme_errdetails(struct io_u *io_u)
{
	char *why = malloc(ERR_LEN);

	if (why)
		usnvme_fio_failure(why, ERR_LEN);
	return why;
}

static struct ioengine_ops usnvme_ops = {
	.name = "usnvme",
	.version = FIO_IOOPS_VERSION,
	/* DISKLESSIO: file names are not paths (no directories made for tcp://.../NQN) */
	.flags = FIO_RAWIO | FIO_NOEXTEND | FIO_NODISKUTIL | FIO_MEMALIGN | FIO_DISKLESSIO,
	.setup = usnvme_setup,
	.init = usnvme_init,
	.cleanup = usnvme_cleanup,
	.queue = usnvme_queue,
	.commit = usnvme_commit,
	.getevents = usnvme_getevents,
	.event = usnvme_event,
	.errdetails = usnvme_errdetails,
	.open_file = usnvme_open_file,
	.close_file = usnvme_close_file,
	.iomem_alloc = usnvme_iomem_alloc,
	.iomem_free = usnvme_iomem_free,
	.options = usnvme_options,
	.option_struct_size = sizeof(struct usnvme_options),
};

/* The fio that loaded us (fio links -rdynamic); weak: absent in anything else. */
#pragma weak fio_version_string

/*
 * fio's `get_ioengine` (exported by the Rust half): the engine only for the fio version its
 * headers came from. fio checks FIO_IOOPS_VERSION itself, but that number misses layout changes
 * of the structures the shim reads, and its message does not say what to do.
 */
void usnvme_fio_shim_get_ioengine(struct ioengine_ops **ops)
{
	const char *loaded = fio_version_string ? fio_version_string : "an unknown program";

	if (strcmp(loaded, USNVME_FIO_VERSION) != 0) {
		fprintf(stderr,
			"fio: usnvme: this engine was built for %s (ioengine ops version %d), "
			"but %s loaded it: rebuild it for this fio with `cargo xtask fio-engine`, "
			"which fetches the source of the installed fio's version\n",
			USNVME_FIO_VERSION, FIO_IOOPS_VERSION, loaded);
		*ops = NULL;
		return;
	}
	*ops = &usnvme_ops;
}
