//! The skeleton every TCP group forms with: listen on this rank's addresses, dial the
//! peers' with backoff, accept, run a handshake on each connection, all on one poller, and
//! report what it still waits for, until the connections are formed, a peer refused, or the
//! timeout passed.
//!
//! What differs between groups is a [`Formation`]: which connections to form (MLX's ring:
//! both neighbours; the native wire: a mesh), which handshake runs on them (none, or the
//! keyed one of [`crate::auth`] for MLX's ring; the hello for the native wire), how a
//! candidate is chosen and what the errors say. [`form`] is the loop; [`pump`] feeds a
//! handshake from its socket; [`prepare`] and [`finish`] are what every formation does
//! before and after it.

use std::io;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token};

use super::Connections;
use super::socket::{self, SocketTuning};
use crate::auth::{self, Handshake, Key, Outcome};
use crate::comm::reports::Reports;
use crate::config::env;
use crate::config::hostfile::RingAddresses;
use crate::error::{Error, Result};
use crate::options::Options;

/// The first retry of a refused connection; doubled after each refusal up to the cap.
pub(crate) const FIRST_RETRY: Duration = Duration::from_millis(10);
const MAX_RETRY: Duration = Duration::from_millis(250);

/// The wait before the next try of a connection that just failed after waiting `current`.
pub(crate) fn next_backoff(current: Duration) -> Duration {
    (current * 2).min(MAX_RETRY)
}

/// The poller tokens of a formation: listeners from 0, outgoing connections from
/// [`DIAL_BASE`], accepted candidates from [`CANDIDATE_BASE`].
pub(crate) const DIAL_BASE: usize = 1 << 16;
pub(crate) const CANDIDATE_BASE: usize = 1 << 24;

/// The token of outgoing connection `i`.
fn dial_token(i: usize) -> Token {
    Token(DIAL_BASE + i)
}

/// The token of accepted candidate `id`.
fn candidate_token(id: usize) -> Token {
    Token(CANDIDATE_BASE + id)
}

/// The next connection waiting on `listener`, rank `rank`'s address `slot` (`at`), with
/// the address it came from; `None` when none waits. What is left after the transient
/// errors ([`socket::accept_next`]) is this machine's: out of descriptors or memory. No
/// peer is at fault.
///
/// # Errors
///
/// That local failure.
pub(crate) fn accept(
    listener: &TcpListener,
    rank: usize,
    (slot, at): (usize, SocketAddr),
) -> Result<Option<(TcpStream, SocketAddr)>> {
    socket::accept_next(listener).map_err(|e| {
        Error::local(
            format!("rank {rank} accepting on its address {slot} ({at})"),
            e,
        )
    })
}

/// A poller, and a listener on each of this rank's addresses registered for reads under
/// its index as token; `poller` names the poller in its error ("the ring's").
///
/// # Errors
///
/// A local failure: the poller, an address this rank cannot listen on, a registration.
pub(crate) fn listen(
    addrs: &RingAddresses,
    tuning: &SocketTuning,
    poller: &str,
) -> Result<(Poll, Vec<TcpListener>)> {
    let poll = Poll::new().map_err(|e| Error::local(format!("creating {poller} poller"), e))?;
    let mut listeners = Vec::with_capacity(addrs.listen.len());
    for (i, &addr) in addrs.listen.iter().enumerate() {
        let mut listener = socket::listen(addr, tuning).map_err(|e| {
            Error::local(
                format!(
                    "rank {} cannot listen on {addr} (its address {i})",
                    addrs.rank
                ),
                e,
            )
        })?;
        poll.registry()
            .register(&mut listener, Token(i), Interest::READABLE)
            .map_err(|e| Error::local("registering a listener", e))?;
        listeners.push(listener);
    }
    Ok((poll, listeners))
}

/// Registers a connection being formed for reads and writes under `token`; `what` names
/// the step in the error.
fn register(poll: &Poll, stream: &mut TcpStream, token: Token, what: &str) -> Result<()> {
    poll.registry()
        .register(stream, token, Interest::READABLE | Interest::WRITABLE)
        .map_err(|e| Error::local(what, e))
}

/// Registers accepted candidate `id` for reads and writes under its token.
///
/// # Errors
///
/// That local failure.
pub(crate) fn register_candidate(poll: &Poll, stream: &mut TcpStream, id: usize) -> Result<()> {
    let token = candidate_token(id);
    register(poll, stream, token, "registering an accepted connection")
}

