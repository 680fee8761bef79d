//! [`Health`]: what a readiness endpoint asks of a process's pgcoord — the listener connected,
//! the heartbeat renewing, the database answering — within a bound of the caller's.

use std::time::Duration;

use pgcoord::Statements;

use crate::Coordinator;
use crate::stats::GetStats;
use crate::{ListenerStats, ManagerStats};

/// What [`Coordinator::health`] found. Ready when every part is. Serialises (serde) with
/// `ready` beside its parts.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Health {
    /// The listener is connected with every LISTEN confirmed; false also when it did not answer
    /// in time. True in poll-only mode, where nothing listens.
    pub listening: bool,
    /// Heartbeat renewals failed in a row now (leases held are renewed late, and lost at their
    /// deadline if it goes on); `None` when the lock manager did not answer in time.
    pub renewals_failing: Option<u32>,
    /// Why a pooled connection did not answer `SELECT 1` in time, if it did not.
    pub database: Option<String>,
}

// Serialised with `ready` beside the parts, for a readiness endpoint's JSON body.
impl serde::Serialize for Health {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut health = serializer.serialize_struct("Health", 4)?;
        health.serialize_field("ready", &self.is_ready())?;
        health.serialize_field("listening", &self.listening)?;
        health.serialize_field("renewals_failing", &self.renewals_failing)?;
        health.serialize_field("database", &self.database)?;
        health.end()
    }
}

impl Health {
    /// Every part is well: listening, renewing, the database answering.
    pub fn is_ready(&self) -> bool {
        self.listening && self.renewals_failing == Some(0) && self.database.is_none()
    }
}

impl Coordinator {
    /// Asks the listener, the lock manager and the database at once, and answers within
    /// `within` whatever the connections do: a part that did not answer in time is not well.
    /// For readiness endpoints (`examples/axum`): a process whose pgcoord is not ready cannot
    /// hear signals, or may lose its leases.
    pub async fn health(&self, within: Duration) -> Health {
        let Some(actors) = self.door.postgres() else {
            // In memory nothing can fail: there is no connection, no heartbeat, no database
            // (a forced reconnect included: it is only told to subscribers).
            return Health {
                listening: true,
                renewals_failing: Some(0),
                database: None,
            };
        };
        let deadline = tokio::time::Instant::now() + within;
        let listener = tokio::time::timeout_at(deadline, actors.signals.send(GetStats::new()));
        let manager = tokio::time::timeout_at(deadline, actors.locks.send(GetStats::new()));
        let pool = actors.pool.clone();
        let database = async move {
            let statements = pool.idempotent(Some(deadline.into_std()));
            match tokio::time::timeout_at(deadline, statements.run("SELECT 1", &[])).await {
                Ok(Ok(_)) => None,
                Ok(Err(e)) => Some(e.to_string()),
                Err(_) => Some(format!("no answer within {within:?}")),
            }
        };
        let (listener, manager, database) = tokio::join!(listener, manager, database);
        let listener: Option<ListenerStats> = listener.ok().and_then(Result::ok);
        let manager: Option<ManagerStats> = manager.ok().and_then(Result::ok);
        Health {
            listening: actors.config.poll_only() || listener.is_some_and(|l| l.listening),
            renewals_failing: manager.map(|m| m.renewals_failing),
            database,
        }
    }
}
