//! A TCP proxy that injects network faults into the connections through it, for fault tests.
//!
//! [`Proxy`] listens on a free port of 127.0.0.1 only and forwards each connection it accepts to
//! a database (or any TCP server). Each connection can be slowed down, black-holed, reset or
//! closed, and new connections refused, as a network or a middlebox fails. It is for tests: it
//! favours faithful faults over throughput and is never meant for production traffic.

use std::collections::VecDeque;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use pgcoord::error::{Error, ErrorKind, Result};

/// The largest chunk read from a socket at once.
const CHUNK: usize = 16 * 1024;

/// At most this many bytes wait in one direction's delay queue; reading pauses beyond it.
const QUEUE_LIMIT: usize = 1024 * 1024;

/// How long a closed connection may take for its peer to close too, before it is let go.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(10);

/// A TCP proxy to a database that injects network faults into the connections through it:
/// - [`delay`](Proxy::delay) slows every connection, open now and later, by a latency in each
///   direction, as a slow network does; [`Duration::ZERO`] ends it.
/// - [`cut`](Proxy::cut) black-holes the connections open so far: it stops forwarding but keeps
///   their sockets open, as a network partition looks to a client. They stay black-holed.
/// - [`reset`](Proxy::reset) aborts them with an RST to both sides, as a crashed middlebox or a
///   rebooted peer does.
/// - [`close`](Proxy::close) closes them cleanly (FIN) on both sides.
/// - [`refuse`](Proxy::refuse) makes new connections fail at once, as when the database is down.
/// - [`black_hole_new`](Proxy::black_hole_new) makes new connections hang, as a partition that
///   drops packets does: with [`cut`](Proxy::cut), the partition as a client sees it.
///
/// Connections made after a cut, reset or close pass as usual. It listens on 127.0.0.1 only and
/// runs on the tokio runtime it was started on. Dropping it stops accepting connections; those
/// open go on as they are until either end closes them.
pub struct Proxy {
    port: u16,
    conns: Arc<Mutex<Vec<watch::Sender<Mode>>>>,
    refusing: Arc<AtomicBool>,
    black_holing: Arc<AtomicBool>,
    delay: watch::Sender<Duration>,
    accepting: JoinHandle<()>,
}

/// What the proxy does with one connection; it only moves down this list.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Mode {
    Forward,
    /// Black-holed: nothing is read or written, the sockets stay open.
    Cut,
    /// FIN to both sides, then read what they still send until they close.
    Close,
    /// RST to both sides.
    Reset,
}

