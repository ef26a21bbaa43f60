//! Is a file range in the page cache? A hit whose pages are not resident would make sendfile
//! wait for the disk on a runtime thread, and with 2 cores one such wait stalls half the proxy.
//! So a cold range is first read into the page cache on the blocking pool (readahead(2), which
//! waits for the I/O), and sendfile then runs from memory, as nginx's `aio threads` would.
//!
//! The check is cachestat(2) (Linux 6.5+): one syscall, no mapping. Entries hit within the last
//! second are taken as hot and not checked at all, so a hot hit costs no extra syscall.

use std::fs::File;
use std::os::fd::AsRawFd;

/// cachestat(2)'s syscall number (nix has no wrapper for cachestat, nor libc a number for it) on x86_64 (and every architecture using the generic table).
const SYS_CACHESTAT: libc::c_long = 451;

#[repr(C)]
struct CachestatRange {
    off: u64,
    len: u64,
}

#[repr(C)]
#[derive(Default)]
struct Cachestat {
    nr_cache: u64,
    nr_dirty: u64,
    nr_writeback: u64,
    nr_evicted: u64,
    nr_recently_evicted: u64,
}

/// Page size assumed for counting pages of a range.
const PAGE: u64 = 4096;

/// True if every page of `off..off+len` is in the page cache, or if the kernel cannot tell
/// (no cachestat): then the hit is served as before.
pub fn resident(file: &File, off: u64, len: u64) -> bool {
    if len == 0 {
        return true;
    }
    let range = CachestatRange { off, len };
    let mut st = Cachestat::default();
    // nix has no wrapper for cachestat.
    // SAFETY: valid fd and pointers to local structs of the kernel's layout.
    let r = unsafe {
        libc::syscall(
            SYS_CACHESTAT,
            file.as_raw_fd(),
            &range as *const CachestatRange,
            &mut st as *mut Cachestat,
            0u32,
        )
    };
    if r != 0 {
        return true;
    }
    let pages = (off + len).div_ceil(PAGE) - off / PAGE;
    st.nr_cache >= pages
}

/// Reads `off..off+len` into the page cache on the blocking pool; returns when it is there.
pub async fn warm(file: std::sync::Arc<File>, off: u64, len: u64) {
    let _ = tokio::task::spawn_blocking(move || {
        // nix has no wrapper for readahead.
        // SAFETY: valid fd; readahead only populates the page cache.
        unsafe { libc::readahead(file.as_raw_fd(), off as libc::off64_t, len as usize) };
    })
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn a_written_file_is_resident_and_readahead_brings_it_back() {
        let dir = tempfile::tempdir_in(std::env::current_dir().expect("cwd")).expect("tmp");
        let path = dir.path().join("f");
        let mut f = File::create(&path).expect("create");
        f.write_all(&vec![1u8; 1 << 20]).expect("write");
        f.sync_all().expect("sync");
        let f = File::open(&path).expect("open");
        assert!(resident(&f, 0, 1 << 20));
        let _ = nix::fcntl::posix_fadvise(
            &f,
            0,
            0,
            nix::fcntl::PosixFadviseAdvice::POSIX_FADV_DONTNEED,
        );
        assert!(
            !resident(&f, 0, 1 << 20),
            "DONTNEED on a synced file evicts its pages"
        );
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("rt");
        let f = std::sync::Arc::new(f);
        rt.block_on(warm(f.clone(), 0, 1 << 20));
        assert!(resident(&f, 0, 1 << 20));
    }
}