/// Starts outgoing connection `i` to `addr`, registered under its token: the connecting
/// stream, or why the dial failed at once (the formation retries it).
///
/// # Errors
///
/// A local failure registering it.
pub(crate) fn dial(
    poll: &Poll,
    tuning: &SocketTuning,
    i: usize,
    addr: SocketAddr,
) -> Result<io::Result<TcpStream>> {
    match socket::dial(addr, tuning) {
        Ok(mut stream) => {
            register(poll, &mut stream, dial_token(i), "registering a connection")?;
            Ok(Ok(stream))
        }
        Err(e) => Ok(Err(e)),
    }
}

/// The most a handshake reads at once: the longest message of the keyed handshake.
const HANDSHAKE_READ: usize = auth::Challenge::LEN;

/// Moves a handshake on as far as the socket allows now, reading no more than it wants.
/// `Err` for an I/O error other than the peer closing (which the handshake is told of).
pub(crate) fn pump(stream: &mut TcpStream, hs: &mut impl Handshake) -> io::Result<()> {
    let mut buf = [0u8; HANDSHAKE_READ];
    loop {
        match hs.outcome() {
            Outcome::Pending => {}
            Outcome::Established => return Ok(()),
            Outcome::Rejected(_) => {
                // Parting bytes let the peer learn why too; one try, since we are leaving.
                if !hs.transmit().is_empty() {
                    let _ = socket::write_some(stream, hs.transmit());
                }
                return Ok(());
            }
        }
        if !hs.transmit().is_empty() {
            match socket::write_some(stream, hs.transmit())? {
                0 => return Ok(()),
                n => {
                    hs.handle_sent(n);
                    continue;
                }
            }
        }
        let want = hs.wants().min(buf.len());
        if want == 0 {
            return Ok(());
        }
        match socket::read_some(stream, &mut buf[..want])? {
            None => return Ok(()),
            Some(0) => hs.handle_closed(),
            Some(n) => {
                hs.handle_recv(&buf[..n]);
            }
        }
    }
}

/// One group's setup, as [`form`] drives it: its listeners, dials and candidates are
/// registered on the poller it lends ([`Formation::poller`]) under the tokens above.
pub(crate) trait Formation: Sized {
    /// What a formed setup hands over.
    type Formed;

    /// What the loop says when its wait fails ("waiting to form the ring").
    const WAITING: &'static str;

    /// The poller and its events.
    fn poller(&mut self) -> (&mut Poll, &mut Events);

    /// Starts the dials whose retry is due.
    ///
    /// # Errors
    ///
    /// A local failure (registering a socket).
    fn start_due_dials(&mut self) -> Result<()>;

    /// `Some(Ok(()))` once every connection is formed, `Some(Err)` once a peer refused
    /// (and the formation has waited as long as it wants to for its own reasons), else
    /// `None`.
    fn settled(&mut self) -> Option<Result<()>>;

    /// Hands the formed connections over.
    ///
    /// # Errors
    ///
    /// A local failure setting them up.
    fn finish(self) -> Result<Self::Formed>;

    /// Says, at `info`, what the setup still waits for after `elapsed` (of `timeout`).
    fn report(&self, elapsed: Duration, timeout: Duration);

    /// The error for a setup that did not form within `timeout`.
    fn give_up(self, timeout: Duration) -> Error;

    /// When the next dial's retry is due, if any waits.
    fn next_retry(&self) -> Option<Instant>;

    /// Listener `i` reported a connection.
    ///
    /// # Errors
    ///
    /// A local failure (the listener failed).
    fn accept(&mut self, i: usize) -> Result<()>;

    /// Outgoing connection `i` reported progress.
    ///
    /// # Errors
    ///
    /// A local failure.
    fn progress_dial(&mut self, i: usize) -> Result<()>;

    /// Accepted candidate `id` reported progress.
    ///
    /// # Errors
    ///
    /// A local failure.
    fn progress_candidate(&mut self, id: usize) -> Result<()>;

    /// The connections in what [`Formation::finish`] hands over.
    fn connections(formed: &mut Self::Formed) -> &mut Connections;
}

