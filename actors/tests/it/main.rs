//! Integration tests of the actix runtime against a real PostgreSQL: the shared throwaway
//! cluster, or `DATABASE_URL` when it is set.

mod advisory;
mod connection_faults;
mod lease_contention;
mod lease_guarantees;
mod leases;
mod reliability;
mod signal_faults;
mod signals;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix::prelude::*;
use pgcoord::embedded::{test_pg_config, unique_name};
use pgcoord::{Config, ConfigBuilder};
use pgcoord_actors::{LockLost, LockManager, SubscribeLockLost};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio_postgres::Client;

/// Names shared by the managers of one test: its own lock table and channel.
#[derive(Clone)]
pub struct Setup {
    pub pg: tokio_postgres::Config,
    pub table: String,
    pub lease: Duration,
    pub heartbeat: Duration,
}

/// Shows pgcoord's warnings in test output (`RUST_LOG` overrides the level).
pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_test_writer()
        .try_init();
}

impl Setup {
    /// A fresh, migrated lock table with this lease and heartbeat, and an inspecting client.
    pub async fn new(lease: Duration, heartbeat: Duration) -> (Setup, Client) {
        init_tracing();
        let setup = Setup {
            pg: test_pg_config().expect("test database"),
            table: unique_name("locks"),
            lease,
            heartbeat,
        };
        let config = setup.builder("admin").build().unwrap();
        let client = pgcoord::db::connect_spawned(&config).await.unwrap();
        pgcoord::schema::migrate(&client, &config).await.unwrap();
        (setup, client)
    }

    pub fn builder(&self, owner: &str) -> ConfigBuilder {
        Config::builder()
            .pg_config(&self.pg)
            .lock_table(&self.table)
            .payload_table(format!("{}_p", self.table))
            .owner(owner)
            .lease(self.lease)
            .heartbeat(self.heartbeat)
    }

    /// A started manager whose owner identity is `owner`.
    pub fn manager(&self, owner: &str) -> Addr<LockManager> {
        LockManager::new(self.builder(owner).build().unwrap()).start()
    }

    pub fn quoted_table(&self) -> String {
        format!("\"{}\"", self.table)
    }
}

/// Collects the messages of one type it receives.
pub struct Collector<M>(pub Arc<Mutex<Vec<M>>>);

impl<M> Clone for Collector<M> {
    fn clone(&self) -> Self {
        Collector(self.0.clone())
    }
}

impl<M> Default for Collector<M> {
    fn default() -> Self {
        Collector(Arc::default())
    }
}

impl<M: Message<Result = ()> + Unpin + Send + 'static> Actor for Collector<M> {
    type Context = Context<Self>;
    fn started(&mut self, ctx: &mut Context<Self>) {
        ctx.set_mailbox_capacity(100_000);
    }
}

impl<M: Message<Result = ()> + Unpin + Send + 'static> Handler<M> for Collector<M> {
    type Result = ();
    fn handle(&mut self, message: M, _: &mut Context<Self>) {
        self.0.lock().unwrap().push(message);
    }
}

