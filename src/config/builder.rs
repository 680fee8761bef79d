//! [`ConfigBuilder`]: every setting with its default; `build()` validates them (see `checks`).

use std::time::Duration;

use super::connection::Connection;
use super::{Config, default_owner, validate_name};
use crate::error::Result;
use crate::tls::SslMode;

/// Builds a [`Config`]. Setters only record; [`ConfigBuilder::build`] validates everything.
pub struct ConfigBuilder {
    pub(super) connection: Connection,
    pub(super) session: Connection,
    pub(super) prepared_statements: bool,
    pub(super) owner: Option<String>,
    pub(super) schema: Option<String>,
    pub(super) lock_table: String,
    pub(super) lease_channel: Option<String>,
    pub(super) election_channel: Option<String>,
    pub(super) payload_table: String,
    pub(super) topic_table: String,
    pub(super) schedule_table: String,
    pub(super) lease: Duration,
    pub(super) heartbeat: Duration,
    pub(super) ping_interval: Duration,
    pub(super) ping_timeout: Duration,
    pub(super) backoff: (Duration, Duration),
    pub(super) pool_size: u32,
    pub(super) pool_timeout: Duration,
    pub(super) pool_idle_timeout: Duration,
    pub(super) application_name: Option<String>,
    pub(super) connect_timeout: Option<Duration>,
    pub(super) statement_timeout: Duration,
    pub(super) tcp_user_timeout: Option<Duration>,
    pub(super) inline_limit: usize,
    pub(super) unlogged_lock_table: bool,
    pub(super) poll_only: bool,
    pub(super) payload_ttl: Duration,
    pub(super) ssl_mode: Option<SslMode>,
    pub(super) ssl_root_cert: Option<String>,
    #[cfg(feature = "tls")]
    pub(super) tls_client_config: Option<std::sync::Arc<rustls::ClientConfig>>,
}

impl Default for ConfigBuilder {
    fn default() -> Self {
        ConfigBuilder {
            connection: Connection::Unset,
            session: Connection::Unset,
            prepared_statements: true,
            owner: None,
            schema: None,
            lock_table: "pgcoord_locks".into(),
            lease_channel: None,
            election_channel: None,
            payload_table: "pgcoord_payloads".into(),
            topic_table: "pgcoord_topics".into(),
            schedule_table: "pgcoord_schedules".into(),
            lease: Duration::from_secs(20),
            heartbeat: Duration::from_secs(5),
            ping_interval: Duration::from_secs(15),
            ping_timeout: Duration::from_secs(5),
            backoff: (Duration::from_millis(5), Duration::from_millis(500)),
            pool_size: 10,
            pool_timeout: Duration::from_secs(30),
            pool_idle_timeout: Duration::from_secs(60),
            application_name: None,
            connect_timeout: None,
            statement_timeout: Duration::from_secs(5),
            tcp_user_timeout: None,
            inline_limit: 4096,
            unlogged_lock_table: false,
            poll_only: false,
            payload_ttl: Duration::from_secs(3600),
            ssl_mode: None,
            ssl_root_cert: None,
            #[cfg(feature = "tls")]
            tls_client_config: None,
        }
    }
}

impl ConfigBuilder {
    /// Connect with a libpq-style DSN (`host=… user=…` or `postgres://…`). What it leaves out
    /// comes from the `PG*` variables, then the password from the password file (`PGPASSFILE`,
    /// else `~/.pgpass`), as libpq fills it (docs/OPERATIONS.md, "Connecting"). No default: a
    /// DSN or [`pg_config`](Self::pg_config) is required. A malformed one is
    /// [`ErrorKind::InvalidConfig`](crate::ErrorKind::InvalidConfig) from `build()`, naming
    /// what is wrong but never quoting the password (nor an unknown option's name, when the DSN
    /// has a password it may be part of). A client key (`sslkey`) encrypted as PKCS#8 is
    /// decrypted with `sslpassword`; one that cannot be is [`ErrorKind::Tls`](crate::ErrorKind::Tls)
    /// from `build()`, saying why.
    pub fn dsn(mut self, dsn: impl Into<String>) -> Self {
        self.connection = Connection::Dsn(dsn.into());
        self
    }

    /// Connect as the environment says, as libpq would: `DATABASE_URL` when it is set, else
    /// the `PG*` variables alone, each completed as a [`dsn`](Self::dsn) is.
    /// [`ErrorKind::InvalidConfig`](crate::ErrorKind::InvalidConfig) when the environment names
    /// no database.
    pub fn dsn_from_env(self) -> Result<Self> {
        Ok(self.dsn(super::env::dsn_from_env()?))
    }

