//! Shared-memory segments between the ranks of one host, and the address wait that lets a
//! rank sleep until a peer publishes (futex on Linux, `__ulock_wait` on macOS).
//!
//! A [`Segment`] is a file of this user only (created with `O_EXCL`, mode 0600, in
//! [`directory`]) mapped shared into every local rank. The creator removes the file as soon
//! as every rank has mapped it ([`Segment::unlink`], or its drop), so a rank that dies
//! afterwards leaves nothing behind. The map stays valid for the [`Segment`]'s life; all
//! access goes through the safe accessors below, which check bounds and alignment.
//!
//! What the bytes mean, and who may write which of them when, is the caller's protocol
//! (`nuvec_distributed`'s native wire). The accessors only guarantee memory safety for this
//! process: every byte is plain data (any bit pattern is valid), atomics are naturally
//! aligned, and no reference outlives the call it is made for.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64};
use std::time::Duration;

use memmap2::{MmapOptions, MmapRaw};

/// Where segments are created: `/dev/shm` (memory, not disk) on Linux, the user's own
/// temporary directory elsewhere (`$TMPDIR` on macOS is private to the user).
pub fn directory() -> PathBuf {
    #[cfg(any(target_os = "linux", target_os = "android"))]
    {
        PathBuf::from("/dev/shm")
    }
    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    {
        std::env::temp_dir()
    }
}

/// A shared map of a file that only this user can open (see the module docs).
#[derive(Debug)]
pub struct Segment {
    map: MmapRaw,
    len: usize,
    /// The file's path while this side (the creator) still has to remove it.
    owned: Option<PathBuf>,
    locked: bool,
}

fn out_of_range(what: &str, off: usize, len: usize, size: usize) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("{what} of {len} bytes at offset {off} is outside a segment of {size} bytes"),
    )
}

