//! Leader election on leases: the leader of an election is the holder of the lease of the same
//! name, its term is the lease's tenure and its fencing token, and what it proclaims (an address,
//! an id) is the lease's data. What this module adds is the announcement: every proclamation is
//! broadcast on the election channel ([`crate::Config::election_channel`]) in the same
//! transaction that stores it, so observers learn of each new leader and each new value in
//! commit order. Terms that end are announced on the lease channel
//! ([`Released`](crate::lease::Released)); a leader that stops renewing is noticed at its expiry
//! by whoever watches the clock (the runtime's observer does).

use serde::{Deserialize, Serialize};
use tokio_postgres::types::Type;
use tracing::instrument;

use crate::error::{Error, ErrorKind, Result};
use crate::lease::{LeaseOwner, LeaseTable, check_name};
use crate::signal::{Envelope, Kind};
use crate::statement::Statements;

/// A leader as announced on the election channel: sent as the MessagePack payload of an event
/// envelope, so any listener can read it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Proclamation {
    /// The election (the lease's name).
    pub election: String,
    /// The leader's owner identity.
    pub owner: String,
    /// The leader's fencing token: it orders terms.
    pub token: i64,
    /// What the leader proclaims (the lease's data).
    #[serde(with = "serde_bytes")]
    pub value: Vec<u8>,
}

impl Proclamation {
    /// Reads a proclamation from an event's payload.
    pub fn from_payload(payload: &[u8]) -> Result<Proclamation> {
        crate::signal::from_payload(payload)
    }
}

impl LeaseOwner<'_> {
    /// Stores `value` as the data of `election`'s lease while this owner holds it with `token`,
    /// and announces the owner as its leader with that value, in one statement. [`ErrorKind::LockLost`]
    /// when the lease is no longer held with `token`; [`ErrorKind::PayloadTooLarge`] when the
    /// announcement would not fit in a notification (values are meant to be small: an address,
    /// an id), before anything is sent.
    #[instrument(skip(self, client, value), fields(bytes = value.len()), level = "debug")]
    pub async fn proclaim(
        &self,
        client: &(impl Statements + ?Sized),
        election: &str,
        token: i64,
        value: &[u8],
    ) -> Result<()> {
        check_name(election)?;
        let proclamation = Proclamation {
            election: election.to_owned(),
            owner: self.owner.to_owned(),
            token,
            value: value.to_vec(),
        };
        let text =
            Envelope::new(Kind::Event, crate::signal::to_payload(&proclamation)?).encode()?;
        let rows = client
            .run(
                &self.table.proclaim,
                &[
                    (&election, Type::TEXT),
                    (&token, Type::INT8),
                    (&value, Type::BYTEA),
                    (&self.table.election_channel, Type::TEXT),
                    (&text, Type::TEXT),
                    (&self.owner, Type::TEXT),
                ],
            )
            .await?;
        if rows.is_empty() {
            return Err(Error::new(
                ErrorKind::LockLost,
                format!("election {election:?} is no longer led with token {token}"),
            ));
        }
        Ok(())
    }
}

impl LeaseOwner<'_> {
    /// Whether the term of `election` held with `token` was asked to step down
    /// ([`LeaseTable::request_resign`]). A request for an earlier term never matches a later
    /// one: tokens only grow.
    pub async fn resign_requested(
        &self,
        client: &(impl Statements + ?Sized),
        election: &str,
        token: i64,
    ) -> Result<bool> {
        check_name(election)?;
        let params: &[crate::statement::Param<'_>] =
            &[(&election, Type::TEXT), (&token, Type::INT8)];
        let rows = client.run(&self.table.resign_requested, params).await?;
        Ok(rows
            .first()
            .map(|r| r.try_get(0))
            .transpose()?
            .unwrap_or(false))
    }
}

impl LeaseTable {
    /// Asks the leader of `election` to step down, as `requested_by` (a name for the record):
    /// stores a request for the term holding the lease now, which its leader finds at its next
    /// look and honours by resigning when its work is done. The term asked (its token), or `None`
    /// when no one leads. Not a release: the lease stays held until its leader lets it go.
    #[instrument(skip(self, client), level = "debug")]
    pub async fn request_resign(
        &self,
        client: &(impl Statements + ?Sized),
        election: &str,
        requested_by: &str,
    ) -> Result<Option<i64>> {
        check_name(election)?;
        check_name(requested_by)?;
        let params: &[crate::statement::Param<'_>] =
            &[(&election, Type::TEXT), (&requested_by, Type::TEXT)];
        let rows = client.run(&self.request_resign, params).await?;
        rows.first()
            .map(|r| r.try_get(0))
            .transpose()
            .map_err(Into::into)
    }

    /// The channel on which [`LeaseOwner::proclaim`] announces leaders.
    pub fn election_channel(&self) -> &str {
        &self.election_channel
    }
}