    /// Connect with a `tokio_postgres::Config`, taken as it is (the environment does not
    /// complete it). pgcoord copies it; the caller's value is not changed.
    pub fn pg_config(mut self, config: &tokio_postgres::Config) -> Self {
        self.connection = Connection::Pg(Box::new(config.clone()));
        self
    }

    /// A separate server for the connections that hold session state — the LISTEN connection,
    /// advisory lock sessions, the heartbeat — as a DSN. Use it when the pool's connection goes
    /// through a pooler in transaction mode (PgBouncer), which cannot keep a LISTEN or a session
    /// lock: point this one at the database directly. Default: the pool's connection settings.
    pub fn session_dsn(mut self, dsn: impl Into<String>) -> Self {
        self.session = Connection::Dsn(dsn.into());
        self
    }

    /// [`session_dsn`](Self::session_dsn) as a `tokio_postgres::Config` (copied).
    pub fn session_pg_config(mut self, config: &tokio_postgres::Config) -> Self {
        self.session = Connection::Pg(Box::new(config.clone()));
        self
    }

    /// Whether connections encrypt and what they verify, for the pool's and the sessions'
    /// connections alike, over what their DSNs say. Default: the DSN's `sslmode`, else
    /// [`SslMode::Prefer`] (as libpq), or [`SslMode::VerifyFull`] with the system's root
    /// certificates, or [`SslMode::Require`] with a [`tls_client_config`](Self::tls_client_config).
    /// Modes other than `disable` and `prefer` need the `tls` feature (on by default).
    pub fn ssl_mode(mut self, mode: SslMode) -> Self {
        self.ssl_mode = Some(mode);
        self
    }

    /// The trusted root certificates for [`SslMode::VerifyCa`] and [`SslMode::VerifyFull`]: a PEM
    /// file, or `"system"` for the operating system's store (as libpq's `sslrootcert`). With a
    /// file, `require` verifies like `verify-ca`, as libpq does. Default: the DSN's
    /// `sslrootcert`, else `~/.postgresql/root.crt` when it exists, else the system's store.
    pub fn ssl_root_cert(mut self, root_cert: impl Into<String>) -> Self {
        self.ssl_root_cert = Some(root_cert.into());
        self
    }

    /// A rustls configuration of the caller's, for what the settings above do not cover
    /// (client certificates, certificate revocation, pinned keys): connections verify as it
    /// says, whatever the mode, which then only decides whether TLS is asked for and required.
    /// Default: none (pgcoord builds one from the mode and root certificates).
    #[cfg(feature = "tls")]
    pub fn tls_client_config(mut self, config: rustls::ClientConfig) -> Self {
        self.tls_client_config = Some(std::sync::Arc::new(config));
        self
    }

    /// Whether pooled connections keep pgcoord's statements prepared (named prepared
    /// statements). Turn it off when the pool goes through a pooler in transaction mode that
    /// does not track prepared statements (PgBouncer before 1.21): statements then go out
    /// unnamed (`query_typed`), one round trip each. Default: true.
    pub fn prepared_statements(mut self, prepared: bool) -> Self {
        self.prepared_statements = prepared;
        self
    }

    /// The owner identity stored with every lease this process holds; at most 255 bytes and
    /// unique per lock manager. Default: host name, process id and a random suffix.
    pub fn owner(mut self, owner: impl Into<String>) -> Self {
        self.owner = Some(owner.into());
        self
    }

    /// The schema of pgcoord's tables when their names are not qualified. Default: none, so
    /// `search_path` decides (usually `public`).
    pub fn schema(mut self, schema: impl Into<String>) -> Self {
        self.schema = Some(schema.into());
        self
    }

    /// The lease table, `name` or `schema.name`; its sequence and SQL functions are named after
    /// it (`_rvn`, `_fence` and `_lease` appended), so the name part is at most 57 bytes.
    /// Default: `pgcoord_locks`.
    pub fn lock_table(mut self, table: impl Into<String>) -> Self {
        self.lock_table = table.into();
        self
    }

    /// The channel that announces released leases to waiters. Default: the lock table's
    /// unqualified name. Give each lock table of a database a channel of its own (tables of one
    /// name in two schemas share the default): on a shared channel each table's releases wake
    /// the other's waiters for nothing.
    pub fn lease_channel(mut self, channel: impl Into<String>) -> Self {
        self.lease_channel = Some(channel.into());
        self
    }

