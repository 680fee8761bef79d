//! Integration tests of the actix runtime against a real PostgreSQL: the shared throwaway
//! cluster, or `DATABASE_URL` when it is set.

mod advisory;
mod lease_contention;
mod lease_guarantees;
mod leases;
mod signal_faults;
mod signals;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix::prelude::*;
use pgcoord::embedded::{test_pg_config, unique_name};
use pgcoord::{Config, ConfigBuilder};
use pgcoord_actors::{LockLost, LockManager, SubscribeLockLost};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
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

/// A TCP proxy to the test database that can black-hole the connections open so far: it stops
/// forwarding but keeps their sockets open, as a network partition looks to a client. Later
/// connections pass.
pub struct Proxy {
    pub port: u16,
    cuts: Arc<Mutex<Vec<Arc<AtomicBool>>>>,
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
        let cuts: Arc<Mutex<Vec<Arc<AtomicBool>>>> = Arc::default();
        let all = cuts.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let server = TcpStream::connect(&upstream).await.unwrap();
                let cut = Arc::new(AtomicBool::new(false));
                all.lock().unwrap().push(cut.clone());
                let (cr, cw) = client.into_split();
                let (sr, sw) = server.into_split();
                tokio::spawn(forward(cr, sw, cut.clone()));
                tokio::spawn(forward(sr, cw, cut));
            }
        });
        Proxy { port, cuts }
    }

    /// Black-holes every connection open now.
    pub fn cut(&self) {
        for cut in self.cuts.lock().unwrap().iter() {
            cut.store(true, Ordering::SeqCst);
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

async fn forward(
    mut from: impl AsyncRead + Unpin,
    mut to: impl AsyncWrite + Unpin,
    cut: Arc<AtomicBool>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    while let Ok(n) = from.read(&mut buf).await {
        if n == 0 {
            break;
        }
        if cut.load(Ordering::SeqCst) {
            // Swallow everything, keep the sockets open.
            std::future::pending::<()>().await;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
}
