//! [`Config`]: everything pgcoord needs to know, validated once, up front. [`ConfigBuilder`]
//! (in `builder`) holds every setting with its default and validates them in `build()`, with the
//! checks in `checks`.

use std::time::Duration;

use crate::error::{Error, ErrorKind, Result};
use crate::ident::{Ident, QualifiedName};
use crate::tls::Tls;

mod builder;
mod checks;
mod connection;
mod dsn;
mod env;
mod merge;
mod passfile;

pub use builder::ConfigBuilder;

/// The longest lock name or owner, in bytes (the columns are `varchar(255)`).
pub const MAX_NAME_BYTES: usize = 255;

/// Suffix of the fencing-token sequence derived from the lock table's name.
pub(crate) const SEQUENCE_SUFFIX: &str = "_rvn";

/// Room the lock table's name leaves for the names derived from it: the sequence, the
/// companion tables (no longer than [`SEQUENCE_SUFFIX`]) and the SQL functions (`_fence`,
/// `_lease`).
pub(crate) const LOCK_SUFFIX_BYTES: usize = 6;

/// pgcoord's SQL functions (migrations/0012_functions.sql): the default table each is named
/// after, and its suffix.
pub(crate) const SQL_FUNCTIONS: &[(&str, &str)] = &[
    ("pgcoord_locks", "_fence"),
    ("pgcoord_locks", "_lease"),
    ("pgcoord_topics", "_append"),
    ("pgcoord_topics", "_read"),
    ("pgcoord_topics", "_ack"),
    ("pgcoord_schedules", "_complete"),
];

/// Room the schedule table's name leaves for its SQL function's suffix (`_complete`).
pub(crate) const SCHEDULE_SUFFIX_BYTES: usize = 9;

/// Suffix of the waiters' table derived from the lock table's name (no longer than
/// [`SEQUENCE_SUFFIX`], for which the lock table's name leaves room).
pub(crate) const QUEUE_SUFFIX: &str = "_wq";

/// Suffix of the rate-limit table derived from the lock table's name (no longer than
/// [`SEQUENCE_SUFFIX`]).
pub(crate) const RATE_SUFFIX: &str = "_rl";

/// Suffix of the resign requests' table derived from the lock table's name (no longer than
/// [`SEQUENCE_SUFFIX`]).
pub(crate) const RESIGN_SUFFIX: &str = "_rr";

/// Suffix of the stored limits' table derived from the lock table's name (no longer than
/// [`SEQUENCE_SUFFIX`]).
pub(crate) const LIMIT_SUFFIX: &str = "_lm";

/// Room the topic table's name leaves for the suffixes of its companions (`_cursors`,
/// `_trimmed`) and SQL functions (`_append`, `_read`, `_ack`).
pub(crate) const TOPIC_SUFFIX_BYTES: usize = 8;

/// A validated configuration. Build one with [`Config::builder`]; cheap to clone.
#[derive(Debug, Clone)]
pub struct Config {
    pub(crate) pg: tokio_postgres::Config,
    pub(crate) owner: String,
    pub(crate) lock_table: QualifiedName,
    pub(crate) lock_sequence: QualifiedName,
    pub(crate) lock_queue: QualifiedName,
    pub(crate) lease_channel: Ident,
    pub(crate) election_channel: Ident,
    /// Where session-bound connections go (the LISTEN connection, advisory sessions, the
    /// heartbeat); the pool's settings unless configured apart.
    pub(crate) session_pg: tokio_postgres::Config,
    /// The TLS connector of the pool's connections.
    pub(crate) tls: Tls,
    /// The TLS connector of session-bound connections.
    pub(crate) session_tls: Tls,
    pub(crate) prepared_statements: bool,
    pub(crate) payload_table: QualifiedName,
    pub(crate) topic_table: QualifiedName,
    pub(crate) schedule_table: QualifiedName,
    pub(crate) lease: Duration,
    pub(crate) heartbeat: Duration,
    pub(crate) ping_interval: Duration,
    pub(crate) ping_timeout: Duration,
    pub(crate) pool_size: u32,
    pub(crate) pool_timeout: Duration,
    pub(crate) pool_idle_timeout: Duration,
    pub(crate) connect_timeout: Duration,
    /// The password file, when a connection needed it and it was ignored for being readable by
    /// others: what a "password missing" then says.
    pub(crate) ignored_passfile: Option<String>,
    pub(crate) statement_timeout: Duration,
    pub(crate) inline_limit: usize,
    pub(crate) unlogged_lock_table: bool,
    pub(crate) poll_only: bool,
    pub(crate) payload_ttl: Duration,
    pub(crate) backoff: crate::backoff::Backoff,
}