impl<M: Message<Result = ()> + Unpin + Send + Clone + 'static> Collector<M> {
    /// A started collector and its recipient.
    pub fn start_new() -> (Collector<M>, Recipient<M>) {
        let collector = Collector::default();
        let addr = collector.clone().start();
        (collector, addr.recipient())
    }

    pub fn received(&self) -> Vec<M> {
        self.0.lock().unwrap().clone()
    }

    /// Waits until `n` messages arrived, or panics after `within`.
    pub async fn wait_for(&self, n: usize, within: Duration) -> Vec<M> {
        let deadline = std::time::Instant::now() + within;
        loop {
            let received = self.received();
            if received.len() >= n {
                return received;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "got {} of {n} messages",
                received.len()
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

impl Collector<LockLost> {
    /// A started collector subscribed to `manager`.
    pub async fn subscribe(manager: &Addr<LockManager>) -> Collector<LockLost> {
        let (collector, recipient) = Collector::start_new();
        manager.send(SubscribeLockLost(recipient)).await.unwrap();
        collector
    }
}

/// A TCP proxy to the test database that injects network faults into the connections through
/// it:
/// - [`cut`](Proxy::cut) black-holes the connections open so far: it stops forwarding but keeps
///   their sockets open, as a network partition looks to a client. They stay black-holed.
/// - [`reset`](Proxy::reset) aborts them with an RST to both sides, as a crashed middlebox or a
///   rebooted peer does.
/// - [`close`](Proxy::close) closes them cleanly (FIN) on both sides.
/// - [`refuse`](Proxy::refuse) makes new connections fail at once, as when the database is down.
///
/// Connections made after a cut, reset or close pass as usual.
pub struct Proxy {
    pub port: u16,
    conns: Arc<Mutex<Vec<watch::Sender<Mode>>>>,
    refusing: Arc<AtomicBool>,
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
    pub async fn start(pg: &tokio_postgres::Config) -> Proxy {
        let upstream = match pg.get_hosts().first() {
            Some(tokio_postgres::config::Host::Tcp(host)) => {
                format!("{host}:{}", pg.get_ports().first().copied().unwrap_or(5432))
            }
            _ => panic!("the proxy needs a TCP database"),
        };
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let conns: Arc<Mutex<Vec<watch::Sender<Mode>>>> = Arc::default();
        let refusing = Arc::new(AtomicBool::new(false));
        let (all, refuse) = (conns.clone(), refusing.clone());
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                if refuse.load(Ordering::SeqCst) {
                    let _ = client.set_zero_linger();
                    continue;
                }
                // Registered before the upstream connect, so a fault injected meanwhile applies.
                let (mode, rx) = watch::channel(Mode::Forward);
                {
                    let mut all = all.lock().unwrap();
                    all.retain(|conn| !conn.is_closed());
                    all.push(mode);
                }
                let upstream = upstream.clone();
                tokio::spawn(async move {
                    // Database unreachable: the client sees its connection closed.
                    let Ok(server) = TcpStream::connect(&upstream).await else {
                        return;
                    };
                    let (client, server) = (Arc::new(client), Arc::new(server));
                    tokio::spawn(forward(client.clone(), server.clone(), rx.clone()));
                    forward(server, client, rx).await;
                });
            }
        });
        Proxy {
            port,
            conns,
            refusing,
        }
    }

    /// Black-holes every connection open now.
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

    fn set_mode(&self, mode: Mode) {
        for conn in self.conns.lock().unwrap().iter() {
            conn.send_if_modified(|current| {
                let later = *current < mode;
                if later {
                    *current = mode;
                }
                later
            });
        }
    }

    /// Settings for connecting through the proxy (Config::host and ::port append, so they are
    /// built afresh).
    pub fn pg_config(&self, pg: &tokio_postgres::Config) -> tokio_postgres::Config {
        let mut via = tokio_postgres::Config::new();
        via.host("127.0.0.1").port(self.port);
        via.user(pg.get_user().unwrap_or("postgres"));
        via.dbname(pg.get_dbname().unwrap_or("postgres"));
        if let Some(password) = pg.get_password() {
            via.password(password);
        }
        via
    }
}