impl Segment {
    /// Creates `path` (it must not exist: a file left by another run, or placed by someone
    /// else, is never reused), `len` bytes of zeros with mode 0600, and maps it. Its pages
    /// are written once here, so a full `/dev/shm` fails now rather than with SIGBUS at a
    /// later access, and locked in memory where `RLIMIT_MEMLOCK` allows (silently not
    /// otherwise). The file is removed when the segment drops, unless
    /// [`Segment::unlink`] did it before.
    ///
    /// # Errors
    ///
    /// Creating, filling or mapping the file failed (it is removed again).
    pub fn create(path: &Path, len: usize) -> io::Result<Segment> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(path)?;
        let made = fill(&file, len).and_then(|()| Segment::map(&file, len));
        match made {
            Ok(mut segment) => {
                segment.owned = Some(path.to_path_buf());
                Ok(segment)
            }
            Err(e) => {
                let _ = std::fs::remove_file(path);
                Err(e)
            }
        }
    }

    /// Opens and maps a segment another rank of this user created: refuses a file that is
    /// not a regular file of `len` bytes owned by this user with mode 0600.
    ///
    /// # Errors
    ///
    /// The file is missing, not as described, or cannot be mapped.
    pub fn open(path: &Path, len: usize) -> io::Result<Segment> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(path)?;
        let meta = file.metadata()?;
        if !meta.is_file() || meta.uid() != effective_uid() || meta.mode() & 0o7777 != 0o600 {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!(
                    "{} is not a regular file of this user with mode 0600 (uid {}, mode {:o})",
                    path.display(),
                    meta.uid(),
                    meta.mode() & 0o7777
                ),
            ));
        }
        if meta.len() != len as u64 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "{} holds {} bytes, not the {len} the group expects",
                    path.display(),
                    meta.len()
                ),
            ));
        }
        Segment::map(&file, len)
    }

    fn map(file: &File, len: usize) -> io::Result<Segment> {
        if len == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "an empty shared-memory segment",
            ));
        }
        let map = MmapOptions::new().len(len).map_raw(file)?;
        // Locking is an optimisation (no page faults, no swapping); a limit that refuses
        // it is not an error.
        let locked = map.lock().is_ok();
        Ok(Segment {
            map,
            len,
            owned: None,
            locked,
        })
    }

    /// Removes the file (creator only; a no-op otherwise or when done already): the
    /// mappings stay valid, and no other process can open it any more.
    ///
    /// # Errors
    ///
    /// The removal failed for another reason than the file being gone.
    pub fn unlink(&mut self) -> io::Result<()> {
        match self.owned.take() {
            Some(path) => match std::fs::remove_file(&path) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
                _ => Ok(()),
            },
            None => Ok(()),
        }
    }

    /// Bytes in the segment.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the segment is empty (never: creation refuses it).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether the pages are locked in memory.
    pub fn locked(&self) -> bool {
        self.locked
    }

    // `check` and the accessors below are inlined into the engine, which calls them several
    // times per collective from another crate: a 4 B all-reduce at P = 2 takes ~62 ns of
    // CPU time with them inlined, ~80 ns with them called out of line (the engine's
    // `measure_the_engine_per_collective`).
    #[inline]
    fn check(&self, what: &str, off: usize, len: usize) -> io::Result<*mut u8> {
        match off.checked_add(len) {
            Some(end) if end <= self.len => Ok(self.map.as_mut_ptr().wrapping_add(off)),
            _ => Err(out_of_range(what, off, len, self.len)),
        }
    }

    /// The 32-bit word at `off` as an atomic, or `None` if it is out of bounds or not
    /// 4-byte aligned.
    #[inline]
    pub fn u32_at(&self, off: usize) -> Option<&AtomicU32> {
        let ptr = self.check("a u32", off, 4).ok()?;
        if !(ptr as usize).is_multiple_of(align_of::<AtomicU32>()) {
            return None;
        }
        // SAFETY: `ptr` is in bounds of the live map for 4 bytes (checked above) and aligned
        // for `AtomicU32` (checked above); the map lives as long as `&self`, which the
        // reference borrows. Every access of the word, in any process, is atomic, which
        // `AtomicU32`'s interior mutability permits through a shared reference.
        Some(unsafe { AtomicU32::from_ptr(ptr.cast::<u32>()) })
    }

    /// The 64-bit word at `off` as an atomic, or `None` if it is out of bounds or not
    /// 8-byte aligned.
    pub fn u64_at(&self, off: usize) -> Option<&AtomicU64> {
        let ptr = self.check("a u64", off, 8).ok()?;
        if !(ptr as usize).is_multiple_of(align_of::<AtomicU64>()) {
            return None;
        }
        // SAFETY: as in `u32_at`: in bounds, aligned (both checked), borrowed from `&self`.
        Some(unsafe { AtomicU64::from_ptr(ptr.cast::<u64>()) })
    }

    /// Copies `src` into the segment at `off`.
    ///
    /// # Errors
    ///
    /// The range is out of bounds.
    #[inline]
    pub fn copy_in(&self, off: usize, src: &[u8]) -> io::Result<()> {
        let dst = self.check("a copy in", off, src.len())?;
        // SAFETY: `dst` is valid for `src.len()` bytes of writes (bounds checked above; the
        // map is shared and writable and lives as long as `&self`); a local slice cannot
        // overlap the map (the map is not part of any Rust allocation); u8 needs no
        // alignment.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst, src.len()) };
        Ok(())
    }

    /// Copies the segment's bytes at `off` into `dst`.
    ///
    /// # Errors
    ///
    /// The range is out of bounds.
    #[inline]
    pub fn copy_out(&self, off: usize, dst: &mut [u8]) -> io::Result<()> {
        let src = self.check("a copy out", off, dst.len())?;
        // SAFETY: `src` is valid for `dst.len()` bytes of reads (bounds checked above);
        // `dst` is an exclusive local slice, not part of the map; u8 needs no alignment.
        unsafe { std::ptr::copy_nonoverlapping(src, dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }

    /// Calls `f` with a view of the segment's `len` bytes at `off` (to reduce them into a
    /// local slice with the SIMD kernels without a copy first), and returns its result.
    ///
    /// # Errors
    ///
    /// The range is out of bounds.
    pub fn read_with<R>(
        &self,
        off: usize,
        len: usize,
        f: impl FnOnce(&[u8]) -> R,
    ) -> io::Result<R> {
        let ptr = self.check("a view", off, len)?;
        // SAFETY: `ptr` is valid for `len` bytes of reads (bounds checked above) for as long
        // as `&self` lives, which outlasts the call of `f` (the slice cannot escape it: `R`
        // does not borrow it). Any bit pattern is a valid `u8`. The caller's protocol keeps
        // other processes from writing these bytes until it publishes that it is done with
        // them; a peer that broke it could only change values `f` reads as plain bytes.
        let view = unsafe { std::slice::from_raw_parts(ptr.cast_const(), len) };
        Ok(f(view))
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        let _ = self.unlink();
    }
}

/// Writes `len` zeros into `file`: the pages then exist (tmpfs allocates on write), so a
/// full file system is an error here and never a SIGBUS later.
fn fill(file: &File, len: usize) -> io::Result<()> {
    use std::os::unix::fs::FileExt;
    let zeros = [0u8; 64 << 10];
    let mut at = 0;
    while at < len {
        let n = (len - at).min(zeros.len());
        file.write_all_at(&zeros[..n], at as u64)?;
        at += n;
    }
    file.set_len(len as u64)
}

fn effective_uid() -> u32 {
    // SAFETY: `geteuid` takes no argument, cannot fail and touches no memory of ours.
    unsafe { libc::geteuid() }
}

/// Sleeps until `word` is woken ([`wake_all`]) or `timeout` passes, unless it no longer
/// holds `expected` (then it returns at once). Spurious returns happen: callers re-check
/// the word and loop.
pub fn wait(word: &AtomicU32, expected: u32, timeout: Duration) {
    sys::wait(word, expected, timeout);
}

/// Wakes every process and thread sleeping on `word` in [`wait`].
pub fn wake_all(word: &AtomicU32) {
    sys::wake_all(word);
}

#[cfg(any(target_os = "linux", target_os = "android"))]
mod sys {
    use std::sync::atomic::AtomicU32;
    use std::time::Duration;

    pub(super) fn wait(word: &AtomicU32, expected: u32, timeout: Duration) {
        let ts = libc::timespec {
            tv_sec: timeout.as_secs().min(i32::MAX as u64) as libc::time_t,
            tv_nsec: timeout.subsec_nanos() as libc::c_long,
        };
        // SAFETY: FUTEX_WAIT (shared, not PRIVATE: the word is in memory mapped by other
        // processes) reads the aligned u32 `word` points at, which lives for the call, and
        // the timespec, a local; the other arguments are unused by FUTEX_WAIT. Its errors
        // (EAGAIN when the word changed, ETIMEDOUT, EINTR) all mean "re-check".
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                word.as_ptr(),
                libc::FUTEX_WAIT,
                expected,
                &ts as *const libc::timespec,
                std::ptr::null::<u32>(),
                0u32,
            )
        };
    }

    pub(super) fn wake_all(word: &AtomicU32) {
        // SAFETY: FUTEX_WAKE only uses the address as a key (the word is aligned and alive
        // for the call) and the count; nothing is written.
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                word.as_ptr(),
                libc::FUTEX_WAKE,
                i32::MAX,
                std::ptr::null::<libc::timespec>(),
                std::ptr::null::<u32>(),
                0u32,
            )
        };
    }
}

