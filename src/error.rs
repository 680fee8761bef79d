//! The one error type of pgcoord, with kinds callers match on.
//!
//! Every failure is classified once, where it happens: from the SQLSTATE a server sent, from the
//! state of the connection, or from the validation of an input. Callers ask [`Error::kind`] or a
//! predicate such as [`Error::is_unavailable`]; they never match on message strings.

use std::error::Error as StdError;
use std::fmt;
use std::time::Duration;

use tokio_postgres::error::SqlState;

/// A `Result` whose error is pgcoord's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What went wrong, for callers to match on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The lock is held by someone else (fail-if-locked), or the wait for it ended without it.
    /// [`Error::holder`] tells who holds it, when known.
    NotAcquired,
    /// The lock was lost or already released: its row is gone, its fencing token changed, its
    /// deadline passed, or the session holding it ended.
    LockLost,
    /// The lock, row or payload looked up does not exist.
    NotFound,
    /// This process already holds the lock (locks never stack).
    AlreadyHeld,
    /// The object to create already exists.
    AlreadyExists,
    /// A duration is zero or too small for its role (for example a heartbeat longer than half the
    /// lease).
    DurationTooSmall,
    /// A table, schema or channel name is not a valid identifier.
    InvalidIdentifier,
    /// A lock name or owner is empty or longer than 255 bytes.
    InvalidName,
    /// A configuration value other than a duration, name or identifier is invalid.
    InvalidConfig,
    /// A payload is larger than what can be sent.
    PayloadTooLarge,
    /// The operation did not finish before its deadline.
    Timeout,
    /// The database cannot be reached or did not answer in time: connection refused, reset or
    /// closed, server shutting down, a statement past its deadline, no pooled connection before
    /// the deadline. The source says what happened.
    Unavailable,
    /// A TLS handshake failed for a reason that connecting again will not change: the server's
    /// certificate is not signed by a trusted root or is not for the host connected to, or the
    /// server does not offer TLS while `sslmode` requires it. Also the client key that cannot be
    /// used, found when the configuration is built: encrypted without `sslpassword`, a wrong
    /// `sslpassword`, or an encryption pgcoord does not read. The message says which, never
    /// quoting the password.
    Tls,
    /// The server accepts no writes: a hot standby, or `default_transaction_read_only` is on.
    ReadOnly,
    /// The role lacks a privilege a statement needs (SQLSTATE 42501): see OPERATIONS.md's grants
    /// for a service role.
    PermissionDenied,
    /// The server refused to let the role in: a wrong password (SQLSTATE 28P01), a role that
    /// does not exist or that `pg_hba.conf` rejects (28000), or a password the server asked for
    /// and the settings lack. Connecting again will not change it; the message never shows a
    /// password.
    AuthenticationFailed,
    /// The database connected to does not exist (SQLSTATE 3D000): the message names it.
    DatabaseNotFound,
    /// A serialization failure or deadlock persisted through every retry.
    FailedPrecondition,
    /// A remote handler returned an error in a round trip.
    Remote,
    /// A durable topic's retention deleted events after the cursor a read resumed from: they
    /// are gone, and the message names the oldest cursor to resume from
    /// ([`TopicTable::trimmed`](crate::topic::TopicTable::trimmed)). Never a silent jump.
    Compacted,
    /// A topic consumer's cursor is already at or past the event being acknowledged, or a
    /// schedule's tick is already done: it was handled and acknowledged before. Do not commit
    /// its effects again.
    AlreadyAcknowledged,
    /// The server is a PostgreSQL older than pgcoord supports (13): the message names its
    /// version.
    Unsupported,
    /// Anything else; the source says what.
    Other,
}

/// Who holds a lock that could not be acquired, as far as the database said.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct Holder {
    /// The owner identity of the holder.
    pub owner: String,
    /// The holder's fencing token.
    pub token: i64,
    /// How long the holder's lease has left on the server's clock, unless it is renewed.
    pub remaining: Duration,
}

/// The error type of every pgcoord operation.
pub struct Error(Box<Inner>);

struct Inner {
    kind: ErrorKind,
    message: String,
    holder: Option<Holder>,
    source: Option<Box<dyn StdError + Send + Sync>>,
}

