//! Who this host is on NVMe/TCP: its NQN and host ID, from nvme-cli's files or derived from
//! the machine ID, and the files settings are read from.

use std::path::Path;

use uuid::Uuid;

/// Where the host NQN and host ID come from when none is given: nvme-cli's files, else one
/// derived from the machine ID.
pub const HOSTNQN_FILE: &str = "etc/nvme/hostnqn";
pub const HOSTID_FILE: &str = "etc/nvme/hostid";
pub const MACHINE_ID_FILE: &str = "etc/machine-id";

/// This host's NQN and host ID, under the root `root` (`/`): `etc/nvme/hostnqn` (and
/// `etc/nvme/hostid`) when they exist, as nvme-cli uses them; else a UUID NQN derived from
/// `etc/machine-id` (stable on this machine, and not the machine ID itself). The host ID is the
/// NQN's UUID when it has one.
pub fn host_identity(root: &Path) -> Result<(String, [u8; 16]), String> {
    let read = |path: &str| read_setting(root, path);
    let (nqn, uuid) = match read(HOSTNQN_FILE) {
        Some(nqn) => {
            let uuid = uuid_of(&nqn);
            (nqn, uuid)
        }
        None => {
            let machine = read(MACHINE_ID_FILE).ok_or_else(|| {
                format!(
                    "no host NQN: neither /{HOSTNQN_FILE} nor /{MACHINE_ID_FILE} exists; pass \
                     --hostnqn NQN"
                )
            })?;
            // Stable on this machine, and not the machine ID itself (which is not to be shown).
            let uuid = Uuid::new_v5(&HOST_NAMESPACE, machine.as_bytes());
            (
                format!("nqn.2014-08.org.nvmexpress:uuid:{}", uuid.hyphenated()),
                Some(uuid),
            )
        }
    };
    let id = read(HOSTID_FILE)
        .and_then(|s| Uuid::parse_str(&s).ok())
        .or(uuid)
        .unwrap_or_else(|| Uuid::new_v5(&HOST_NAMESPACE, nqn.as_bytes()));
    Ok((nqn, id.into_bytes()))
}

/// The host NQN given (`--hostnqn`, fio's `hostnqn=`) with its host ID, else this host's
/// ([`host_identity`] under `root`).
pub fn host_identity_or(given: Option<&str>, root: &Path) -> Result<(String, [u8; 16]), String> {
    match given {
        Some(nqn) => Ok((nqn.to_owned(), host_id_for(nqn))),
        None => host_identity(root),
    }
}

/// The text of the file `path` under `root`, trimmed; None when it is missing or empty.
pub(crate) fn read_setting(root: &Path, path: &str) -> Option<String> {
    std::fs::read_to_string(root.join(path))
        .ok()
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
}

/// A host ID for a host NQN given by hand: its UUID when it has one, else one derived from it.
pub fn host_id_for(nqn: &str) -> [u8; 16] {
    uuid_of(nqn)
        .unwrap_or_else(|| Uuid::new_v5(&HOST_NAMESPACE, nqn.as_bytes()))
        .into_bytes()
}

/// The UUID of a UUID NQN (`nqn.2014-08.org.nvmexpress:uuid:…`).
fn uuid_of(nqn: &str) -> Option<Uuid> {
    let (_, u) = nqn.rsplit_once(":uuid:")?;
    Uuid::parse_str(u).ok()
}

/// The namespace of the name-based (version 5) UUIDs usnvme derives host identities in: a
/// fixed random UUID, so that no other program's derivation from the machine ID collides.
const HOST_NAMESPACE: Uuid = Uuid::from_u128(0x6f1c_9a3e_5b8d_5c27_9e41_0d2b_7a6f_3c18);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_identity_from_nvme_cli_files_or_the_machine_id() {
        let dir = std::env::temp_dir().join(format!("usnvme-hostnqn-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("etc/nvme")).expect("a temp dir");
        assert!(host_identity(&dir)
            .expect_err("nothing")
            .contains("--hostnqn"));

        std::fs::write(
            dir.join(MACHINE_ID_FILE),
            "3d1219c7c4c5404aaa1f6d2a48adfda4\n",
        )
        .expect("write");
        let (nqn, id) = host_identity(&dir).expect("derived");
        assert!(nqn.starts_with("nqn.2014-08.org.nvmexpress:uuid:"), "{nqn}");
        assert!(
            !nqn.contains("3d1219c7"),
            "not the machine ID itself: {nqn}"
        );
        assert_eq!(host_identity(&dir).expect("again"), (nqn.clone(), id));
        assert_eq!(Some(Uuid::from_bytes(id)), uuid_of(&nqn));
        assert_eq!(id[6] >> 4, 5, "a name-based (version 5) UUID");

        let given = "nqn.2014-08.org.nvmexpress:uuid:00112233-4455-6677-8899-aabbccddeeff";
        std::fs::write(dir.join(HOSTNQN_FILE), format!("{given}\n")).expect("write");
        let (nqn, id) = host_identity(&dir).expect("from the file");
        assert_eq!(nqn, given);
        assert_eq!(id[..4], [0x00, 0x11, 0x22, 0x33]);
        std::fs::write(
            dir.join(HOSTID_FILE),
            "ffeeddcc-bbaa-9988-7766-554433221100",
        )
        .expect("write");
        assert_eq!(host_identity(&dir).expect("hostid").1[0], 0xff);
        let by_hand = "nqn.2024-01.io.usnvme:host-a";
        assert_eq!(
            host_identity_or(Some(by_hand), &dir).expect("given"),
            (by_hand.to_owned(), host_id_for(by_hand)),
            "an NQN given wins over the files"
        );
        assert_eq!(host_identity_or(None, &dir).expect("files").0, given);
        let _ = std::fs::remove_dir_all(&dir);

        assert_eq!(host_id_for(given)[15], 0xff);
        assert_eq!(host_id_for("nqn.x:y"), host_id_for("nqn.x:y"));
    }
}
