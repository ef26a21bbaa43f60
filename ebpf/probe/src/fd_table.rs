//! User space's side of `FD_TABLE`, the direct array of fd records for the fast watch indexes
//! (see `FAST_WATCHED` in the common crate for why it exists).
//!
//! The table holds 65,536 slots of which a few hundred are in use, so reading it one
//! `bpf_map_lookup_elem` per slot would cost a syscall per slot for every dashboard refresh. The
//! map is created mmapable instead: this maps it read-only once and scans it as memory, looking at
//! one flags word per slot. Writes (zeroing a closed or recycled slot) still go through the map's
//! update syscall, so user space never stores into memory the programs are updating.

use aya::maps::{Array, Map, MapData, MapError};
use std::os::fd::{AsFd, AsRawFd};
use std::ptr::NonNull;
use zerocache_probe_common::{FAST_FDS, FAST_WATCHED, FdRecord, fd_flags};

/// Slots in the table.
const SLOTS: usize = (FAST_WATCHED * FAST_FDS) as usize;

/// `FD_TABLE`, mapped for reading and held for updates.
pub(crate) struct FdTable {
    base: NonNull<FdRecord>,
    len: usize,
    array: Array<MapData, FdRecord>,
}

// SAFETY: the mapping is read-only shared memory that lives as long as this value; reads are plain
// loads of `Copy` data, safe from any thread.
unsafe impl Send for FdTable {}
// SAFETY: as above; `&self` methods only read the mapping.
unsafe impl Sync for FdTable {}

impl FdTable {
    /// Maps the loaded `FD_TABLE` map.
    pub(crate) fn new(map: Map) -> Result<FdTable, MapError> {
        let len = SLOTS * size_of::<FdRecord>();
        let fd = match &map {
            Map::Array(data) => data.fd().as_fd().as_raw_fd(),
            _ => {
                return Err(MapError::InvalidName {
                    name: "FD_TABLE (not an array)".into(),
                });
            }
        };
        // SAFETY: a shared read-only mapping of an mmapable BPF array of exactly `len` bytes (its
        // value size, 304, is a multiple of 8, so the kernel adds no padding per slot).
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED,
                fd,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(MapError::SyscallError(aya::sys::SyscallError {
                call: "mmap",
                io_error: std::io::Error::last_os_error(),
            }));
        }
        let base = NonNull::new(ptr as *mut FdRecord).ok_or(MapError::OutOfBounds {
            index: 0,
            max_entries: 0,
        })?;
        match Array::try_from(map) {
            Ok(array) => Ok(FdTable { base, len, array }),
            Err(e) => {
                // SAFETY: the mapping just created, never handed out.
                unsafe { libc::munmap(ptr, len) };
                Err(e)
            }
        }
    }

    /// The live records of fast watch index `index` with fd numbers in `fds`: (fd, record).
    pub(crate) fn live(
        &self,
        index: u32,
        fds: std::ops::RangeInclusive<u32>,
    ) -> Vec<(u32, FdRecord)> {
        let mut out = Vec::new();
        if index >= FAST_WATCHED {
            return out;
        }
        let last = (*fds.end()).min(FAST_FDS - 1);
        for fd in *fds.start()..=last {
            if self.flags(index, fd) & fd_flags::LIVE != 0 {
                out.push((fd, self.record(index, fd)));
            }
        }
        out
    }

    /// Zeroes one slot: its fd closed, or its index is being handed to another process.
    pub(crate) fn clear(&mut self, index: u32, fd: u32) -> Result<(), MapError> {
        self.array
            .set(index * FAST_FDS + fd, FdRecord::default(), 0)
    }

    /// Zeroes every live slot of `index`, before the index goes to another process. Slots without
    /// `LIVE` may hold counts a program run added after a close, but the kernel clears a slot
    /// when it takes it for a new fd, so they need no syscall here.
    pub(crate) fn clear_index(&mut self, index: u32) -> Result<(), MapError> {
        if index >= FAST_WATCHED {
            return Ok(());
        }
        for fd in 0..FAST_FDS {
            if self.flags(index, fd) & fd_flags::LIVE != 0 {
                self.clear(index, fd)?;
            }
        }
        Ok(())
    }

    /// Writes a raw slot, so tests can leave what a racing program run would.
    #[cfg(test)]
    pub(crate) fn set(&mut self, index: u32, fd: u32, record: FdRecord) -> Result<(), MapError> {
        self.array.set(index * FAST_FDS + fd, record, 0)
    }

    /// Where slot (`index`, `fd`) is. Computing the address needs no `unsafe`; only reading it
    /// does, and both readers below check the range first.
    fn slot(&self, index: u32, fd: u32) -> *const FdRecord {
        self.base
            .as_ptr()
            .wrapping_add((index * FAST_FDS + fd) as usize)
    }

    /// The flags word of slot (`index`, `fd`), without copying the whole record.
    fn flags(&self, index: u32, fd: u32) -> u32 {
        assert!(index < FAST_WATCHED && fd < FAST_FDS, "slot out of range");
        // SAFETY: the slot is inside the mapping (range checked above). The kernel writes it
        // concurrently; an aligned u32 read of it is at worst a moment out of date.
        unsafe { std::ptr::read_volatile(&raw const (*self.slot(index, fd)).info.flags) }
    }

    /// A copy of slot (`index`, `fd`).
    fn record(&self, index: u32, fd: u32) -> FdRecord {
        assert!(index < FAST_WATCHED && fd < FAST_FDS, "slot out of range");
        // SAFETY: as in `flags`; a whole-record read is at worst a moment out of date, its
        // counters each read whole.
        unsafe { std::ptr::read_volatile(self.slot(index, fd)) }
    }
}

impl Drop for FdTable {
    fn drop(&mut self) {
        // SAFETY: the mapping created in `new`, unmapped once.
        unsafe { libc::munmap(self.base.as_ptr() as *mut libc::c_void, self.len) };
    }
}