#[cfg(target_os = "macos")]
mod sys {
    use std::sync::atomic::AtomicU32;
    use std::time::Duration;

    /// Compare-and-wait on a word shared between processes.
    const UL_COMPARE_AND_WAIT_SHARED: u32 = 3;
    /// Wake every waiter, not one.
    const ULF_WAKE_ALL: u32 = 0x100;

    // SAFETY: the signatures of the kernel's `__ulock_wait`/`__ulock_wake` (libsystem_kernel,
    // present since macOS 10.12): an operation code, the address, a 64-bit value and, for the
    // wait, a timeout in microseconds (0 waits forever); both return an int.
    unsafe extern "C" {
        fn __ulock_wait(
            operation: u32,
            addr: *mut libc::c_void,
            value: u64,
            timeout_us: u32,
        ) -> libc::c_int;
        fn __ulock_wake(operation: u32, addr: *mut libc::c_void, wake_value: u64) -> libc::c_int;
    }

    pub(super) fn wait(word: &AtomicU32, expected: u32, timeout: Duration) {
        // At least 1 µs: 0 would wait forever.
        let us = timeout.as_micros().clamp(1, u128::from(u32::MAX)) as u32;
        // SAFETY: the kernel reads the aligned u32 at the address (alive for the call) and
        // compares it with `expected`; nothing is written. Errors (timeout, interrupt, the
        // word changed) all mean "re-check".
        unsafe {
            __ulock_wait(
                UL_COMPARE_AND_WAIT_SHARED,
                word.as_ptr().cast(),
                u64::from(expected),
                us,
            )
        };
    }

    pub(super) fn wake_all(word: &AtomicU32) {
        // SAFETY: the address is only a key (aligned, alive for the call); nothing is read
        // or written through it.
        unsafe {
            __ulock_wake(
                UL_COMPARE_AND_WAIT_SHARED | ULF_WAKE_ALL,
                word.as_ptr().cast(),
                0,
            )
        };
    }
}

