//! Counting semaphores on leases: `permits` holders of one name at once, each holding one slot —
//! the lease `"{name}#{i}"` for `i` in `0..permits` — with its own fencing token, renewal and
//! loss detection like any lease.

use std::time::Duration;

use tokio_postgres::types::Type;
use tracing::instrument;

use super::{Grant, LeaseOwner, check_name, millis};
use crate::error::{Error, ErrorKind, Result};
use crate::statement::Statements;

/// The most permits a semaphore may have.
pub const MAX_PERMITS: u32 = 10_000;

/// The slot leases of semaphore `name` with `permits` permits. [`ErrorKind::InvalidConfig`] for
/// 0 or more than [`MAX_PERMITS`] permits; [`ErrorKind::InvalidName`] when a slot's name would be
/// empty, contain NUL, or exceed 255 bytes.
pub fn slot_names(name: &str, permits: u32) -> Result<Vec<String>> {
    if permits == 0 || permits > MAX_PERMITS {
        return Err(Error::new(
            ErrorKind::InvalidConfig,
            format!("a semaphore has 1 to {MAX_PERMITS} permits, not {permits}"),
        ));
    }
    check_name(name)?;
    let names: Vec<String> = (0..permits).map(|i| format!("{name}#{i}")).collect();
    check_name(names.last().expect("at least one"))?;
    Ok(names)
}

/// The outcome of one attempt at any slot of a semaphore.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SlotAttempt {
    /// A slot is ours: its lease's name and grant.
    Granted {
        /// The slot's lease name.
        slot: String,
        /// The grant.
        grant: Grant,
    },
    /// Every slot is held (`held` of them, unexpired): wait for a release.
    Full,
    /// Some slot is not held, but none could be taken now (another caller had its row locked,
    /// or took it first): try again shortly.
    Busy,
}

impl LeaseOwner<'_> {
    /// One attempt at any free slot among `slots` (from [`slot_names`], minus those the
    /// caller already holds), for `lease`.
    #[instrument(skip_all, fields(slots = slots.len()), level = "debug")]
    pub async fn try_acquire_any(
        &self,
        client: &(impl Statements + ?Sized),
        slots: &[String],
        lease: Duration,
    ) -> Result<SlotAttempt> {
        let rows = client
            .run(
                &self.table.acquire_any,
                &[
                    (&slots, Type::TEXT_ARRAY),
                    (&self.owner, Type::TEXT),
                    (&millis(lease)?, Type::INT8),
                    (&self.table.sequence, Type::TEXT),
                ],
            )
            .await?;
        if let Some(row) = rows.first() {
            return Ok(SlotAttempt::Granted {
                slot: row.try_get(0)?,
                grant: Grant {
                    token: row.try_get(1)?,
                    data: None,
                },
            });
        }
        let rows = client
            .run(&self.table.count_held, &[(&slots, Type::TEXT_ARRAY)])
            .await?;
        let held: i64 = rows.first().map_or(Ok(0), |r| r.try_get(0))?;
        Ok(if held as usize >= slots.len() {
            SlotAttempt::Full
        } else {
            SlotAttempt::Busy
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slot_names_are_checked_before_any_sql() {
        assert_eq!(
            slot_names("jobs", 3).unwrap(),
            ["jobs#0", "jobs#1", "jobs#2"]
        );
        assert_eq!(
            slot_names("jobs", 0).unwrap_err().kind(),
            ErrorKind::InvalidConfig
        );
        let err = slot_names("jobs", MAX_PERMITS + 1).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidConfig);
        assert_eq!(
            slot_names("", 1).unwrap_err().kind(),
            ErrorKind::InvalidName
        );
        // The name fits, its slots do not.
        let long = "x".repeat(253);
        assert_eq!(
            slot_names(&long, 100).unwrap_err().kind(),
            ErrorKind::InvalidName
        );
    }
}