impl Config {
    /// A builder with every default set; only the connection must be given.
    pub fn builder() -> ConfigBuilder {
        ConfigBuilder::default()
    }

    /// The connection settings, with pgcoord's application_name, keepalives and connect timeout
    /// applied (on a copy: the caller's value is never changed).
    pub fn pg_config(&self) -> &tokio_postgres::Config {
        &self.pg
    }
    /// The connection settings of session-bound connections (the LISTEN connection, advisory
    /// lock sessions, the heartbeat): the pool's unless set apart with
    /// [`ConfigBuilder::session_dsn`](crate::ConfigBuilder::session_dsn).
    pub fn session_pg_config(&self) -> &tokio_postgres::Config {
        &self.session_pg
    }
    /// The TLS connector of the pool's connections: its mode is the one in force after the
    /// DSN's and the builder's settings. Give it to a bb8-postgres pool meant for
    /// [`Pool::from_bb8`](crate::Pool::from_bb8).
    pub fn tls(&self) -> &Tls {
        &self.tls
    }
    /// The TLS connector of session-bound connections (the pool's unless set apart).
    pub fn session_tls(&self) -> &Tls {
        &self.session_tls
    }
    /// Whether pooled connections keep statements prepared.
    pub fn prepared_statements(&self) -> bool {
        self.prepared_statements
    }
    /// This process's owner identity, stored with every lease it holds.
    pub fn owner(&self) -> &str {
        &self.owner
    }
    /// The lease table.
    pub fn lock_table(&self) -> &QualifiedName {
        &self.lock_table
    }
    /// Whether [`crate::schema::migrate`] creates the lock table `UNLOGGED` (see
    /// [`ConfigBuilder::unlogged_lock_table`](crate::ConfigBuilder::unlogged_lock_table)).
    pub fn unlogged_lock_table(&self) -> bool {
        self.unlogged_lock_table
    }
    /// Whether nothing LISTENs or NOTIFYs (see
    /// [`ConfigBuilder::poll_only`](crate::ConfigBuilder::poll_only)).
    pub fn poll_only(&self) -> bool {
        self.poll_only
    }
    /// The table of lease waiters in line: the lock table's name with `_wq` appended.
    pub fn lock_queue(&self) -> &QualifiedName {
        &self.lock_queue
    }
    /// The fencing-token sequence: the lock table's name with `_rvn` appended.
    pub fn lock_sequence(&self) -> &QualifiedName {
        &self.lock_sequence
    }
    /// The channel on which released leases are announced to waiters.
    pub fn lease_channel(&self) -> &Ident {
        &self.lease_channel
    }
    /// The channel on which elections announce their leaders.
    pub fn election_channel(&self) -> &Ident {
        &self.election_channel
    }
    /// The payload-store table.
    pub fn payload_table(&self) -> &QualifiedName {
        &self.payload_table
    }
    /// The durable topics' table.
    pub fn topic_table(&self) -> &QualifiedName {
        &self.topic_table
    }
    /// The schedules' runs table.
    pub fn schedule_table(&self) -> &QualifiedName {
        &self.schedule_table
    }
    /// The rate limits' table, a row per key: the lock table's name with `_rl` appended.
    pub fn rate_table(&self) -> QualifiedName {
        self.lock_table
            .suffixed(RATE_SUFFIX)
            .expect("room left by the builder")
    }
    /// The elections' resign requests, a row per election: the lock table's name with `_rr`
    /// appended.
    pub fn resign_table(&self) -> QualifiedName {
        self.lock_table
            .suffixed(RESIGN_SUFFIX)
            .expect("room left by the builder")
    }
    /// The stored limits of limited semaphores, a row per semaphore: the lock table's name with
    /// `_lm` appended.
    pub fn limit_table(&self) -> QualifiedName {
        self.lock_table
            .suffixed(LIMIT_SUFFIX)
            .expect("room left by the builder")
    }
    /// The topics' consumer cursors: the topic table's name with `_cursors` appended.
    pub fn topic_cursors(&self) -> QualifiedName {
        self.topic_table
            .suffixed("_cursors")
            .expect("room left by the builder")
    }
    /// The topics' retention marks: the topic table's name with `_trimmed` appended.
    pub fn topic_trimmed(&self) -> QualifiedName {
        self.topic_table
            .suffixed("_trimmed")
            .expect("room left by the builder")
    }
    /// The SQL function named `default` in the migrations (`pgcoord_locks_fence`, …), named
    /// for this configuration: after the table it acts on, as the migrations create it.
    pub(crate) fn sql_function(&self, default: &str) -> QualifiedName {
        let (table, suffix) = SQL_FUNCTIONS
            .iter()
            .find_map(|(table, suffix)| {
                let rest = default.strip_prefix(table)?;
                (rest == *suffix).then_some((*table, *suffix))
            })
            .expect("one of the migrations' functions");
        let table = match table {
            "pgcoord_locks" => &self.lock_table,
            "pgcoord_topics" => &self.topic_table,
            _ => &self.schedule_table,
        };
        table.suffixed(suffix).expect("room left by the builder")
    }
    /// How long a lease lasts on the server's clock after each grant or renewal.
    pub fn lease(&self) -> Duration {
        self.lease
    }
    /// How often held leases are renewed; `None` when automatic heartbeats are off.
    pub fn heartbeat(&self) -> Option<Duration> {
        (!self.heartbeat.is_zero()).then_some(self.heartbeat)
    }
    /// How often a session holding advisory locks is pinged.
    pub fn ping_interval(&self) -> Duration {
        self.ping_interval
    }
    /// How long a ping may stay unanswered before its session counts as lost.
    pub fn ping_timeout(&self) -> Duration {
        self.ping_timeout
    }

