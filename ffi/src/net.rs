//! Socket calls that the safe crates (std, mio, socket2) leave out.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

/// Whether `e` is `EINPROGRESS`: a non-blocking `connect` that has started and will
/// finish later. (`std::io::ErrorKind::InProgress` is not stable yet.)
pub fn is_in_progress(e: &io::Error) -> bool {
    e.raw_os_error() == Some(libc::EINPROGRESS)
}

/// Reads the TCP urgent ("out-of-band") byte pending on a socket, without blocking.
///
/// Returns `Ok(None)` when there is none: never sent, already read, or not yet arrived.
/// socket2 offers `recv_out_of_band`, but only into `MaybeUninit` bytes, which cannot be
/// read back without `unsafe`; this reads into an initialised byte instead.
///
/// # Errors
///
/// Any error of `recv(2)` other than "no urgent data" (`EINVAL`) or `EAGAIN`.
pub fn recv_urgent_byte(socket: BorrowedFd<'_>) -> io::Result<Option<u8>> {
    let mut byte = 0u8;
    // SAFETY: `byte` is a live, writable local of exactly the one byte passed as the
    // length, and `socket` is a descriptor borrowed for the duration of the call, so the
    // kernel writes at most one byte into memory we own and the descriptor stays open.
    let n = unsafe {
        libc::recv(
            socket.as_raw_fd(),
            (&raw mut byte).cast::<libc::c_void>(),
            1,
            libc::MSG_OOB | libc::MSG_DONTWAIT,
        )
    };
    match n {
        1 => Ok(Some(byte)),
        0 => Ok(None),
        _ => {
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EINVAL | libc::EAGAIN) => Ok(None),
                #[allow(unreachable_patterns)] // EWOULDBLOCK == EAGAIN on Linux and macOS
                Some(libc::EWOULDBLOCK) => Ok(None),
                _ => Err(e),
            }
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};
    use std::os::fd::AsFd;

    use super::*;

    /// Two ends of a loopback TCP connection (also for `uring`'s tests).
    pub(crate) fn pair() -> (TcpStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (b, _) = listener.accept().unwrap();
        (a, b)
    }

    #[test]
    fn reads_an_urgent_byte_beside_the_stream() {
        let (mut a, mut b) = pair();
        assert_eq!(recv_urgent_byte(b.as_fd()).unwrap(), None);
        a.write_all(b"abc").unwrap();
        socket2::SockRef::from(&a).send_out_of_band(&[42]).unwrap();
        a.shutdown(std::net::Shutdown::Write).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(50));
        // Readable before the stream is read up to it, even after EOF arrived; once.
        assert_eq!(recv_urgent_byte(b.as_fd()).unwrap(), Some(42));
        assert_eq!(recv_urgent_byte(b.as_fd()).unwrap(), None);
        // It is not part of the stream.
        let mut stream = Vec::new();
        b.read_to_end(&mut stream).unwrap();
        assert_eq!(stream, b"abc");
    }

    #[test]
    fn an_urgent_byte_is_gone_once_the_stream_is_read_past_it() {
        // The kernel behaviour the ring works around by reading notices early.
        let (mut a, mut b) = pair();
        socket2::SockRef::from(&a).send_out_of_band(&[7]).unwrap();
        a.write_all(b"z").unwrap();
        a.shutdown(std::net::Shutdown::Write).unwrap();
        let mut stream = Vec::new();
        b.read_to_end(&mut stream).unwrap();
        assert_eq!(stream, b"z");
        assert_eq!(recv_urgent_byte(b.as_fd()).unwrap(), None);
    }
}