impl Proxy {
    /// Starts a proxy on a free port of 127.0.0.1 to the first host and port of `pg` (port 5432
    /// when it has none); connect through it with [`pg_config`](Self::pg_config). Fails when
    /// that host is not a TCP one (a Unix socket directory, or none) or no port can be bound.
    ///
    /// It must be called within a tokio runtime, which runs the proxy until it is dropped. The
    /// database is connected to for each accepted connection: when it cannot be reached, that
    /// connection is closed.
    pub async fn start(pg: &tokio_postgres::Config) -> Result<Proxy> {
        let host = match pg.get_hosts().first() {
            Some(tokio_postgres::config::Host::Tcp(host)) => host.clone(),
            _ => {
                return Err(Error::new(
                    ErrorKind::InvalidConfig,
                    "the proxy needs a database reached over TCP (a host name or address)",
                ));
            }
        };
        let upstream = (host, pg.get_ports().first().copied().unwrap_or(5432));
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| Error::new(ErrorKind::Other, "cannot bind the proxy").with_source(e))?;
        let port = listener
            .local_addr()
            .map_err(|e| Error::new(ErrorKind::Other, "cannot bind the proxy").with_source(e))?
            .port();
        let conns: Arc<Mutex<Vec<watch::Sender<Mode>>>> = Arc::default();
        let refusing = Arc::new(AtomicBool::new(false));
        let black_holing = Arc::new(AtomicBool::new(false));
        let (delay, delays) = watch::channel(Duration::ZERO);
        let (all, refuse, black_hole) = (conns.clone(), refusing.clone(), black_holing.clone());
        let accepting = tokio::spawn(async move {
            loop {
                let client = match listener.accept().await {
                    Ok((client, _)) => client,
                    // Out of descriptors, or the like: try again shortly.
                    Err(_) => {
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        continue;
                    }
                };
                if refuse.load(Ordering::SeqCst) {
                    let _ = client.set_zero_linger();
                    continue;
                }
                // Registered before the upstream connect, so a fault injected meanwhile applies.
                let first = match black_hole.load(Ordering::SeqCst) {
                    true => Mode::Cut,
                    false => Mode::Forward,
                };
                let (mode, rx) = watch::channel(first);
                {
                    let mut all = all.lock().unwrap_or_else(PoisonError::into_inner);
                    all.retain(|conn| !conn.is_closed());
                    all.push(mode);
                }
                let (upstream, delay) = (upstream.clone(), delays.clone());
                tokio::spawn(async move {
                    // Database unreachable: the client sees its connection closed.
                    let Ok(server) = TcpStream::connect(upstream).await else {
                        return;
                    };
                    // As the PostgreSQL client and server do: without it, Nagle's algorithm and
                    // delayed acknowledgements hold small messages back for tens of ms per hop.
                    let _ = (client.set_nodelay(true), server.set_nodelay(true));
                    let (client, server) = (Arc::new(client), Arc::new(server));
                    tokio::spawn(forward(
                        client.clone(),
                        server.clone(),
                        rx.clone(),
                        delay.clone(),
                    ));
                    forward(server, client, rx, delay).await;
                });
            }
        });
        Ok(Proxy {
            port,
            conns,
            refusing,
            black_holing,
            delay,
            accepting,
        })
    }

    /// The port the proxy listens on, on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Settings for connecting through the proxy: those of `pg` (user, database name and
    /// password) with the proxy's host and port. They are built afresh, since
    /// `tokio_postgres::Config::host` and `::port` append to the hosts already there.
    pub fn pg_config(&self, pg: &tokio_postgres::Config) -> tokio_postgres::Config {
        super::support::pointed_at(pg, self.port)
    }

    /// Slows the network down: every connection, open now and made later, forwards each chunk
    /// it reads `by` after reading it, in each direction, so that a round trip takes `2 * by`
    /// more. Chunks keep their order, and a chunk waits for the one before it. The delay of a
    /// chunk is the one set when it was read; [`Duration::ZERO`] returns to plain forwarding
    /// once the chunks already delayed are passed on.
    ///
    /// A delayed chunk not yet passed on when its connection is cut, reset or closed is lost,
    /// as on a network that fails.
    pub fn delay(&self, by: Duration) {
        self.delay.send_replace(by);
    }

    /// Black-holes every connection open now: nothing more is forwarded, in either direction,
    /// and both sockets stay open, until the connection is reset or closed.
    pub fn cut(&self) {
        self.set_mode(Mode::Cut);
    }

    /// Aborts every connection open now (black-holed ones too) with an RST to both the client
    /// and the database: their next read fails with "connection reset".
    pub fn reset(&self) {
        self.set_mode(Mode::Reset);
    }

    /// Closes every connection open now (black-holed ones too) cleanly: a FIN to both the client
    /// and the database, which read end-of-file.
    pub fn close(&self) {
        self.set_mode(Mode::Close);
    }

    /// While `on`, new connections are accepted and aborted at once (RST) before reaching the
    /// database, so connecting fails; off again, they pass. Open connections are unaffected.
    pub fn refuse(&self, on: bool) {
        self.refusing.store(on, Ordering::SeqCst);
    }

    /// While `on`, new connections are accepted and black-holed at once: connecting hangs until
    /// the client gives up, as when a partition drops packets. Off again, new ones pass; those
    /// black-holed stay so, as [`cut`](Self::cut) ones do.
    pub fn black_hole_new(&self, on: bool) {
        self.black_holing.store(on, Ordering::SeqCst);
    }

    fn set_mode(&self, mode: Mode) {
        let conns = self.conns.lock().unwrap_or_else(PoisonError::into_inner);
        for conn in conns.iter() {
            conn.send_if_modified(|current| {
                let later = *current < mode;
                if later {
                    *current = mode;
                }
                later
            });
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accepting.abort();
    }
}

impl std::fmt::Debug for Proxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Proxy")
            .field("port", &self.port)
            .field("delay", &*self.delay.borrow())
            .field("refusing", &self.refusing.load(Ordering::SeqCst))
            .finish_non_exhaustive()
    }
}

