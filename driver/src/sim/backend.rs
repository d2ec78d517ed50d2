//! What a simulated namespace keeps: nothing (`Null`) or its data in sparse memory (`Ram`).

use std::collections::HashMap;

use parking_lot::Mutex;

/// Granule of the sparse store: 4 KiB of the namespace, whatever its block size.
const CHUNK: usize = 4096;
/// Independent locks, so that threads writing different places rarely meet.
const SHARDS: usize = 16;

/// Where a simulated namespace keeps its data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Backend {
    /// Keeps nothing and moves no data (reads leave the buffer as it was, like Linux's null_blk),
    /// but checks every data pointer as strictly. For measuring the driver's cost.
    #[default]
    Null,
    /// Keeps what was written, sparsely in memory: never-written and deallocated blocks read as
    /// zeroes. For correctness tests.
    Ram,
}

type Shard = Mutex<HashMap<u64, Box<[u8; CHUNK]>>>;

/// The storage of one namespace.
pub(crate) enum Store {
    Null,
    Ram(Box<[Shard]>),
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Store::Null => f.write_str("Null"),
            Store::Ram(_) => write!(f, "Ram({} chunks)", self.chunks()),
        }
    }
}

impl Store {
    pub fn new(kind: Backend) -> Store {
        match kind {
            Backend::Null => Store::Null,
            Backend::Ram => Store::Ram((0..SHARDS).map(|_| Mutex::default()).collect()),
        }
    }

    fn shard(shards: &[Shard], chunk: u64) -> &Shard {
        &shards[chunk as usize % SHARDS]
    }

    /// Fills `buf` with the bytes at `offset` (zeroes where nothing was written).
    pub fn read(&self, offset: u64, buf: &mut [u8]) {
        let Store::Ram(shards) = self else {
            buf.fill(0);
            return;
        };
        let mut done = 0;
        while done < buf.len() {
            let pos = offset + done as u64;
            let (chunk, within) = (pos / CHUNK as u64, pos as usize % CHUNK);
            let n = (CHUNK - within).min(buf.len() - done);
            let out = &mut buf[done..done + n];
            match Self::shard(shards, chunk).lock().get(&chunk) {
                Some(data) => out.copy_from_slice(&data[within..within + n]),
                None => out.fill(0),
            }
            done += n;
        }
    }

    /// Stores `data` at `offset`.
    pub fn write(&self, offset: u64, data: &[u8]) {
        let Store::Ram(shards) = self else { return };
        let mut done = 0;
        while done < data.len() {
            let pos = offset + done as u64;
            let (chunk, within) = (pos / CHUNK as u64, pos as usize % CHUNK);
            let n = (CHUNK - within).min(data.len() - done);
            let mut shard = Self::shard(shards, chunk).lock();
            let stored = shard.entry(chunk).or_insert_with(|| Box::new([0; CHUNK]));
            stored[within..within + n].copy_from_slice(&data[done..done + n]);
            done += n;
        }
    }

    /// Zeroes (and forgets, where whole chunks are covered) `len` bytes at `offset`: Write Zeroes
    /// and deallocation.
    pub fn zero(&self, offset: u64, len: u64) {
        let Store::Ram(shards) = self else { return };
        if len == 0 {
            return;
        }
        let end = offset.saturating_add(len);
        let chunk = CHUNK as u64;
        let zero_part = |from: u64, to: u64| {
            if from >= to {
                return;
            }
            let k = from / chunk;
            if let Some(data) = Self::shard(shards, k).lock().get_mut(&k) {
                data[(from - k * chunk) as usize..(to - k * chunk) as usize].fill(0);
            }
        };
        // a partial chunk at the start, whole chunks (forgotten), a partial chunk at the end
        let head_end = offset.next_multiple_of(chunk).min(end);
        zero_part(offset, head_end);
        if head_end == end {
            return;
        }
        let (first, last) = (head_end / chunk, end / chunk);
        if last - first > 64 * 1024 {
            // a huge range: walk what is stored rather than the range
            for shard in shards.iter() {
                shard.lock().retain(|&k, _| !(first..last).contains(&k));
            }
        } else {
            for k in first..last {
                Self::shard(shards, k).lock().remove(&k);
            }
        }
        zero_part(last * chunk, end);
    }

    /// Forgets everything written: it all reads as zeroes.
    pub fn clear(&self) {
        if let Store::Ram(shards) = self {
            shards.iter().for_each(|s| s.lock().clear());
        }
    }

    /// Whether written data is kept (and so must be read from the host).
    pub fn keeps_data(&self) -> bool {
        matches!(self, Store::Ram(_))
    }

    /// Chunks held in memory.
    pub fn chunks(&self) -> usize {
        match self {
            Store::Null => 0,
            Store::Ram(shards) => shards.iter().map(|s| s.lock().len()).sum(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ram_keeps_data_across_chunks_and_zeroes_ranges() {
        let s = Store::new(Backend::Ram);
        let data: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8 + 1).collect();
        s.write(1000, &data);
        let mut back = vec![0xffu8; 10_000];
        s.read(1000, &mut back);
        assert_eq!(back, data);
        let mut edge = [0xffu8; 8];
        s.read(996, &mut edge);
        assert_eq!(&edge[..4], &[0; 4]);
        assert_eq!(&edge[4..], &data[..4]);
        // zero a range that covers one whole chunk and parts of two
        s.zero(3000, 6000);
        s.read(1000, &mut back);
        assert_eq!(&back[..2000], &data[..2000]);
        assert!(back[2000..8000].iter().all(|&b| b == 0));
        assert_eq!(&back[8000..], &data[8000..]);
        // zero inside one chunk
        s.zero(9100, 10);
        s.read(9100, &mut edge);
        assert_eq!(edge, [0; 8]);
        s.zero(0, 1 << 40);
        assert_eq!(s.chunks(), 0);
    }

    #[test]
    fn null_reads_zeroes() {
        let s = Store::new(Backend::Null);
        s.write(0, &[1, 2, 3]);
        let mut b = [9u8; 3];
        s.read(0, &mut b);
        assert_eq!(b, [0; 3]);
        assert_eq!(s.chunks(), 0);
    }
}