/// The key `options` hold, checked, and the congestion control they ask for, checked:
/// what every formation needs before it starts.
///
/// # Errors
///
/// A key that does not decode; a congestion control this system refuses.
pub(crate) fn prepare(options: &Options) -> Result<Option<Key>> {
    let key = options.key.as_ref().map(auth::Secret::key).transpose()?;
    if let Some(algorithm) = &options.tcp_congestion {
        socket::check_congestion(algorithm).map_err(|e| {
            Error::invalid(format!(
                "Options::tcp_congestion ({} for init): {e}",
                crate::config::env::TCP_CONGESTION_VAR
            ))
        })?;
    }
    Ok(key)
}

/// Forms a group: resolves the event loop `options` ask for against the environment
/// ([`IO_VAR`](crate::config::env::IO_VAR), before any socket exists, so that a value
/// naming no loop fails at once), makes the setup (`make`, given the socket options), runs
/// [`form`] until `options.timeout` after `started`, then picks the connections' driver
/// ([`Connections::select_io`]). The probes see the outcome (`rank` of `ranks`, with
/// `connections` per neighbour).
///
/// # Errors
///
/// An event loop variable naming no loop; what the setup or the driver's choice fails with.
pub(crate) fn finish<F: Formation>(
    options: &Options,
    (rank, ranks, connections): (usize, usize, usize),
    started: Instant,
    make: impl FnOnce(SocketTuning) -> Result<F>,
) -> Result<F::Formed> {
    let io = env::io(&env::process, options.io)?;
    ffi::probes::register();
    let tuning = SocketTuning::from_options(options);
    let result = make(tuning)
        .and_then(|setup| form(setup, started, options.timeout))
        .and_then(|mut formed| F::connections(&mut formed).select_io(io).map(|()| formed));
    let elapsed = started.elapsed().as_nanos() as u64;
    ffi::probes::connect_done(
        rank as u64,
        ranks as u64,
        connections as u64,
        elapsed,
        result.is_ok(),
    );
    result
}

/// The setup loop: retries, accepts and handshakes until `setup` is formed, a peer refused,
/// or `timeout` has passed since `started`. While it waits it reports what it still waits
/// for ([`Reports`]).
///
/// # Errors
///
/// The refusal, the setup's error at the deadline, or a local failure.
pub(crate) fn form<F: Formation>(
    mut setup: F,
    started: Instant,
    timeout: Duration,
) -> Result<F::Formed> {
    let deadline = crate::options::deadline(started, timeout);
    let mut reports = Reports::new(started);
    let mut tokens = Vec::new();
    loop {
        setup.start_due_dials()?;
        match setup.settled() {
            Some(Ok(())) => return setup.finish(),
            Some(Err(error)) => return Err(error),
            None => {}
        }
        let now = Instant::now();
        // Before the deadline's check, so a rank that gives up has said what it waited
        // for (every timeout of at least the first report's time sees one report).
        if let Some(elapsed) = reports.take(now) {
            setup.report(elapsed, timeout);
        }
        if now >= deadline {
            return Err(setup.give_up(timeout));
        }
        let wake = setup
            .next_retry()
            .unwrap_or(deadline)
            .min(deadline)
            .min(reports.due());
        let (poll, events) = setup.poller();
        match poll.poll(events, Some(wake.saturating_duration_since(now))) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(Error::local(F::WAITING, e)),
        }
        tokens.clear();
        tokens.extend(events.iter().map(|e| e.token().0));
        for &token in &tokens {
            if token < DIAL_BASE {
                setup.accept(token)?;
            } else if token < CANDIDATE_BASE {
                setup.progress_dial(token - DIAL_BASE)?;
            } else {
                setup.progress_candidate(token - CANDIDATE_BASE)?;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refused_connections_back_off_from_10_ms_to_a_250_ms_cap() {
        let mut wait = FIRST_RETRY;
        let mut schedule = vec![wait];
        for _ in 0..6 {
            wait = next_backoff(wait);
            schedule.push(wait);
        }
        let ms: Vec<u128> = schedule.iter().map(Duration::as_millis).collect();
        assert_eq!(ms, [10, 20, 40, 80, 160, 250, 250]);
    }

    #[test]
    fn tokens_stay_in_their_ranges() {
        assert_eq!(dial_token(0).0, DIAL_BASE);
        assert!(dial_token(CANDIDATE_BASE - DIAL_BASE - 1).0 < CANDIDATE_BASE);
        assert_eq!(candidate_token(3).0, CANDIDATE_BASE + 3);
    }
}