/// Forwards one direction of a proxied connection, `from` to `to`, obeying its mode. Both
/// directions hold both sockets, which close when both are done.
async fn forward(from: Arc<TcpStream>, to: Arc<TcpStream>, mut mode: watch::Receiver<Mode>) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let current = *mode.borrow_and_update();
        match current {
            Mode::Forward => {}
            Mode::Cut => loop {
                // Keep the sockets open, read nothing, until closed or reset.
                if next_mode(&mut mode).await > Mode::Cut {
                    break;
                }
            },
            Mode::Close => return close(&from, &to, mode).await,
            Mode::Reset => return reset(&from, &to),
        }
        if *mode.borrow() != Mode::Forward {
            continue;
        }
        let n = tokio::select! {
            biased;
            _ = next_mode(&mut mode) => continue,
            read = read_some(&from, &mut buf) => read,
        };
        match n {
            Ok(0) | Err(_) => {
                // End of this direction: pass the FIN on, as the peer's close.
                shutdown_write(&to);
                return;
            }
            // Changed while reading: the chunk is swallowed.
            Ok(_) if *mode.borrow() != Mode::Forward => continue,
            Ok(n) => {
                tokio::select! {
                    biased;
                    _ = next_mode(&mut mode) => continue,
                    written = write_all(&to, &buf[..n]) => if written.is_err() {
                        return;
                    },
                }
            }
        }
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
        let mut buf = vec![0u8; 16 * 1024];
        while let Ok(n) = read_some(from, &mut buf).await {
            if n == 0 {
                break;
            }
        }
    };
    tokio::select! {
        _ = drain => {}
        _ = tokio::time::sleep(Duration::from_secs(10)) => {}
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
    use std::os::fd::AsRawFd;
    // SAFETY: shutdown on a descriptor this proxy owns and keeps open; nothing is freed.
    unsafe { libc::shutdown(socket.as_raw_fd(), libc::SHUT_WR) };
}

async fn read_some(socket: &TcpStream, buf: &mut [u8]) -> std::io::Result<usize> {
    loop {
        socket.readable().await?;
        match socket.try_read(buf) {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            done => return done,
        }
    }
}

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

/// The proxy's faults do what they say: RST, FIN, refusal, and an unreachable database.
#[tokio::test]
async fn proxy_resets_closes_and_refuses() {
    let pg = test_pg_config().expect("test database");
    let proxy = Proxy::start(&pg).await;
    let via = &proxy.pg_config(&pg);
    let connect = || async move {
        let (client, conn) = via.connect(tokio_postgres::NoTls).await?;
        let conn = tokio::spawn(conn);
        let one: i32 = client.query_one("SELECT 1", &[]).await?.get(0);
        assert_eq!(one, 1);
        Ok::<_, tokio_postgres::Error>((client, conn))
    };
    let ended = |conn: tokio::task::JoinHandle<Result<(), tokio_postgres::Error>>| async move {
        tokio::time::timeout(Duration::from_secs(5), conn)
            .await
            .expect("the connection ended")
            .unwrap()
    };

    // Reset: the client reads "connection reset".
    let (client, conn) = connect().await.unwrap();
    proxy.reset();
    let error = ended(conn).await.unwrap_err();
    let io = std::error::Error::source(&error).and_then(|s| s.downcast_ref::<std::io::Error>());
    assert_eq!(
        io.map(std::io::Error::kind),
        Some(std::io::ErrorKind::ConnectionReset),
        "{error:?}"
    );
    assert!(client.query_one("SELECT 1", &[]).await.is_err());

    // Close: the client reads end-of-file; black-holed connections are closed too.
    let (client, conn) = connect().await.unwrap();
    let (cut_client, cut_conn) = connect().await.unwrap();
    proxy.cut();
    let (after_cut, after_cut_conn) = connect().await.unwrap();
    proxy.close();
    for conn in [conn, cut_conn, after_cut_conn] {
        assert!(ended(conn).await.unwrap_err().is_closed());
    }
    assert!(client.is_closed() && cut_client.is_closed() && after_cut.is_closed());

    // Refused while on, passing again when off.
    proxy.refuse(true);
    assert!(connect().await.is_err());
    proxy.refuse(false);
    let (client, _conn) = connect().await.unwrap();
    let two: i32 = client.query_one("SELECT 2", &[]).await.unwrap().get(0);
    assert_eq!(two, 2);

    // An unreachable database fails the connection, and the proxy keeps accepting.
    let closed_port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut nowhere = tokio_postgres::Config::new();
    nowhere.host("127.0.0.1").port(closed_port).user("postgres");
    let dead_end = Proxy::start(&nowhere).await;
    for _ in 0..2 {
        assert!(
            dead_end
                .pg_config(&nowhere)
                .connect(tokio_postgres::NoTls)
                .await
                .is_err()
        );
    }
    TcpStream::connect(("127.0.0.1", dead_end.port))
        .await
        .expect("still accepting");
}