/// Forwards one direction of a proxied connection, `from` to `to`, obeying its mode and the
/// proxy's delay. Both directions hold both sockets, which close when both are done.
async fn forward(
    from: Arc<TcpStream>,
    to: Arc<TcpStream>,
    mut mode: watch::Receiver<Mode>,
    delay: watch::Receiver<Duration>,
) {
    let mut buf = vec![0u8; CHUNK];
    // Chunks read but not passed on yet, oldest first, each with when it is due; `None` is the
    // end of the stream, passed on as a FIN.
    let mut delayed: VecDeque<(Instant, Option<Vec<u8>>)> = VecDeque::new();
    let mut delayed_bytes = 0;
    let mut ended = false;
    loop {
        let current = *mode.borrow_and_update();
        match current {
            Mode::Forward => {}
            Mode::Cut => {
                // Keep the sockets open, read nothing, until closed or reset.
                delayed.clear();
                delayed_bytes = 0;
                while next_mode(&mut mode).await <= Mode::Cut {}
                continue;
            }
            Mode::Close => return close(&from, &to, mode).await,
            Mode::Reset => return reset(&from, &to),
        }
        let due = delayed.front().map(|(at, _)| *at);
        tokio::select! {
            biased;
            _ = next_mode(&mut mode) => {}
            _ = tokio::time::sleep_until(due.unwrap_or_else(Instant::now)), if due.is_some() => {
                let Some((_, chunk)) = delayed.pop_front() else {
                    continue;
                };
                let Some(chunk) = chunk else {
                    shutdown_write(&to);
                    return;
                };
                delayed_bytes -= chunk.len();
                if !pass_on(&to, &chunk, &mut mode).await {
                    return;
                }
            }
            read = read_some(&from, &mut buf), if !ended && delayed_bytes < QUEUE_LIMIT => {
                // The end of this direction is passed on as a FIN, the peer's close.
                let n = match read {
                    Ok(0) | Err(_) => {
                        ended = true;
                        None
                    }
                    Ok(n) => Some(n),
                };
                // Changed while reading: the chunk is swallowed.
                if *mode.borrow() != Mode::Forward {
                    continue;
                }
                let by = *delay.borrow();
                if by.is_zero() && delayed.is_empty() {
                    let Some(n) = n else {
                        shutdown_write(&to);
                        return;
                    };
                    if !pass_on(&to, &buf[..n], &mut mode).await {
                        return;
                    }
                } else {
                    let chunk = n.map(|n| buf[..n].to_vec());
                    delayed_bytes += chunk.as_ref().map_or(0, Vec::len);
                    delayed.push_back((Instant::now() + by, chunk));
                }
            }
        }
    }
}

/// Writes `chunk` to `to` unless the mode changes first, which swallows the rest of it. False
/// when the write failed and this direction is done.
async fn pass_on(to: &TcpStream, chunk: &[u8], mode: &mut watch::Receiver<Mode>) -> bool {
    tokio::select! {
        biased;
        _ = next_mode(mode) => true,
        written = write_all(to, chunk) => written.is_ok(),
    }
}

/// The next mode of a connection; never, once the proxy is gone.
async fn next_mode(mode: &mut watch::Receiver<Mode>) -> Mode {
    if mode.changed().await.is_err() {
        std::future::pending::<()>().await;
    }
    *mode.borrow_and_update()
}

/// FIN to the peer of `to`, then reads `from` until its peer closes too, so that closing the
/// socket sends no RST for unread data; gives up after a while, or on a reset.
async fn close(from: &TcpStream, to: &TcpStream, mut mode: watch::Receiver<Mode>) {
    shutdown_write(to);
    let drain = async {
        let mut buf = vec![0u8; CHUNK];
        while let Ok(n) = read_some(from, &mut buf).await {
            if n == 0 {
                break;
            }
        }
    };
    tokio::select! {
        _ = drain => {}
        _ = tokio::time::sleep(CLOSE_TIMEOUT) => {}
        _ = async { while next_mode(&mut mode).await != Mode::Reset {} } => reset(from, to),
    }
}

/// Makes closing both sockets send an RST (SO_LINGER 0); they close when both directions let go.
fn reset(from: &TcpStream, to: &TcpStream) {
    let _ = from.set_zero_linger();
    let _ = to.set_zero_linger();
}

/// Sends a FIN on `socket` (shutdown of its write side), keeping it open for reading.
fn shutdown_write(socket: &TcpStream) {
    // SAFETY: shutdown on a descriptor this proxy owns and keeps open; nothing is freed.
    unsafe { libc::shutdown(socket.as_raw_fd(), libc::SHUT_WR) };
}