    /// The channel on which elections announce their leaders (see `pgcoord::election`). Default:
    /// the lock table's unqualified name with `_ldr` appended.
    pub fn election_channel(mut self, channel: impl Into<String>) -> Self {
        self.election_channel = Some(channel.into());
        self
    }

    /// The payload-store table, `name` or `schema.name`. Default: `pgcoord_payloads`.
    pub fn payload_table(mut self, table: impl Into<String>) -> Self {
        self.payload_table = table.into();
        self
    }

    /// The durable topics' table, `name` or `schema.name` (see [`crate::topic`]); its cursors
    /// and retention marks are in the tables named with `_cursors` and `_trimmed` appended (its
    /// SQL functions `_append`, `_read`, `_ack`), so the name part is at most 55 bytes.
    /// Default: `pgcoord_topics`.
    pub fn topic_table(mut self, table: impl Into<String>) -> Self {
        self.topic_table = table.into();
        self
    }

    /// The schedules' runs table, `name` or `schema.name` (see [`crate::schedule`]): a row per
    /// tick started; its SQL function is named with `_complete` appended, so the name part is at
    /// most 54 bytes. Default: `pgcoord_schedules`.
    pub fn schedule_table(mut self, table: impl Into<String>) -> Self {
        self.schedule_table = table.into();
        self
    }

    /// How long a lease lasts on the server's clock after each grant or renewal; whole
    /// milliseconds, at least 1 ms. Default: 20 s.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// How often held leases are renewed; at most half the lease, or zero to turn automatic
    /// heartbeats off. Default: 5 s.
    pub fn heartbeat(mut self, heartbeat: Duration) -> Self {
        self.heartbeat = heartbeat;
        self
    }

    /// How often a session holding advisory locks is pinged. Default: 15 s.
    pub fn ping_interval(mut self, interval: Duration) -> Self {
        self.ping_interval = interval;
        self
    }

    /// How long a ping may stay unanswered before its session counts as lost. Default: 5 s.
    pub fn ping_timeout(mut self, timeout: Duration) -> Self {
        self.ping_timeout = timeout;
        self
    }

    /// The jittered backoff between reconnect attempts of the listener and between retries of a
    /// failed renewal: a random delay up to `initial` × 2^attempt, at most `max`. Renewal retries
    /// are also capped by the heartbeat. Both must be at least 1 ms and `initial` ≤ `max`.
    /// Default: 5 ms, at most 500 ms (back within half a second of the server).
    pub fn backoff(mut self, initial: Duration, max: Duration) -> Self {
        self.backoff = (initial, max);
        self
    }

    /// The most connections the pool opens (dedicated connections are not counted). Default: 10.
    pub fn pool_size(mut self, size: u32) -> Self {
        self.pool_size = size;
        self
    }

    /// The longest one wait for a free pooled connection may last (the pool busy, or the server
    /// unreachable); past it, [`ErrorKind::Unavailable`](crate::ErrorKind::Unavailable). It does
    /// not bound a statement on a connection that hangs: the
    /// [statement timeout](Self::statement_timeout) or the caller's deadline does. A call with a
    /// deadline (`Acquire::timeout`) answers within it whatever these two are. Default: 30 s.
    pub fn pool_timeout(mut self, timeout: Duration) -> Self {
        self.pool_timeout = timeout;
        self
    }

    /// How long a pooled connection may stay idle before it is closed, so that a process at rest
    /// holds two connections (the listener and the heartbeat's, plus one per advisory lock
    /// held). Checked every `min(this, 30 s)`. Default: 60 s.
    pub fn pool_idle_timeout(mut self, timeout: Duration) -> Self {
        self.pool_idle_timeout = timeout;
        self
    }

    /// The application_name of every connection, so its sessions can be found in
    /// `pg_stat_activity`. Default: the one in the connection settings, else `pgcoord`.
    pub fn application_name(mut self, name: impl Into<String>) -> Self {
        self.application_name = Some(name.into());
        self
    }

