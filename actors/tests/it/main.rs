//! Integration tests of the actix runtime against a real PostgreSQL: the shared throwaway
//! cluster, or `DATABASE_URL` when it is set.

mod adversary;
mod advisory;
mod app_pool;
mod backend_pools;
mod backends;
mod batch_faults;
mod batching;
mod connection_faults;
mod deadlines;
mod doorbell;
mod election;
mod health;
mod idle_connections;
mod lease_contention;
mod lease_guarantees;
mod leases;
mod limits;
mod mail;
mod memory_backend;
mod own_cluster;
mod pgbouncer;
mod poll_only;
mod privileges;
mod rates;
mod reliability;
mod routing;
mod runtime;
mod schedule_faults;
mod schedules;
mod semaphore;
mod shutdown;
mod signal_faults;
mod signals;
mod startup;
mod threaded;
mod tls;
mod topic_appends;
mod topic_retention;
mod topics;
mod unlogged;
mod workers;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix::prelude::*;
use pgcoord::{Config, ConfigBuilder};
use pgcoord_actors::{GetStats, LockLost, LockManager, SubscribeLockLost};
use pgcoord_testkit::{Proxy, test_pg_config, unique_name};
use tokio::net::TcpStream;
use tokio_postgres::Client;

/// Log lines written while it is the thread's subscriber (the actors of an actix test run on
/// the test's thread).
#[derive(Clone, Default)]
pub struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    pub fn lines_containing(&self, needle: &str) -> usize {
        let text = String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned();
        text.lines().filter(|l| l.contains(needle)).count()
    }
}

/// Warnings and errors logged on this thread until the guard drops, captured.
pub fn capture_warnings() -> (Captured, tracing::subscriber::DefaultGuard) {
    let log = Captured::default();
    let writer = log.clone();
    let guard = tracing::subscriber::set_default(
        tracing_subscriber::fmt()
            .with_max_level(tracing::Level::WARN)
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .finish(),
    );
    (log, guard)
}

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
            .topic_table(format!("{}_t", self.table))
            .schedule_table(format!("{}_s", self.table))
            .owner(owner)
            .lease(self.lease)
            .heartbeat(self.heartbeat)
    }

    /// A started manager whose owner identity is `owner`.
    pub fn manager(&self, owner: &str) -> Addr<LockManager> {
        LockManager::new(self.builder(owner).build().unwrap()).start()
    }

    /// A lock manager as [`manager`](Self::manager) makes, and its table read on the same pool.
    pub fn manager_and_table(&self, owner: &str) -> (Addr<LockManager>, Table) {
        let config = self.builder(owner).build().unwrap();
        manager_on_pool(config)
    }

    /// The lock table, read on a pool of its own.
    pub fn table(&self) -> Table {
        Table::new(&self.builder("inspector").build().unwrap())
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
        // Room for bursts from the first message on (`started` runs only once it is polled).
        let addr = Collector::create(|ctx| {
            ctx.set_mailbox_capacity(100_000);
            collector.clone()
        });
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

/// The proxy's faults do what they say: RST, FIN, refusal, and an unreachable database.
#[tokio::test]
async fn proxy_resets_closes_and_refuses() {
    let pg = test_pg_config().expect("test database");
    let proxy = Proxy::start(&pg).await.unwrap();
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
    let dead_end = Proxy::start(&nowhere).await.unwrap();
    for _ in 0..2 {
        assert!(
            dead_end
                .pg_config(&nowhere)
                .connect(tokio_postgres::NoTls)
                .await
                .is_err()
        );
    }
    TcpStream::connect(("127.0.0.1", dead_end.port()))
        .await
        .expect("still accepting");
}

/// A delayed proxy is a slow network: each round trip takes twice the delay more, on
/// connections open before and made after, large results arrive whole and in order, and no
/// delay again is fast.
#[tokio::test]
async fn proxy_delays() {
    let pg = test_pg_config().expect("test database");
    let proxy = Proxy::start(&pg).await.unwrap();
    let via = proxy.pg_config(&pg);
    let connect = || async {
        let (client, conn) = via.connect(tokio_postgres::NoTls).await.unwrap();
        tokio::spawn(conn);
        client
    };
    async fn timed(client: &Client) -> Duration {
        let start = std::time::Instant::now();
        let one: i32 = client.query_one("SELECT 1", &[]).await.unwrap().get(0);
        assert_eq!(one, 1);
        start.elapsed()
    }
    let open = connect().await;
    timed(&open).await;

    let delay = Duration::from_millis(200);
    proxy.delay(delay);
    let later = connect().await;
    for client in [&open, &later] {
        let took = timed(client).await;
        assert!(took >= 2 * delay, "a round trip took {took:?}");
    }
    // A large result, many chunks, whole and in order.
    let text: String = later
        .query_one(
            "SELECT string_agg(i::text, ',') FROM generate_series(1, 200000) i",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let expected: Vec<String> = (1..=200_000).map(|i: i32| i.to_string()).collect();
    assert!(
        text == expected.join(","),
        "the result arrived out of order"
    );

    proxy.delay(Duration::ZERO);
    for client in [&open, &later] {
        let took = timed(client).await;
        assert!(took < delay, "a round trip took {took:?} without delay");
    }
}

/// A subscriber that takes its time per message, on the thread it is started on, with a
/// mailbox of one: what a slow consumer looks like to the listener.
pub struct Slow(pub Duration);

impl Actor for Slow {
    type Context = Context<Self>;
    fn started(&mut self, ctx: &mut Context<Self>) {
        ctx.set_mailbox_capacity(1);
    }
}

impl Handler<pgcoord_actors::Signal> for Slow {
    type Result = ();
    fn handle(&mut self, _: pgcoord_actors::Signal, _: &mut Context<Self>) {
        std::thread::sleep(self.0);
    }
}

/// Waits until `manager`'s lease listener has connected (and told its waiters, if any, to ask
/// again, as it does at every connection): from then on an attempt counted is one a doorbell,
/// a refusal or a poll asked for, not the connection.
pub async fn listening(manager: &Addr<LockManager>) {
    pgcoord_testkit::eventually(Duration::from_secs(10), "the lease listener", async || {
        manager.send(GetStats::new()).await.unwrap().woken_all >= 1
    })
    .await
}

/// Waits until `n` waiters are in line for the lease `name` of `setup`'s table.
pub async fn in_line(setup: &Setup, admin: &Client, name: &str, n: i64) {
    let queue = setup
        .builder("admin")
        .build()
        .unwrap()
        .lock_queue()
        .quoted();
    let sql = format!("SELECT count(*) FROM {queue} WHERE name = $1");
    pgcoord_testkit::eventually(Duration::from_secs(10), "waiters in line", async || {
        admin
            .query_one(&sql, &[&name])
            .await
            .unwrap()
            .get::<_, i64>(0)
            == n
    })
    .await
}

/// A connection LISTENing on `channels`, and what it hears, in commit order, as
/// `"{channel}: {payload}"`.
pub async fn listen_on(
    config: &Config,
    channels: &[&pgcoord::ident::Ident],
) -> (Client, tokio::sync::mpsc::UnboundedReceiver<String>) {
    let (client, mut conn) = pgcoord::__private::connect(config).await.unwrap();
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Some(Ok(m)) = futures_util::future::poll_fn(|cx| conn.poll_message(cx)).await {
            if let tokio_postgres::AsyncMessage::Notification(n) = m {
                let _ = tx.send(format!("{}: {}", n.channel(), n.payload()));
            }
        }
    });
    for channel in channels {
        let listen = format!("LISTEN {}", channel.quoted());
        client.batch_execute(&listen).await.unwrap();
    }
    (client, rx)
}