/// Reads what `socket` has, at least one byte, or 0 at its end.
async fn read_some(socket: &TcpStream, buf: &mut [u8]) -> std::io::Result<usize> {
    loop {
        socket.readable().await?;
        match socket.try_read(buf) {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            done => return done,
        }
    }
}

/// Writes all of `buf` to `socket`.
async fn write_all(socket: &TcpStream, mut buf: &[u8]) -> std::io::Result<()> {
    while !buf.is_empty() {
        socket.writable().await?;
        match socket.try_write(buf) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => buf = &buf[n..],
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    //! The proxy against a plain echo server, without a database.

    use super::*;

    /// An echo server on 127.0.0.1 and settings naming it.
    async fn echo() -> tokio_postgres::Config {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut buf = vec![0u8; CHUNK];
                    while let Ok(n) = read_some(&socket, &mut buf).await {
                        if n == 0 || write_all(&socket, &buf[..n]).await.is_err() {
                            break;
                        }
                    }
                    shutdown_write(&socket);
                });
            }
        });
        let mut pg = tokio_postgres::Config::new();
        pg.host("127.0.0.1").port(port);
        pg
    }

    async fn connect(proxy: &Proxy) -> TcpStream {
        TcpStream::connect(("127.0.0.1", proxy.port()))
            .await
            .unwrap()
    }

    /// Sends `message` and reads it back, timed.
    async fn round_trip(socket: &TcpStream, message: &[u8]) -> Duration {
        let start = Instant::now();
        let read = async {
            let mut back = Vec::new();
            let mut buf = vec![0u8; CHUNK];
            while back.len() < message.len() {
                let n = read_some(socket, &mut buf).await.unwrap();
                assert_ne!(n, 0, "closed after {} bytes", back.len());
                back.extend_from_slice(&buf[..n]);
            }
            back
        };
        let ((), back) = tokio::join!(async { write_all(socket, message).await.unwrap() }, read);
        assert!(back == message, "the echo differs");
        start.elapsed()
    }

    #[tokio::test]
    async fn refuses_a_unix_socket_host() {
        let mut pg = tokio_postgres::Config::new();
        pg.host_path("/run/postgresql");
        let error = Proxy::start(&pg).await.unwrap_err();
        assert_eq!(error.kind(), ErrorKind::InvalidConfig);
        assert_eq!(
            Proxy::start(&tokio_postgres::Config::new())
                .await
                .unwrap_err()
                .kind(),
            ErrorKind::InvalidConfig
        );
    }

    /// Delayed chunks arrive whole and in order, late by the delay each way, and new
    /// connections are delayed too; no delay again is fast.
    #[tokio::test]
    async fn delays_in_order() {
        let proxy = Proxy::start(&echo().await).await.unwrap();
        let open = connect(&proxy).await;
        assert!(round_trip(&open, b"fast").await < Duration::from_millis(500));

        proxy.delay(Duration::from_millis(200));
        let later = connect(&proxy).await;
        for socket in [&open, &later] {
            let took = round_trip(socket, b"slow").await;
            assert!(took >= Duration::from_millis(400), "{took:?}");
        }
        // Many chunks, written as fast as they go, come back in order.
        let message: Vec<u8> = (0..3 * QUEUE_LIMIT).map(|i| (i % 251) as u8).collect();
        round_trip(&later, &message).await;

        proxy.delay(Duration::ZERO);
        let took = round_trip(&open, b"fast again").await;
        assert!(took < Duration::from_millis(200), "{took:?}");
    }

    /// A cut connection forwards nothing, and a reset one reads "connection reset".
    #[tokio::test]
    async fn cuts_and_resets() {
        let proxy = Proxy::start(&echo().await).await.unwrap();
        let socket = connect(&proxy).await;
        round_trip(&socket, b"before").await;
        proxy.cut();
        write_all(&socket, b"lost").await.unwrap();
        let mut buf = [0u8; 16];
        let read = tokio::time::timeout(Duration::from_millis(200), read_some(&socket, &mut buf));
        assert!(read.await.is_err(), "nothing passes a cut");
        proxy.reset();
        let read = tokio::time::timeout(Duration::from_secs(5), read_some(&socket, &mut buf));
        let error = read.await.expect("reset").unwrap_err();
        assert_eq!(error.kind(), std::io::ErrorKind::ConnectionReset);
        // New connections pass.
        round_trip(&connect(&proxy).await, b"after").await;
    }
}
