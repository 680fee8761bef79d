//! Reaching a lease's holder: a channel per (scope, owner) that the holder listens on, and one
//! statement that reads who holds a lease and NOTIFYs that holder's channel.
//!
//! Reading the holder and then notifying it would be two round trips; here the server computes
//! the channel from the row it reads, so a message to "whoever holds `name` now" costs what a
//! plain NOTIFY does. The row is read by the server's clock: an expired or released lease has
//! no holder and nothing is sent. What the holder does with the message is its own business —
//! it must still check that it holds the lease (the message may arrive after a move).

use tokio_postgres::types::Type;

use super::{LeaseTable, check_name};
use crate::error::Result;
use crate::statement::Statements;

/// Every holder channel starts with this; the rest is 16 hex digits.
pub(super) const HOLDER_CHANNEL_PREFIX: &str = "pgcoord.holder.";

/// The channel the holder `owner` listens on for messages of `scope` sent by
/// [`LeaseTable::notify_holder`]: the prefix and the first 8 bytes of SHA-256 of `scope` and
/// `owner`, in hex, so any names fit NOTIFY's 63 bytes. Put in `scope` everything that must
/// keep two users apart (the lock table, the application's name for what is routed): only
/// equal scopes and owners share a channel.
pub fn holder_channel(scope: &str, owner: &str) -> String {
    use sha2::Digest;
    let digest = sha2::Sha256::new()
        .chain_update(scope.as_bytes())
        .chain_update(owner.as_bytes())
        .finalize();
    let hex: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
    format!("{HOLDER_CHANNEL_PREFIX}{hex}")
}

impl LeaseTable {
    /// Sends `text` to whoever holds `name` now, on its [`holder_channel`] for `scope`, in one
    /// statement (one transaction: delivered after the commit, like any NOTIFY), and answers the
    /// holder's owner — or `None` when nobody holds the lease by the server's clock (nothing
    /// was sent). Not to be retried after an error: the message may have gone.
    pub async fn notify_holder(
        &self,
        client: &(impl Statements + ?Sized),
        name: &str,
        scope: &str,
        text: &str,
    ) -> Result<Option<String>> {
        check_name(name)?;
        self.refuse_poll_only()?;
        let rows = client
            .run(
                &self.notify_holder,
                &[
                    (&name, Type::TEXT),
                    (&scope, Type::TEXT),
                    (&text, Type::TEXT),
                ],
            )
            .await?;
        rows.first()
            .map(|row| row.try_get(0))
            .transpose()
            .map_err(Into::into)
    }

    /// [`notify_holder`](Self::notify_holder) for each `(name, scope, text)`, in one statement
    /// and one transaction (a NOTIFYing commit is serialised database-wide: one for many is
    /// what lets many senders through). Answers each item's holder, in order; `None` where
    /// nobody held the lease (nothing was sent for it). Not to be retried after an error.
    pub async fn notify_holders(
        &self,
        client: &(impl Statements + ?Sized),
        items: &[(&str, &str, &str)],
    ) -> Result<Vec<Option<String>>> {
        self.refuse_poll_only()?;
        for (name, _, _) in items {
            check_name(name)?;
        }
        let names: Vec<&str> = items.iter().map(|i| i.0).collect();
        let scopes: Vec<&str> = items.iter().map(|i| i.1).collect();
        let texts: Vec<&str> = items.iter().map(|i| i.2).collect();
        let rows = client
            .run(
                &self.notify_holders,
                &[
                    (&names, Type::TEXT_ARRAY),
                    (&scopes, Type::TEXT_ARRAY),
                    (&texts, Type::TEXT_ARRAY),
                ],
            )
            .await?;
        rows.iter()
            .map(|row| row.try_get(0).map_err(Into::into))
            .collect()
    }
}

impl LeaseTable {
    /// [`ErrorKind::Unsupported`](crate::ErrorKind::Unsupported) in poll-only mode: a holder is
    /// reached only by a notification.
    fn refuse_poll_only(&self) -> Result<()> {
        if self.poll_only {
            return Err(crate::Error::new(
                crate::ErrorKind::Unsupported,
                "poll-only mode: a lease's holder is reached by NOTIFY, which this configuration turns off",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn channels_fit_notify_and_differ_by_scope_and_owner() {
        let long = "x".repeat(500);
        let a = holder_channel(&long, "host-1");
        assert_eq!(a.len(), HOLDER_CHANNEL_PREFIX.len() + 16);
        assert!(a.len() <= 63);
        assert_ne!(a, holder_channel(&long, "host-2"));
        assert_ne!(holder_channel("a", "o"), holder_channel("b", "o"));
        assert_eq!(holder_channel("p", "o"), holder_channel("p", "o"));
    }
}
