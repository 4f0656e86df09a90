//! Measures the io_uring features the driver (`src/ring/uring.rs`) does not use, on this
//! kernel and over loopback TCP, so that the choice rests on figures:
//!
//! - `send`: a 64 MiB transfer by `IORING_OP_SEND` against `IORING_OP_SEND_ZC` (zero-copy
//!   send, which pins the pages and waits for the kernel's notification before the buffer may
//!   be reused), in 1 MiB and in 64 MiB submissions. The receiver is a plain blocking
//!   `read`. Prints the rate and the CPU time of the process (both sides).
//! - `pingpong`: a 4 B round trip against a blocking echo thread, three ways: blocking
//!   `write` + `read`; one `io_uring_enter` per round carrying the send and a one-shot receive,
//!   sleeping in the kernel for the completions or, as the driver does, watching the
//!   completion queue first (`OneShotSpin`); the same with a kernel thread polling the
//!   submission queue (`Sqpoll`); and the send alone against a standing multishot receive
//!   into provided buffers (the consumed buffer is handed back in the next round's
//!   submission, so still one enter). Prints the median and the 90th percentile.
//!
//! ```text
//! cargo run --release -p nuvec-distributed-ffi --example uring_features -- send 20
//! cargo run --release -p nuvec-distributed-ffi --example uring_features -- pingpong 20000
//! ```
//!
//! Linux only; elsewhere it says so and exits.

#[cfg(target_os = "linux")]
fn main() {
    let args: Vec<String> = std::env::args().collect();
    let what = args.get(1).map(String::as_str).unwrap_or("");
    let n = args.get(2).and_then(|s| s.parse::<usize>().ok());
    let result = match (what, n) {
        ("send", Some(n)) => linux::send(n),
        ("pingpong", Some(n)) => linux::pingpong(n),
        _ => {
            eprintln!("usage: uring_features send ITERATIONS | pingpong ROUNDS");
            std::process::exit(2);
        }
    };
    if let Err(e) = result {
        eprintln!("uring_features: {e}");
        std::process::exit(1);
    }
}

#[cfg(not(target_os = "linux"))]
fn main() {
    eprintln!("uring_features: io_uring is Linux's; nothing to measure here");
}

#[cfg(target_os = "linux")]
mod linux {
    use io_uring::{IoUring, cqueue, opcode, squeue, types};
    use std::io::{self, Read, Write};
    use std::net::{TcpListener, TcpStream};
    use std::os::fd::AsRawFd;
    use std::time::{Duration, Instant};

    /// Ends the process on an error met while operations may be in flight: it returns to
    /// no caller, so no buffer an operation points to is dropped (the memory lives until
    /// the process does), where returning the error would unwind the frames that hold them.
    fn fail(e: impl Into<io::Error>) -> ! {
        eprintln!("uring_features: {}", e.into());
        std::process::exit(1)
    }