impl Error {
    /// An error of `kind` with a message saying what was wrong.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Error {
        Error(Box::new(Inner {
            kind,
            message: message.into(),
            holder: None,
            source: None,
        }))
    }

    /// Attaches the underlying cause.
    pub fn with_source(mut self, source: impl Into<Box<dyn StdError + Send + Sync>>) -> Error {
        self.0.source = Some(source.into());
        self
    }

    /// A [`ErrorKind::NotAcquired`] error naming the current holder, when known.
    pub fn not_acquired(name: &str, holder: Option<Holder>) -> Error {
        let message = match &holder {
            Some(h) => format!(
                "lock {name:?} is held by {:?} (token {}, {:?} left)",
                h.owner, h.token, h.remaining
            ),
            None => format!("lock {name:?} was not acquired"),
        };
        let mut error = Error::new(ErrorKind::NotAcquired, message);
        error.0.holder = holder;
        error
    }

    /// What went wrong.
    pub fn kind(&self) -> ErrorKind {
        self.0.kind
    }

    /// The holder of a lock that could not be acquired, when the database said who it is.
    pub fn holder(&self) -> Option<&Holder> {
        self.0.holder.as_ref()
    }

    /// The SQLSTATE the server sent, when this error came from the server through
    /// tokio-postgres (an error of `pgcoord::sqlx` has its `sqlx::Error` as its source).
    pub fn code(&self) -> Option<&SqlState> {
        // The database error may sit under another pgcoord error (a retry that gave up).
        let source = self.0.source.as_deref()?;
        if let Some(db) = source.downcast_ref::<tokio_postgres::Error>() {
            return db.code();
        }
        source.downcast_ref::<Error>().and_then(Error::code)
    }

    /// True for [`ErrorKind::NotAcquired`].
    pub fn is_not_acquired(&self) -> bool {
        self.kind() == ErrorKind::NotAcquired
    }

    /// True for [`ErrorKind::LockLost`]: the lock was lost or already released.
    pub fn is_lock_lost(&self) -> bool {
        self.kind() == ErrorKind::LockLost
    }

    /// True for [`ErrorKind::NotFound`].
    pub fn is_not_found(&self) -> bool {
        self.kind() == ErrorKind::NotFound
    }

    /// True for [`ErrorKind::Timeout`].
    pub fn is_timeout(&self) -> bool {
        self.kind() == ErrorKind::Timeout
    }

    /// True for [`ErrorKind::Unavailable`]: the database could not be reached.
    pub fn is_unavailable(&self) -> bool {
        self.kind() == ErrorKind::Unavailable
    }

    /// True when the role lacks a privilege ([`ErrorKind::PermissionDenied`]).
    pub fn is_permission_denied(&self) -> bool {
        self.kind() == ErrorKind::PermissionDenied
    }

    /// True when the server refused to let the role in ([`ErrorKind::AuthenticationFailed`]).
    pub fn is_authentication_failed(&self) -> bool {
        self.kind() == ErrorKind::AuthenticationFailed
    }

    /// True when the database connected to does not exist ([`ErrorKind::DatabaseNotFound`]).
    pub fn is_database_not_found(&self) -> bool {
        self.kind() == ErrorKind::DatabaseNotFound
    }

    /// True when the connection a statement ran on failed (closed, reset, terminated by the
    /// server) or never came: the statement's outcome is unknown unless it was never sent.
    pub fn is_connection_failure(&self) -> bool {
        let source = self.0.source.as_deref();
        let from_connection = source
            .and_then(|s| s.downcast_ref::<tokio_postgres::Error>())
            .is_some_and(|e| classify(e) == ErrorKind::Unavailable);
        // sqlx's errors were classified when converted (`crate::sqlx`).
        #[cfg(feature = "sqlx")]
        let from_connection = from_connection
            || (self.kind() == ErrorKind::Unavailable
                && source.is_some_and(|s| s.is::<::sqlx::Error>()));
        from_connection
            || source
                .and_then(|s| s.downcast_ref::<Error>())
                .is_some_and(Error::is_connection_failure)
    }

    /// True when retrying the same statement may succeed: a serialization failure or deadlock.
    pub fn is_retryable(&self) -> bool {
        let retryable = |code: &str| {
            code == SqlState::T_R_SERIALIZATION_FAILURE.code()
                || code == SqlState::T_R_DEADLOCK_DETECTED.code()
        };
        #[cfg(feature = "sqlx")]
        if let Some(code) = sqlx_sqlstate(self) {
            return retryable(code);
        }
        self.code().is_some_and(|c| retryable(c.code()))
    }
}