    /// How long opening a connection may take, the whole handshake included (tokio-postgres
    /// alone bounds only the TCP connect). Default: the connection settings' own (a DSN's), else
    /// `PGCONNECT_TIMEOUT`'s, else 5 s: this comes after a DSN's and before the variable's.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = Some(timeout);
        self
    }

    /// The bound of every statement the runtime issues on its own or for a caller without a
    /// deadline: renewals (further bounded by the time left on the held leases), releases,
    /// publishes, inspection, payload puts and gets. A statement past it is cancelled on the
    /// server and its connection closed. Default: 5 s.
    pub fn statement_timeout(mut self, timeout: Duration) -> Self {
        self.statement_timeout = timeout;
        self
    }

    /// How long sent data may stay unacknowledged before the kernel drops a connection
    /// (`TCP_USER_TIMEOUT`): what notices a half-open connection while a statement is in flight,
    /// when keepalives are silent. Default: half the lease, between 1 s and 30 s; keepalives
    /// start after a quarter of the lease (1 s to 30 s) and probe 3 times.
    pub fn tcp_user_timeout(mut self, timeout: Duration) -> Self {
        self.tcp_user_timeout = Some(timeout);
        self
    }

    /// Create the lock table `UNLOGGED` (as River keeps its leader table): a grant, renewal or
    /// release writes no WAL, so it costs no WAL flush — about twice the lease throughput
    /// where commits are durable (docs/BENCHMARKS.md). The price is exact: after a server
    /// crash (an immediate shutdown included) and on a promoted standby the table is empty, so
    /// every lease is gone at once. Holders learn it at their next renewal (`TakenOver`) —
    /// before their own deadline — and fencing tokens still only increase (the
    /// token sequence stays logged). Choose it when losing every lease on a crash or failover
    /// is acceptable (leader election, work that is safe to restart), not when a lease guards
    /// state that must survive one. Read by `schema::migrate` when it creates the table; an
    /// existing table is switched with `schema::set_lock_table_unlogged`. Default: false.
    pub fn unlogged_lock_table(mut self, unlogged: bool) -> Self {
        self.unlogged_lock_table = unlogged;
        self
    }

    /// Poll-only mode (River's `PollOnly`): no LISTEN and no NOTIFY at all. Lease, permit and
    /// election waiters look again every quarter lease, at most every second (a handoff takes
    /// up to that long); durable topic consumers poll at their `poll`; no statement pgcoord runs
    /// sends a notification, so none takes PostgreSQL's database-wide commit lock for NOTIFY.
    /// Plain signals (publish, subscribe, request/reply) and routing by key need LISTEN and are
    /// refused with [`ErrorKind::Unsupported`](crate::ErrorKind::Unsupported). For a
    /// transaction-mode pooler without a session DSN, or a server where NOTIFY is unwelcome.
    /// Every process on a table must agree: a poll-only process's release wakes nobody, so a
    /// listening process waiting for it waits its own poll. Default: false.
    pub fn poll_only(mut self, poll_only: bool) -> Self {
        self.poll_only = poll_only;
        self
    }

    /// Payloads larger than this many bytes go to the payload store and only their key travels;
    /// smaller ones still go to the store when their encoded envelope would reach PostgreSQL's
    /// 8,000-byte limit. Default: 4,096.
    pub fn inline_limit(mut self, bytes: usize) -> Self {
        self.inline_limit = bytes;
        self
    }

    /// How long a stored payload lives before `delete_expired` may remove it. Default: 1 h.
    pub fn payload_ttl(mut self, ttl: Duration) -> Self {
        self.payload_ttl = ttl;
        self
    }

    /// Validates every value and returns the configuration, or the first error found.
    pub fn build(mut self) -> Result<Config> {
        // Checked in this order, so the first error found does not depend on how it is split.
        let connections = self.connections(&super::env::var)?;
        let owner = match self.owner.take() {
            Some(owner) => validate_name("owner", owner)?,
            None => default_owner(),
        };
        let names = self.names()?;
        self.check_values(connections.connect_timeout)?;
        let (initial, max) = self.backoff;
        Ok(Config {
            pg: connections.pg,
            owner,
            lock_table: names.lock_table,
            lock_sequence: names.lock_sequence,
            lock_queue: names.lock_queue,
            lease_channel: names.lease_channel,
            election_channel: names.election_channel,
            session_pg: connections.session_pg,
            tls: connections.tls,
            session_tls: connections.session_tls,
            prepared_statements: self.prepared_statements,
            payload_table: names.payload_table,
            topic_table: names.topic_table,
            schedule_table: names.schedule_table,
            lease: self.lease,
            heartbeat: self.heartbeat,
            ping_interval: self.ping_interval,
            ping_timeout: self.ping_timeout,
            pool_size: self.pool_size,
            pool_timeout: self.pool_timeout,
            pool_idle_timeout: self.pool_idle_timeout,
            connect_timeout: connections.connect_timeout,
            ignored_passfile: connections.ignored_passfile,
            statement_timeout: self.statement_timeout,
            inline_limit: self.inline_limit,
            unlogged_lock_table: self.unlogged_lock_table,
            poll_only: self.poll_only,
            payload_ttl: self.payload_ttl,
            backoff: crate::backoff::Backoff::new(initial, max),
        })
    }
}