    /// A connected loopback pair with `TCP_NODELAY` on both ends.
    fn pair() -> io::Result<(TcpStream, TcpStream)> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let client = TcpStream::connect(listener.local_addr()?)?;
        let (server, _) = listener.accept()?;
        client.set_nodelay(true)?;
        server.set_nodelay(true)?;
        Ok((client, server))
    }

    /// User plus system CPU time of the whole process.
    fn cpu_time() -> Duration {
        let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
        // SAFETY: `usage` is a writable rusage; getrusage writes only it.
        let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr()) };
        if rc != 0 {
            return Duration::ZERO;
        }
        // SAFETY: zeroed is a valid rusage (plain integers), and getrusage filled it.
        let usage = unsafe { usage.assume_init() };
        let tv = |t: libc::timeval| {
            Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64)
        };
        tv(usage.ru_utime) + tv(usage.ru_stime)
    }

    /// Pushes `entry`, whose buffers the caller keeps alive and unmoved until its completion
    /// (and, for a zero-copy send, its notification) has been reaped.
    fn push(ring: &mut IoUring, entry: &squeue::Entry) -> io::Result<()> {
        // SAFETY: every caller passes an entry whose buffers outlive the operation: each waits
        // for the completions of everything it pushed before touching or dropping a buffer.
        unsafe { ring.submission().push(entry) }
            .map_err(|_| io::Error::other("submission queue full"))
    }

    /// Sends `buf` over `fd`, `chunk` bytes per submission, waiting for each to finish.
    fn send_all(
        ring: &mut IoUring,
        fd: types::Fd,
        buf: &[u8],
        chunk: usize,
        zero_copy: bool,
    ) -> io::Result<()> {
        let mut at = 0;
        while at < buf.len() {
            let rest = &buf[at..];
            let len = chunk.min(rest.len()) as u32;
            let entry = if zero_copy {
                opcode::SendZc::new(fd, rest.as_ptr(), len).build()
            } else {
                opcode::Send::new(fd, rest.as_ptr(), len).build()
            };
            push(ring, &entry).unwrap_or_else(|e| fail(e));
            // A zero-copy send completes twice: the result (flagged MORE), then the
            // notification that the kernel let go of the pages.
            let (mut sent, mut released) = (None, !zero_copy);
            while sent.is_none() || !released {
                ring.submit_and_wait(1).unwrap_or_else(|e| fail(e));
                for c in ring.completion() {
                    if cqueue::notif(c.flags()) {
                        released = true;
                        continue;
                    }
                    if c.result() < 0 {
                        fail(io::Error::from_raw_os_error(-c.result()));
                    }
                    sent = Some(c.result() as usize);
                    if !cqueue::more(c.flags()) {
                        released = true;
                    }
                }
            }
            at += sent.unwrap_or(0);
        }
        Ok(())
    }

    pub(super) fn send(iterations: usize) -> io::Result<()> {
        const TOTAL: usize = 64 << 20;
        println!("64 MiB x {iterations} over loopback TCP, receiver a blocking read");
        for (zero_copy, chunk) in [
            (false, 1 << 20),
            (true, 1 << 20),
            (false, TOTAL),
            (true, TOTAL),
        ] {
            let (client, mut server) = pair()?;
            let reader = std::thread::spawn(move || -> io::Result<()> {
                let mut buf = vec![0u8; TOTAL];
                for _ in 0..iterations {
                    server.read_exact(&mut buf)?;
                }
                Ok(())
            });
            let mut ring = IoUring::new(8)?;
            let buf = vec![7u8; TOTAL];
            let fd = types::Fd(client.as_raw_fd());
            let (cpu, wall) = (cpu_time(), Instant::now());
            for _ in 0..iterations {
                send_all(&mut ring, fd, &buf, chunk, zero_copy)?;
            }
            let wall = wall.elapsed();
            reader
                .join()
                .map_err(|_| io::Error::other("the reader panicked"))??;
            let cpu = cpu_time().saturating_sub(cpu);
            println!(
                "  {:<8} {:>5} KiB submissions: {:6.2} GB/s, {:6.1} ms CPU per 64 MiB",
                if zero_copy { "SEND_ZC" } else { "SEND" },
                chunk >> 10,
                (TOTAL * iterations) as f64 / wall.as_secs_f64() / 1e9,
                cpu.as_secs_f64() * 1e3 / iterations as f64,
            );
        }
        Ok(())
    }

    /// How the client side of the ping-pong receives.
    #[derive(Clone, Copy, Debug)]
    enum Mode {
        Blocking,
        OneShot,
        /// As the driver does: submit, then watch the completion queue (cooperative task
        /// running, entering the kernel only when the task-run flag asks).
        OneShotSpin,
        /// As `OneShotSpin`, with a kernel thread polling the submission queue (SQPOLL): no
        /// system call to submit while that thread is awake.
        Sqpoll,
        Multishot,
    }

    /// How long a spinning mode watches the completion queue before it sleeps.
    const SPIN: Duration = Duration::from_micros(50);

    /// Provided buffers for the multishot receive: group id, count and size of each.
    const GROUP: u16 = 1;
    const BUFFERS: u16 = 16;
    const BUFFER_BYTES: usize = 64;

    pub(super) fn pingpong(rounds: usize) -> io::Result<()> {
        println!("4 B round trips over loopback TCP against a blocking echo thread, {rounds} each");
        for mode in [
            Mode::Blocking,
            Mode::OneShot,
            Mode::OneShotSpin,
            Mode::Sqpoll,
            Mode::Multishot,
        ] {
            let (mut client, mut server) = pair()?;
            let echo = std::thread::spawn(move || -> io::Result<()> {
                let mut b = [0u8; 4];
                for _ in 0..rounds {
                    server.read_exact(&mut b)?;
                    server.write_all(&b)?;
                }
                Ok(())
            });
            let mut times = Vec::with_capacity(rounds);
            match mode {
                Mode::Blocking => {
                    let mut b = [0u8; 4];
                    for i in 0..rounds {
                        let t = Instant::now();
                        client.write_all(&(i as u32).to_le_bytes())?;
                        client.read_exact(&mut b)?;
                        times.push(t.elapsed());
                    }
                }
                Mode::OneShot => one_shot(&client, rounds, IoUring::new(8)?, false, &mut times)?,
                Mode::OneShotSpin => {
                    let ring = IoUring::builder()
                        .setup_coop_taskrun()
                        .setup_taskrun_flag()
                        .build(8)?;
                    one_shot(&client, rounds, ring, true, &mut times)?
                }
                Mode::Sqpoll => {
                    let ring = IoUring::builder().setup_sqpoll(1000).build(8)?;
                    one_shot(&client, rounds, ring, true, &mut times)?
                }
                Mode::Multishot => multishot(&client, rounds, &mut times)?,
            }
            echo.join()
                .map_err(|_| io::Error::other("the echo thread panicked"))??;
            times.sort();
            println!(
                "  {:<10} median {:6.2} µs, p90 {:6.2} µs",
                format!("{mode:?}"),
                times[times.len() / 2].as_secs_f64() * 1e6,
                times[times.len() * 9 / 10].as_secs_f64() * 1e6,
            );
        }
        Ok(())
    }

    /// Each round: the send and a one-shot receive in one submission; with `spin`, the
    /// completion queue is watched for up to [`SPIN`] before sleeping in the kernel.
    fn one_shot(
        client: &TcpStream,
        rounds: usize,
        mut ring: IoUring,
        spin: bool,
        times: &mut Vec<Duration>,
    ) -> io::Result<()> {
        let fd = types::Fd(client.as_raw_fd());
        let mut out;
        let mut back = [0u8; 4];
        for i in 0..rounds {
            let t = Instant::now();
            out = (i as u32).to_le_bytes();
            push(
                &mut ring,
                &opcode::Send::new(fd, out.as_ptr(), 4).build().user_data(0),
            )
            .unwrap_or_else(|e| fail(e));
            let mut got = 0;
            let (mut sent, mut receiving) = (false, false);
            while !sent || got < 4 {
                // One receive in flight at a time, into the rest of `back`.
                if got < 4 && !receiving {
                    let rest = &mut back[got..];
                    let entry = opcode::Recv::new(fd, rest.as_mut_ptr(), rest.len() as u32);
                    push(&mut ring, &entry.build().user_data(1)).unwrap_or_else(|e| fail(e));
                    receiving = true;
                }
                if spin {
                    // With SQPOLL, `submit` makes a system call only to wake the thread.
                    ring.submit().unwrap_or_else(|e| fail(e));
                    let start = Instant::now();
                    while ring.completion().is_empty() && start.elapsed() < SPIN {
                        if ring.submission().taskrun() {
                            ring.submit().unwrap_or_else(|e| fail(e));
                        }
                        std::hint::spin_loop();
                    }
                }
                if ring.completion().is_empty() {
                    ring.submit_and_wait(1).unwrap_or_else(|e| fail(e));
                }
                for c in ring.completion() {
                    if c.result() < 0 {
                        fail(io::Error::from_raw_os_error(-c.result()));
                    }
                    if c.user_data() == 1 {
                        receiving = false;
                    }
                    match c.user_data() {
                        0 => sent = true,
                        _ if c.result() == 0 => fail(io::ErrorKind::UnexpectedEof),
                        _ => got += c.result() as usize,
                    }
                }
            }
            times.push(t.elapsed());
        }
        Ok(())
    }

    /// A standing multishot receive into provided buffers; each round submits the send (and
    /// hands back the buffer the last round consumed) in one `io_uring_enter`.
    fn multishot(client: &TcpStream, rounds: usize, times: &mut Vec<Duration>) -> io::Result<()> {
        let fd = types::Fd(client.as_raw_fd());
        let mut ring = IoUring::new(32)?;
        let mut pool = vec![0u8; BUFFERS as usize * BUFFER_BYTES];
        let provide = |pool: &mut [u8], id: u16, count: u16| {
            let at = id as usize * BUFFER_BYTES;
            opcode::ProvideBuffers::new(
                pool[at..].as_mut_ptr(),
                BUFFER_BYTES as i32,
                count,
                GROUP,
                id,
            )
            .build()
            .user_data(2)
        };
        let arm = opcode::RecvMulti::new(fd, GROUP).build().user_data(1);
        let entry = provide(&mut pool, 0, BUFFERS);
        push(&mut ring, &entry).unwrap_or_else(|e| fail(e));
        push(&mut ring, &arm).unwrap_or_else(|e| fail(e));
        let mut out;
        let (mut got, mut armed, mut closed) = (0, true, false);
        for i in 0..rounds {
            let t = Instant::now();
            out = (i as u32).to_le_bytes();
            push(
                &mut ring,
                &opcode::Send::new(fd, out.as_ptr(), 4).build().user_data(0),
            )
            .unwrap_or_else(|e| fail(e));
            let mut sent = false;
            while !sent || got < 4 {
                if closed {
                    fail(io::ErrorKind::UnexpectedEof);
                }
                ring.submit_and_wait(1).unwrap_or_else(|e| fail(e));
                let mut hand_back = Vec::new();
                for c in ring.completion() {
                    let result = c.result();
                    match c.user_data() {
                        1 => {
                            armed = cqueue::more(c.flags());
                            if let Some(id) = cqueue::buffer_select(c.flags()) {
                                hand_back.push(id);
                            }
                            match result {
                                0 => closed = true,
                                n if n > 0 => got += n as usize,
                                // Out of buffers: handed back below, then armed again.
                                n if n == -libc::ENOBUFS => {}
                                n => fail(io::Error::from_raw_os_error(-n)),
                            }
                        }
                        _ if result < 0 => fail(io::Error::from_raw_os_error(-result)),
                        0 => sent = true,
                        _ => {}
                    }
                }
                for id in hand_back {
                    let entry = provide(&mut pool, id, 1);
                    push(&mut ring, &entry).unwrap_or_else(|e| fail(e));
                }
                if !armed && !closed {
                    push(&mut ring, &arm).unwrap_or_else(|e| fail(e));
                    armed = true;
                }
            }
            got -= 4;
            times.push(t.elapsed());
        }
        // Stop the standing receive, if the echo thread's close has not, and reap it before
        // the pool is dropped.
        if armed {
            push(&mut ring, &opcode::AsyncCancel::new(1).build().user_data(3))
                .unwrap_or_else(|e| fail(e));
            while armed {
                ring.submit_and_wait(1).unwrap_or_else(|e| fail(e));
                for c in ring.completion() {
                    if c.user_data() == 1 && !cqueue::more(c.flags()) {
                        armed = false;
                    }
                }
            }
        }
        Ok(())
    }
}