/// Other systems: no address wait; a short sleep bounds the latency instead.
#[cfg(not(any(target_os = "linux", target_os = "android", target_os = "macos")))]
mod sys {
    use std::sync::atomic::AtomicU32;
    use std::time::Duration;

    pub(super) fn wait(_word: &AtomicU32, _expected: u32, timeout: Duration) {
        std::thread::sleep(timeout.min(Duration::from_micros(200)));
    }

    pub(super) fn wake_all(_word: &AtomicU32) {}
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;
    use std::time::Instant;

    use super::*;

    fn fresh_path(tag: &str) -> PathBuf {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        directory().join(format!("nuvec-test-{tag}-{}-{nanos}", std::process::id()))
    }

    #[test]
    fn a_segment_is_private_exclusive_and_shared_between_maps() {
        let path = fresh_path("basic");
        let mut a = Segment::create(&path, 8192).expect("create");
        let mode = std::fs::metadata(&path).expect("metadata").mode() & 0o7777;
        assert_eq!(mode, 0o600);
        // A second create of the same name is refused: a stale file is never reused.
        assert_eq!(
            Segment::create(&path, 8192).unwrap_err().kind(),
            io::ErrorKind::AlreadyExists
        );
        assert!(
            Segment::open(&path, 4096).is_err(),
            "a wrong length is refused"
        );
        let b = Segment::open(&path, 8192).expect("open");
        a.unlink().expect("unlink");
        assert!(!path.exists());
        a.copy_in(100, b"hello").expect("in bounds");
        let mut out = [0u8; 5];
        b.copy_out(100, &mut out).expect("in bounds");
        assert_eq!(&out, b"hello");
        let sum = b
            .read_with(100, 5, |v| v.iter().map(|&x| u32::from(x)).sum::<u32>())
            .expect("in bounds");
        assert_eq!(sum, b"hello".iter().map(|&x| u32::from(x)).sum::<u32>());
        a.u32_at(64).expect("aligned").store(7, Ordering::Release);
        assert_eq!(b.u32_at(64).expect("aligned").load(Ordering::Acquire), 7);
        a.u64_at(128)
            .expect("aligned")
            .store(u64::MAX, Ordering::Release);
        assert_eq!(
            b.u64_at(128).expect("aligned").load(Ordering::Acquire),
            u64::MAX
        );
        assert!(a.u32_at(65).is_none(), "misaligned");
        assert!(a.u32_at(8190).is_none(), "out of bounds");
        assert!(a.u64_at(8188).is_none(), "out of bounds");
        assert!(a.copy_in(8190, b"abc").is_err());
        assert!(a.copy_out(usize::MAX, &mut out).is_err());
        assert!(a.read_with(8000, 200, |_| ()).is_err());
    }

    #[test]
    fn a_foreign_mode_is_refused_and_a_dropped_creator_removes_its_file() {
        let path = fresh_path("mode");
        {
            let _a = Segment::create(&path, 4096).expect("create");
            std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o644))
                .expect("chmod");
            let e = Segment::open(&path, 4096).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::PermissionDenied, "{e}");
        }
        assert!(!path.exists(), "the creator's drop removes the file");
        assert!(Segment::open(&path, 4096).is_err());
    }

    #[test]
    fn a_waiter_wakes_on_a_store_and_times_out_without_one() {
        let path = fresh_path("wait");
        let seg = Segment::create(&path, 4096).expect("create");
        let word = seg.u32_at(0).expect("aligned");
        let start = Instant::now();
        wait(word, 0, Duration::from_millis(20));
        assert!(start.elapsed() >= Duration::from_millis(5), "slept");
        // A changed word returns at once.
        word.store(1, Ordering::SeqCst);
        let start = Instant::now();
        wait(word, 0, Duration::from_secs(5));
        assert!(start.elapsed() < Duration::from_secs(2));
        std::thread::scope(|s| {
            let waiter = s.spawn(|| {
                let start = Instant::now();
                while word.load(Ordering::Acquire) == 1 {
                    wait(word, 1, Duration::from_secs(5));
                }
                start.elapsed()
            });
            std::thread::sleep(Duration::from_millis(30));
            word.store(2, Ordering::Release);
            wake_all(word);
            let waited = waiter.join().expect("waiter");
            assert!(
                waited < Duration::from_secs(3),
                "woken, not timed out: {waited:?}"
            );
        });
    }
}