/// The SQLSTATE of `error`'s `sqlx::Error`, when the server sent one. Here, not in
/// `crate::sqlx`, so that errors depend on no room that depends on them.
#[cfg(feature = "sqlx")]
fn sqlx_sqlstate(error: &Error) -> Option<&str> {
    let source = std::error::Error::source(error)?.downcast_ref::<::sqlx::Error>()?;
    let db = source
        .as_database_error()?
        .try_downcast_ref::<::sqlx::postgres::PgDatabaseError>()?;
    Some(db.code())
}

/// Classifies a database error by its SQLSTATE and the state of the connection.
pub fn classify(error: &tokio_postgres::Error) -> ErrorKind {
    if error.is_closed() {
        return ErrorKind::Unavailable;
    }
    let Some(code) = error.code() else {
        // No SQLSTATE: the failure happened on the client side of the wire. An I/O source means
        // the connection broke; anything else (a type conversion, say) is a plain error.
        let io = error
            .source()
            .is_some_and(|s| s.downcast_ref::<std::io::Error>().is_some());
        return if io {
            ErrorKind::Unavailable
        } else {
            ErrorKind::Other
        };
    };
    classify_sqlstate(code.code())
}

/// The kind of a SQLSTATE the server sent, whichever driver brought it (tokio-postgres here,
/// sqlx in `crate::sqlx`): the one home of the mapping.
pub(crate) fn classify_sqlstate(code: &str) -> ErrorKind {
    match code.get(..2).unwrap_or(code) {
        // connection_exception, operator_intervention (admin_shutdown, crash_shutdown,
        // cannot_connect_now), insufficient_resources (too_many_connections, ...).
        "08" | "53" => ErrorKind::Unavailable,
        "57" if code == SqlState::QUERY_CANCELED.code() => ErrorKind::Timeout,
        "57" => ErrorKind::Unavailable,
        "40" => ErrorKind::FailedPrecondition,
        // invalid_authorization_specification (28000), invalid_password (28P01).
        "28" => ErrorKind::AuthenticationFailed,
        // pgcoord's own, raised by its SQL functions (migrations/0012_functions.sql).
        "PC" => match code {
            "PC001" => ErrorKind::LockLost,
            "PC002" => ErrorKind::NotFound,
            "PC003" => ErrorKind::AlreadyAcknowledged,
            _ => ErrorKind::Other,
        },
        _ if code == SqlState::UNDEFINED_DATABASE.code() => ErrorKind::DatabaseNotFound,
        _ if code == SqlState::LOCK_NOT_AVAILABLE.code() => ErrorKind::Timeout,
        _ if code == SqlState::INSUFFICIENT_PRIVILEGE.code() => ErrorKind::PermissionDenied,
        _ if code == SqlState::UNDEFINED_TABLE.code() => ErrorKind::NotFound,
        _ if code == SqlState::DUPLICATE_TABLE.code() => ErrorKind::AlreadyExists,
        _ => ErrorKind::Other,
    }
}

/// The message of an error the server sent with SQLSTATE `code`: pgcoord's own (`PC…`) say it
/// all, the kind tells them apart; others name their SQLSTATE.
pub(crate) fn server_message(code: &str, message: &str) -> String {
    if code.starts_with("PC") {
        message.to_owned()
    } else {
        format!("database error {code}: {message}")
    }
}

impl From<tokio_postgres::Error> for Error {
    fn from(error: tokio_postgres::Error) -> Error {
        let kind = classify(&error);
        let message = match error.as_db_error() {
            Some(db) => server_message(db.code().code(), db.message()),
            // tokio-postgres's text leaves out the cause ("error communicating with the
            // server"); the operating system's words ("Connection reset by peer") say what
            // happened.
            None => match error.source() {
                Some(cause) => format!("database error: {error}: {cause}"),
                None => format!("database error: {error}"),
            },
        };
        Error::new(kind, message).with_source(error)
    }
}

impl From<bb8::RunError<Error>> for Error {
    fn from(error: bb8::RunError<Error>) -> Error {
        match error {
            bb8::RunError::User(e) => e,
            bb8::RunError::TimedOut => Error::new(
                ErrorKind::Unavailable,
                "timed out waiting for a pooled connection",
            ),
        }
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("Error");
        d.field("kind", &self.0.kind)
            .field("message", &self.0.message);
        if let Some(h) = &self.0.holder {
            d.field("holder", h);
        }
        if let Some(s) = &self.0.source {
            d.field("source", s);
        }
        d.finish()
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0.message)
    }
}

impl StdError for Error {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.0
            .source
            .as_deref()
            .map(|s| s as &(dyn StdError + 'static))
    }
}