/// A flood of doorbells, as anyone who can connect may send: NOTIFYs `payload` on `channel` as
/// fast as `client` can for a second, then waits 300 ms for what the flood started. Returns how
/// many were sent, how much `count` (read before and after) grew, and the most it may grow if a
/// flood costs one statement per doorbell gap (50 ms) of the flood and the 300 ms after, plus
/// one under way, one of a tick or poll, and the reader's spare miss (the gap opens at the
/// second ring's read that found nothing).
pub async fn flood(
    client: &Client,
    channel: &str,
    payload: &str,
    mut count: impl AsyncFnMut() -> u64,
) -> (u64, u64, u64) {
    let before = count().await;
    let (started, mut sent) = (std::time::Instant::now(), 0);
    while started.elapsed() < Duration::from_secs(1) {
        let notify = "SELECT pg_notify($1, $2)";
        client.execute(notify, &[&channel, &payload]).await.unwrap();
        sent += 1;
    }
    let lasted = started.elapsed() + Duration::from_millis(300);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let most = lasted.as_millis() as u64 / 50 + 4;
    (sent, count().await - before, most)
}

/// Stops `runner` ([`pgcoord_actors::Shutdown`]: the run in hand finished, the lease released)
/// and reads its final statistics.
async fn stop_schedule(
    runner: &Addr<pgcoord_actors::ScheduleRunner>,
) -> Result<pgcoord_actors::ScheduleStats, MailboxError> {
    runner.send(pgcoord_actors::Shutdown).await?;
    runner.send(GetStats::new()).await
}

/// A lock table read with the core's statements on a pool — what the lock manager answers
/// `Coordinator::get`, `list_prefix` and `limit` with, on its own pool. A test that needs the
/// manager's pool exercised starts the manager on the same pool (`LockManager::with_pool`).
pub struct Table {
    leases: pgcoord::LeaseTable,
    pool: pgcoord::Pool,
}

impl Table {
    /// The table of `config`, on a pool of its own.
    pub fn new(config: &Config) -> Table {
        Table::on(config, pgcoord::Pool::new(config))
    }

    /// The table of `config`, read on `pool`.
    pub fn on(config: &Config, pool: pgcoord::Pool) -> Table {
        Table {
            leases: pgcoord::LeaseTable::new(config),
            pool,
        }
    }

    /// One lock, held or kept; `NotFound` when there is none.
    pub async fn get(&self, name: &str) -> pgcoord::Result<pgcoord::LeaseInfo> {
        self.leases.get(&self.pool.idempotent(None), name).await
    }

    /// Every lock whose name starts with `prefix`.
    pub async fn list_prefix(&self, prefix: &str) -> pgcoord::Result<Vec<pgcoord::LeaseInfo>> {
        self.leases
            .list_prefix(&self.pool.idempotent(None), prefix)
            .await
    }

    /// The stored limit of semaphore `name`.
    pub async fn limit(&self, name: &str) -> pgcoord::Result<Option<u32>> {
        self.leases.limit(&self.pool.idempotent(None), name).await
    }
}

/// A lock manager of `config`, and its table read on the manager's own pool: a read exercises
/// the pool the manager's statements use.
pub fn manager_on_pool(config: Config) -> (Addr<LockManager>, Table) {
    let pool = pgcoord::Pool::new(&config);
    let table = Table::on(&config, pool.clone());
    (LockManager::with_pool(config, pool, None).start(), table)
}
