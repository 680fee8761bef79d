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

impl LeaseTable {
    /// The channel on which [`LeaseOwner::proclaim`] announces leaders.
    pub fn election_channel(&self) -> &str {
        &self.election_channel
    }
}