    /// The backoff between reconnect attempts (listener) and renewal retries (heartbeat).
    pub fn backoff(&self) -> crate::backoff::Backoff {
        self.backoff
    }
    /// The most connections the pool opens.
    pub fn pool_size(&self) -> u32 {
        self.pool_size
    }
    /// The longest one wait for a pooled connection may last; callers' deadlines and the
    /// statement timeout usually end it first.
    pub fn pool_timeout(&self) -> Duration {
        self.pool_timeout
    }
    /// How long a pooled connection may stay idle before it is closed.
    pub fn pool_idle_timeout(&self) -> Duration {
        self.pool_idle_timeout
    }
    /// How long opening a connection may take, handshake included.
    pub fn connect_timeout(&self) -> Duration {
        self.connect_timeout
    }
    /// The bound of every statement the runtime issues without a caller's deadline (renew,
    /// release, publish, inspect, payload puts and gets), waiting for a connection included.
    pub fn statement_timeout(&self) -> Duration {
        self.statement_timeout
    }
    /// Payloads larger than this many bytes travel through the payload store.
    pub fn inline_limit(&self) -> usize {
        self.inline_limit
    }
    /// How long a stored payload lives.
    pub fn payload_ttl(&self) -> Duration {
        self.payload_ttl
    }
}

/// Checks a lock name or owner: 1 to 255 bytes, no NUL (PostgreSQL text cannot hold one).
pub fn validate_name(what: &str, name: String) -> Result<String> {
    if name.contains('\0') {
        return Err(Error::new(
            ErrorKind::InvalidName,
            format!("{what} {name:?} contains a NUL byte"),
        ));
    }
    if name.is_empty() || name.len() > MAX_NAME_BYTES {
        return Err(Error::new(
            ErrorKind::InvalidName,
            format!(
                "{what} must be 1 to {MAX_NAME_BYTES} bytes, got {} bytes",
                name.len()
            ),
        ));
    }
    Ok(name)
}

fn default_owner() -> String {
    let host = gethostname::gethostname().to_string_lossy().into_owned();
    let suffix = format!(
        "-{}-{:08x}",
        std::process::id(),
        crate::backoff::random_u64() as u32
    );
    let mut host_end = host.len().min(MAX_NAME_BYTES - suffix.len());
    while !host.is_char_boundary(host_end) {
        host_end -= 1;
    }
    format!("{}{suffix}", &host[..host_end])
}
