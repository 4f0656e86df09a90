//! Measures the io_uring features the driver (`engine/src/transport/tcp/sys/uring.rs`)
//! does not use, on this kernel and over loopback TCP, so that the choice rests on figures:
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
//! - `recvbuf`: where a receive lands. The driver receives with `IORING_OP_RECV` into its own
//!   memory (a staging buffer when reducing, the destination otherwise); against that, a
//!   one-shot receive with buffer select from a provided buffer ring registered with the
//!   kernel (`IORING_REGISTER_PBUF_RING`; the buffer is handed back once its bytes are copied
//!   out), and `IORING_OP_READ_FIXED` into a buffer registered with `IORING_REGISTER_BUFFERS`
//!   (the one registered-buffer receive a TCP socket takes: the program asks the kernel
//!   whether `IORING_OP_RECV` takes `IORING_RECVSEND_FIXED_BUF`, and whether it knows
//!   `IORING_OP_RECV_ZC`, and prints the answers). Every path waits as the driver does
//!   (submit, watch the completion queue with cooperative task running, enter when the
//!   task-run flag asks, sleep after 50 µs). Two workloads: 4 B and 8 KiB round trips
//!   against a blocking echo thread (median and 90th percentile), and a 64 MiB stream from a
//!   blocking writer received in the driver's 1 MiB chunks into a destination buffer (rate,
//!   and CPU time of the receiving thread and of the process per 64 MiB). The paths take
//!   turns (blocks of 500 rounds, one stream each) on one connection with one peer thread,
//!   so that load from elsewhere and where the scheduler put the threads fall on all of them
//!   alike. Prints a table, and per workload a verdict from the ratios to the driver's path
//!   block by block (or stream by stream).
//!
//! ```text
//! cargo run --release -p nuvec-distributed-ffi --example uring_features -- send 20
//! cargo run --release -p nuvec-distributed-ffi --example uring_features -- pingpong 20000
//! cargo run --release -p nuvec-distributed-ffi --example uring_features -- recvbuf 20000
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
        ("recvbuf", Some(n)) if n > 0 => linux::recvbuf(n),
        _ => {
            eprintln!("usage: uring_features send ITERATIONS | pingpong ROUNDS | recvbuf ROUNDS");
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

    /// User plus system CPU time of the whole process (`libc::RUSAGE_SELF`) or of the calling
    /// thread (`libc::RUSAGE_THREAD`).
    fn cpu_time(who: libc::c_int) -> Duration {
        let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
        // SAFETY: `usage` is a writable rusage; getrusage writes only it.
        let rc = unsafe { libc::getrusage(who, usage.as_mut_ptr()) };
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

    /// Writes round `i`'s 4 bytes into `out` and pushes their send (user data 0); `out`
    /// stays where it is until the send completes.
    fn push_round(ring: &mut IoUring, fd: types::Fd, out: &mut [u8; 4], i: usize) {
        *out = (i as u32).to_le_bytes();
        push(
            ring,
            &opcode::Send::new(fd, out.as_ptr(), 4).build().user_data(0),
        )
        .unwrap_or_else(|e| fail(e));
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
            let (cpu, wall) = (cpu_time(libc::RUSAGE_SELF), Instant::now());
            for _ in 0..iterations {
                send_all(&mut ring, fd, &buf, chunk, zero_copy)?;
            }
            let wall = wall.elapsed();
            reader
                .join()
                .map_err(|_| io::Error::other("the reader panicked"))??;
            let cpu = cpu_time(libc::RUSAGE_SELF).saturating_sub(cpu);
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
        let mut out = [0u8; 4];
        let mut back = [0u8; 4];
        for i in 0..rounds {
            let t = Instant::now();
            push_round(&mut ring, fd, &mut out, i);
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
        let mut out = [0u8; 4];
        let (mut got, mut armed, mut closed) = (0, true, false);
        for i in 0..rounds {
            let t = Instant::now();
            push_round(&mut ring, fd, &mut out, i);
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

    /// The `recvbuf` measurement (see the program's docs).
    pub(super) fn recvbuf(rounds: usize) -> io::Result<()> {
        buffers::run(rounds)
    }

    /// Where a receive lands: the driver's own memory, a provided buffer ring, a registered
    /// buffer.
    mod buffers {
        use super::{cpu_time, fail, pair, push};
        use io_uring::{IoUring, cqueue, opcode, squeue, types};
        use std::io::{self, Read, Write};
        use std::net::TcpStream;
        use std::os::fd::AsRawFd;
        use std::sync::atomic::{AtomicU16, AtomicU32, AtomicU64, Ordering};
        use std::time::{Duration, Instant};

        /// Bytes the driver receives at most per operation while reducing (the library's
        /// `LANE_STAGE_BYTES`): the stream's chunk, and the size of every staging, provided
        /// and registered buffer here.
        const CHUNK: usize = 1 << 20;
        /// The stream's size.
        const STREAM: usize = 64 << 20;
        /// The driver's wait before it sleeps in the kernel, as a rank that has a CPU of its
        /// own has it (the learned `Options::spin`'s first budget, as
        /// `WaitPolicy::for_local_ranks` makes it): watch the completion queue without
        /// yielding for `EAGER`, yielding on every look after that, and sleep after `TOTAL`.
        const EAGER: Duration = Duration::from_micros(10);
        const TOTAL: Duration = Duration::from_micros(50);
        /// The provided buffer ring's group id.
        const GROUP: u16 = 7;
        /// Its entries and buffers (a power of two, as the kernel requires). One receive is
        /// in flight at a time and its buffer is handed back before the next, so two would
        /// do; four leave room.
        const PROVIDED: u16 = 4;
        /// Where the provided ring's memory starts: a page boundary under every page size
        /// Linux uses (4, 16 or 64 KiB), as `IORING_REGISTER_PBUF_RING` requires.
        const RING_ALIGN: usize = 64 << 10;
        /// `IORING_RECVSEND_FIXED_BUF` (a send's or receive's `ioprio`): use a registered
        /// buffer.
        const RECVSEND_FIXED_BUF: u16 = 1 << 2;
        /// `IORING_OP_RECV_ZC` (Linux 6.15), which the io-uring crate does not name.
        const OP_RECV_ZC: u8 = 58;
        /// `user_data` of a send; receives carry [`RECV`].
        const SEND: u64 = 0;
        const RECV: u64 = 1;
        /// Round trips each path makes before it takes its turn, and untimed ones first.
        const BLOCK: usize = 500;
        const WARMUP: usize = 200;
        /// A path that is faster or slower than the driver's by less than this is a tie.
        const TIE: f64 = 0.03;

        /// One entry of a provided buffer ring as the kernel reads it (`struct
        /// io_uring_buf`): address, length, buffer id, and a reserved half-word that in the
        /// first entry is the ring's tail. Atomics, because the kernel reads the ring while
        /// this program writes it.
        #[repr(C)]
        #[derive(Default)]
        struct BufEntry {
            addr: AtomicU64,
            len: AtomicU32,
            bid: AtomicU16,
            tail: AtomicU16,
        }

        const _: () = assert!(std::mem::size_of::<BufEntry>() == 16);

        /// Where a receive lands.
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        enum Path {
            /// `IORING_OP_RECV` into the destination (the driver's overwriting steps).
            Direct,
            /// `IORING_OP_RECV` into a staging buffer, then copied out (the driver's
            /// reducing steps, whose fold reads the staging buffer once).
            Staged,
            /// One-shot `IORING_OP_RECV` with buffer select from the provided buffer ring,
            /// copied out, then the buffer handed back.
            Provided,
            /// `IORING_OP_READ_FIXED` into a registered buffer, then copied out.
            Fixed,
        }

        impl Path {
            fn label(self) -> &'static str {
                match self {
                    Path::Direct => "RECV into destination",
                    Path::Staged => "RECV into staging (driver)",
                    Path::Provided => "provided buffer ring",
                    Path::Fixed => "READ_FIXED registered",
                }
            }
        }

        /// A ring set up as the driver's (cooperative task running, task-run flag) that
        /// receives on one socket by one [`Path`]. Nothing is in flight between its calls:
        /// each waits for the completions of all it pushed, so its memory is the kernel's
        /// only inside them (a provided buffer: from its hand-back to the completion that
        /// names it).
        struct Receiver {
            /// First field, so dropped first: the registrations end with the ring (after the
            /// calls, which leave nothing in flight that could still use them).
            ring: IoUring,
            path: Path,
            fd: types::Fd,
            /// The staging buffer, the provided buffers (`PROVIDED` of `CHUNK` bytes, buffer
            /// id `i` at `i * CHUNK`) or the registered buffer; empty for `Direct`.
            mem: Vec<u8>,
            /// The provided ring's memory, oversized so that a page-aligned run of entries
            /// starts at `first`; empty on other paths.
            entries: Box<[BufEntry]>,
            first: usize,
            /// The provided ring's tail as this program last published it.
            tail: u16,
            /// The completions of the last wait: `user_data`, result, flags.
            done: Vec<(u64, i32, u32)>,
        }

        impl Receiver {
            fn new(path: Path, socket: &TcpStream) -> io::Result<Receiver> {
                let ring = IoUring::builder()
                    .setup_coop_taskrun()
                    .setup_taskrun_flag()
                    .build(8)?;
                let bytes = match path {
                    Path::Direct => 0,
                    Path::Provided => usize::from(PROVIDED) * CHUNK,
                    Path::Staged | Path::Fixed => CHUNK,
                };
                let mut r = Receiver {
                    ring,
                    path,
                    fd: types::Fd(socket.as_raw_fd()),
                    mem: vec![0u8; bytes],
                    entries: Box::new([]),
                    first: 0,
                    tail: 0,
                    done: Vec::with_capacity(8),
                };
                match path {
                    Path::Provided => {
                        let count = 2 * RING_ALIGN / std::mem::size_of::<BufEntry>();
                        r.entries = (0..count).map(|_| BufEntry::default()).collect();
                        r.first = r
                            .entries
                            .iter()
                            .position(|e| {
                                (std::ptr::from_ref(e) as usize).is_multiple_of(RING_ALIGN)
                            })
                            .ok_or_else(|| io::Error::other("no page-aligned ring entry"))?;
                        for bid in 0..PROVIDED {
                            r.give_back(bid);
                        }
                        let at = std::ptr::from_ref(&r.entries[r.first]) as u64;
                        // SAFETY: `at` is page-aligned and starts `PROVIDED` entries (and a
                        // page) of `r.entries`, which no call moves or frees before the ring
                        // is dropped (first field); the kernel only reads them. The buffers
                        // they name lie in `r.mem`, likewise kept; the kernel writes one only
                        // for a receive in flight that selected it, and `Receiver` reads a
                        // buffer only after the completion that names it.
                        unsafe {
                            r.ring
                                .submitter()
                                .register_buf_ring_with_flags(at, PROVIDED, GROUP, 0)
                        }?;
                    }
                    Path::Fixed => {
                        let iov = libc::iovec {
                            iov_base: r.mem.as_mut_ptr().cast(),
                            iov_len: r.mem.len(),
                        };
                        // SAFETY: `r.mem` is neither moved nor freed before the ring is
                        // dropped (first field); the kernel writes it only for a
                        // `READ_FIXED` in flight, and `Receiver` reads it only after that
                        // read's completion.
                        unsafe { r.ring.submitter().register_buffers(&[iov]) }?;
                    }
                    Path::Direct | Path::Staged => {}
                }
                Ok(r)
            }

            /// Hands provided buffer `bid` to the kernel: its entry at the tail, then the new
            /// tail, stored with release ordering so that the kernel, which loads the tail
            /// with acquire ordering, sees the entry complete.
            fn give_back(&mut self, bid: u16) {
                let addr = self.mem.as_mut_ptr().wrapping_add(usize::from(bid) * CHUNK) as u64;
                let slot = self.first + usize::from(self.tail & (PROVIDED - 1));
                let entry = &self.entries[slot];
                entry.addr.store(addr, Ordering::Relaxed);
                entry.len.store(CHUNK as u32, Ordering::Relaxed);
                entry.bid.store(bid, Ordering::Relaxed);
                self.tail = self.tail.wrapping_add(1);
                self.entries[self.first]
                    .tail
                    .store(self.tail, Ordering::Release);
            }

            /// Queues a receive of at most `dest.len()` bytes (at most `CHUNK`). `Direct`
            /// lands them in `dest`, which the caller keeps alive, unmoved and untouched
            /// until [`Receiver::received`] has taken the completion.
            fn push_recv(&mut self, dest: &mut [u8]) {
                let len = dest.len().min(CHUNK) as u32;
                let entry = match self.path {
                    Path::Direct => opcode::Recv::new(self.fd, dest.as_mut_ptr(), len).build(),
                    Path::Staged => opcode::Recv::new(self.fd, self.mem.as_mut_ptr(), len).build(),
                    Path::Provided => opcode::Recv::new(self.fd, std::ptr::null_mut(), len)
                        .buf_group(GROUP)
                        .build()
                        .flags(squeue::Flags::BUFFER_SELECT),
                    Path::Fixed => {
                        opcode::ReadFixed::new(self.fd, self.mem.as_mut_ptr(), len, 0).build()
                    }
                };
                push(&mut self.ring, &entry.user_data(RECV)).unwrap_or_else(|e| fail(e));
            }

            /// Takes a receive's completion: the count of the bytes it brought, which are
            /// then at the start of `dest` (copied there, except on `Direct` where they
            /// landed). A provided buffer goes back to the ring once copied out. An error or
            /// the peer's close ends the process.
            fn received(&mut self, result: i32, flags: u32, dest: &mut [u8]) -> usize {
                if result < 0 {
                    fail(io::Error::from_raw_os_error(-result));
                }
                if result == 0 {
                    fail(io::ErrorKind::UnexpectedEof);
                }
                let n = result as usize;
                let from = match self.path {
                    Path::Direct => return n,
                    Path::Staged | Path::Fixed => 0,
                    Path::Provided => match cqueue::buffer_select(flags) {
                        Some(bid) => usize::from(bid) * CHUNK,
                        None => fail(io::Error::other("a buffer-select receive named no buffer")),
                    },
                };
                match (dest.get_mut(..n), self.mem.get(from..from + n)) {
                    (Some(to), Some(bytes)) => to.copy_from_slice(bytes),
                    _ => fail(io::Error::other("a receive brought more than it was given")),
                }
                if let Some(bid) = cqueue::buffer_select(flags) {
                    self.give_back(bid);
                }
                n
            }

            /// Waits as the driver's `Ring::exchange` does: submits what is queued, watches
            /// the completion queue (memory shared with the kernel: no system call) without
            /// yielding for `EAGER` and yielding after, enters the kernel when the task-run
            /// flag says a completion waits for this thread's task work, and after `TOTAL`
            /// sleeps in the kernel for a completion. Then takes every completion off the
            /// queue into `done`.
            fn wait(&mut self) {
                if !self.ring.submission().is_empty() {
                    enter(&mut self.ring, 0);
                }
                let start = Instant::now();
                while self.ring.completion().is_empty() {
                    let idle = start.elapsed();
                    if idle >= TOTAL {
                        enter(&mut self.ring, 1);
                    } else if self.ring.submission().taskrun() {
                        enter(&mut self.ring, 0);
                    } else if idle < EAGER {
                        std::hint::spin_loop();
                    } else {
                        std::thread::yield_now();
                    }
                }
                self.done.clear();
                let completions = self.ring.completion();
                self.done
                    .extend(completions.map(|c| (c.user_data(), c.result(), c.flags())));
            }

            /// Receives once into `dest` (at most `CHUNK` bytes) and returns the count.
            fn recv_once(&mut self, dest: &mut [u8]) -> usize {
                self.push_recv(dest);
                loop {
                    self.wait();
                    if let Some(&(_, result, flags)) = self.done.iter().find(|d| d.0 == RECV) {
                        return self.received(result, flags, dest);
                    }
                }
            }

            /// One round trip as the driver's step makes it: `out` sent and `back` filled,
            /// the send and the first receive in one submission, a short one re-submitted.
            fn round_trip(&mut self, out: &[u8], back: &mut [u8]) {
                let (mut sent, mut got) = (0, 0);
                let (mut sending, mut receiving) = (false, false);
                while sent < out.len() || got < back.len() {
                    if sent < out.len() && !sending {
                        let rest = &out[sent..];
                        let entry = opcode::Send::new(self.fd, rest.as_ptr(), rest.len() as u32)
                            .flags(libc::MSG_NOSIGNAL)
                            .build()
                            .user_data(SEND);
                        push(&mut self.ring, &entry).unwrap_or_else(|e| fail(e));
                        sending = true;
                    }
                    if got < back.len() && !receiving {
                        self.push_recv(&mut back[got..]);
                        receiving = true;
                    }
                    self.wait();
                    let done = std::mem::take(&mut self.done);
                    for &(data, result, flags) in &done {
                        if data == SEND {
                            if result < 0 {
                                fail(io::Error::from_raw_os_error(-result));
                            }
                            if result == 0 {
                                fail(io::Error::other("a send moved no byte"));
                            }
                            sent += result as usize;
                            sending = false;
                        } else {
                            got += self.received(result, flags, &mut back[got..]);
                            receiving = false;
                        }
                    }
                    self.done = done;
                }
            }
        }

        /// Submits what is queued and waits for `want` completions, retrying interruptions;
        /// any other failure leaves the operations' fate unknown and ends the process.
        fn enter(ring: &mut IoUring, want: usize) {
            loop {
                match ring.submit_and_wait(want) {
                    Ok(_) => return,
                    Err(e) if e.raw_os_error() == Some(libc::EINTR) => {}
                    Err(e) => fail(e),
                }
            }
        }

        /// What this kernel says about the registered-buffer receives other than
        /// `READ_FIXED`: whether `IORING_OP_RECV` takes `IORING_RECVSEND_FIXED_BUF`, and
        /// whether it knows `IORING_OP_RECV_ZC`.
        fn kernel_facts() -> io::Result<()> {
            let release = std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .unwrap_or_else(|_| "unknown".into());
            println!("kernel {}", release.trim());
            let (client, _server) = pair()?;
            let mut r = Receiver::new(Path::Fixed, &client)?;
            // The flag points the receive at the registered buffer (index 0), so had the
            // kernel taken it, the receive could only have written there; the empty socket
            // and MSG_DONTWAIT make it complete at once either way.
            let entry = opcode::Recv::new(r.fd, r.mem.as_mut_ptr(), 1)
                .ioprio(RECVSEND_FIXED_BUF)
                .flags(libc::MSG_DONTWAIT)
                .build()
                .user_data(RECV);
            push(&mut r.ring, &entry).unwrap_or_else(|e| fail(e));
            enter(&mut r.ring, 1);
            let answer = r.ring.completion().next().map(|c| c.result());
            let said = match answer {
                Some(e) if e == -libc::EINVAL => {
                    "EINVAL: receives take no registered buffer (the flag is for sends)".to_string()
                }
                Some(e) if e == -libc::EAGAIN => "taken (EAGAIN on the empty socket)".to_string(),
                Some(e) => format!("result {e}"),
                None => "no completion".to_string(),
            };
            println!("  IORING_OP_RECV with IORING_RECVSEND_FIXED_BUF: {said}");
            let mut probe = io_uring::Probe::new();
            let zc = r.ring.submitter().register_probe(&mut probe).is_ok()
                && probe.is_supported(OP_RECV_ZC);
            println!(
                "  IORING_OP_RECV_ZC: {}; either way it receives only through a zero-copy \
                 interface queue bound to a NIC receive queue with header/data split \
                 (IORING_REGISTER_ZCRX_IFQ), which loopback has none of: not measured",
                if zc {
                    "known to this kernel"
                } else {
                    "unknown to this kernel"
                }
            );
            println!("  IORING_OP_READ_FIXED on the socket: measured below");
            Ok(())
        }

        /// A verdict on a path from its ratios to the driver's path, one per block of round
        /// trips or per stream, each measured in the same stretch of time as the driver's
        /// (lower is better unless `higher_wins`). A win needs the median ratio better by
        /// [`TIE`] and the path better in three quarters of the measurements: load from
        /// elsewhere moves single figures by more than the differences sought.
        fn verdict(ratios: &mut [f64], higher_wins: bool) -> String {
            ratios.sort_by(f64::total_cmp);
            let n = ratios.len();
            let change = ratios[n / 2] - 1.0;
            let better = if higher_wins { change } else { -change };
            let ahead = ratios
                .iter()
                .filter(|&&r| if higher_wins { r > 1.0 } else { r < 1.0 })
                .count();
            let how = format!(
                "median ratio {:+.1}%, ahead in {ahead} of {n}",
                change * 100.0
            );
            if better >= TIE && 4 * ahead >= 3 * n {
                format!("WINS by {:.0}% ({how})", better * 100.0)
            } else if better >= TIE {
                format!("does not win: ahead too rarely to tell ({how})")
            } else if better <= -TIE {
                format!("does not win: {:.0}% worse ({how})", -better * 100.0)
            } else {
                format!("does not win: a tie within {:.0}% ({how})", TIE * 100.0)
            }
        }

        pub(super) fn run(rounds: usize) -> io::Result<()> {
            kernel_facts()?;
            for size in [4, 8 << 10] {
                ping_pong(size, rounds)?;
            }
            stream((rounds / 1000).clamp(2, 50))
        }

        /// `size`-byte round trips against a blocking echo thread, `rounds` per path. The
        /// paths share the connection and the echo thread, each with a ring of its own, so
        /// that where the scheduler put the threads (which moved medians by a third between
        /// connections of the same path) is the same for all of them.
        fn ping_pong(size: usize, rounds: usize) -> io::Result<()> {
            const PATHS: [Path; 3] = [Path::Staged, Path::Provided, Path::Fixed];
            let (client, mut server) = pair()?;
            let echo = std::thread::spawn(move || -> io::Result<()> {
                let mut b = vec![0u8; size];
                for _ in 0..(WARMUP + rounds) * PATHS.len() {
                    server.read_exact(&mut b)?;
                    server.write_all(&b)?;
                }
                Ok(())
            });
            let mut sides = Vec::new();
            for path in PATHS {
                sides.push((Receiver::new(path, &client)?, Vec::with_capacity(rounds)));
            }
            let mut out = vec![0u8; size];
            let mut back = vec![0u8; size];
            // Per block, each path's median round trip.
            let mut blocks: Vec<Vec<f64>> = Vec::new();
            let mut block_times = Vec::with_capacity(BLOCK.max(WARMUP));
            let (mut done, mut turn) = (0, 0);
            let mut warm = true;
            while done < rounds {
                let block = if warm {
                    WARMUP
                } else {
                    BLOCK.min(rounds - done)
                };
                let mut medians = vec![0.0; sides.len()];
                // Each block starts with the next path, so none is always first.
                turn += 1;
                for k in 0..sides.len() {
                    let at = (turn + k) % sides.len();
                    let (receiver, times) = &mut sides[at];
                    block_times.clear();
                    for i in 0..block {
                        out[..4].copy_from_slice(&((done + i) as u32).to_le_bytes());
                        let t = Instant::now();
                        receiver.round_trip(&out, &mut back);
                        let took = t.elapsed();
                        if back != out {
                            fail(io::Error::other("the echo came back different"));
                        }
                        block_times.push(took);
                    }
                    block_times.sort();
                    medians[at] = block_times[block_times.len() / 2].as_secs_f64();
                    if !warm {
                        times.extend_from_slice(&block_times);
                    }
                }
                if !warm {
                    done += block;
                    blocks.push(medians);
                }
                warm = false;
            }
            let label = if size < 1024 {
                format!("{size} B")
            } else {
                format!("{} KiB", size >> 10)
            };
            println!(
                "\n{label} round trips over loopback TCP, {rounds} per path, in {} blocks of \
                 {BLOCK} taken in turn",
                blocks.len()
            );
            println!("  {:<28} {:>10} {:>10}", "path", "median µs", "p90 µs");
            for (receiver, mut times) in sides {
                let path = receiver.path.label();
                drop(receiver);
                times.sort();
                let median = times[times.len() / 2].as_secs_f64() * 1e6;
                let p90 = times[times.len() * 9 / 10].as_secs_f64() * 1e6;
                println!("  {path:<28} {median:>10.2} {p90:>10.2}");
            }
            drop(client);
            echo.join()
                .map_err(|_| io::Error::other("the echo thread panicked"))??;
            for (name, at) in [("provided buffer ring", 1), ("READ_FIXED", 2)] {
                let mut ratios: Vec<f64> = blocks.iter().map(|m| m[at] / m[0]).collect();
                println!(
                    "verdict, {label} round trip, {name} against the driver's RECV into staging: \
                     {}",
                    verdict(&mut ratios, false)
                );
            }
            Ok(())
        }

        /// A 64 MiB stream per path, `iterations` times, received in `CHUNK`s into a
        /// destination buffer; one untimed stream each first.
        fn stream(iterations: usize) -> io::Result<()> {
            // Bytes that differ chunk to chunk, so that a misplaced copy shows.
            let pattern: Vec<u8> = (0..STREAM).map(|i| (i % 251) as u8).collect();
            let pattern = std::sync::Arc::new(pattern);
            // One connection and one writer for all paths, as in `ping_pong`: the paths
            // take turns reading a stream each.
            const PATHS: [Path; 4] = [Path::Staged, Path::Direct, Path::Provided, Path::Fixed];
            let (client, mut server) = pair()?;
            let bytes = pattern.clone();
            let writer = std::thread::spawn(move || -> io::Result<()> {
                for _ in 0..(iterations + 1) * PATHS.len() {
                    server.write_all(&bytes)?;
                }
                Ok(())
            });
            let mut sides = Vec::new();
            for path in PATHS {
                sides.push((Receiver::new(path, &client)?, [Duration::ZERO; 3]));
            }
            // Written before the first stream, so that no stream pays its page faults.
            let mut dest = vec![1u8; STREAM];
            // Per pass, each path's wall and receiving-thread CPU seconds.
            let mut passes: Vec<Vec<[f64; 2]>> = Vec::new();
            for pass in 0..=iterations {
                let paths = sides.len();
                let mut this = vec![[0.0; 2]; paths];
                // Each pass starts with the next path, so none is always first.
                for k in 0..paths {
                    let at = (pass + k) % paths;
                    let (receiver, totals) = &mut sides[at];
                    let (wall, thread, process) = (
                        Instant::now(),
                        cpu_time(libc::RUSAGE_THREAD),
                        cpu_time(libc::RUSAGE_SELF),
                    );
                    let mut got = 0;
                    while got < STREAM {
                        let end = (got + CHUNK).min(STREAM);
                        got += receiver.recv_once(&mut dest[got..end]);
                    }
                    let taken = [
                        wall.elapsed(),
                        cpu_time(libc::RUSAGE_THREAD).saturating_sub(thread),
                        cpu_time(libc::RUSAGE_SELF).saturating_sub(process),
                    ];
                    if dest != *pattern {
                        fail(io::Error::other("the stream arrived different"));
                    }
                    dest.fill(1);
                    this[at] = [taken[0].as_secs_f64(), taken[1].as_secs_f64()];
                    if pass > 0 {
                        for (total, t) in totals.iter_mut().zip(taken) {
                            *total += t;
                        }
                    }
                }
                if pass > 0 {
                    passes.push(this);
                }
            }
            println!(
                "\n64 MiB streams over loopback TCP from a blocking writer, {iterations} per \
                 path taken in turn, received in 1 MiB operations"
            );
            println!(
                "  {:<28} {:>8} {:>22} {:>22}",
                "path", "GB/s", "ms CPU/64 MiB receiver", "ms CPU/64 MiB process"
            );
            for (receiver, [wall, thread, process]) in sides {
                let label = receiver.path.label();
                drop(receiver);
                let rate = (STREAM * iterations) as f64 / wall.as_secs_f64() / 1e9;
                let ms = |d: Duration| d.as_secs_f64() * 1e3 / iterations as f64;
                println!(
                    "  {label:<28} {rate:>8.2} {:>22.1} {:>22.1}",
                    ms(thread),
                    ms(process)
                );
            }
            drop(client);
            writer
                .join()
                .map_err(|_| io::Error::other("the writer thread panicked"))??;
            // Rates are compared as the driver's time over the path's (above 1: faster).
            let ratios = |at: usize, of: usize| -> Vec<f64> {
                passes
                    .iter()
                    .map(|p| match of {
                        0 => p[0][0] / p[at][0],
                        _ => p[at][1] / p[0][1],
                    })
                    .collect()
            };
            for (name, at) in [
                ("RECV into destination", 1),
                ("provided buffer ring", 2),
                ("READ_FIXED", 3),
            ] {
                println!(
                    "verdict, 64 MiB stream, {name} against the driver's RECV into staging: \
                     rate {}; receiver CPU {}",
                    verdict(&mut ratios(at, 0), true),
                    verdict(&mut ratios(at, 1), false),
                );
            }
            Ok(())
        }
    }
}
