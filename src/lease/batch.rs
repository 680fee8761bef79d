//! [`AcquireRequest`], and the batched attempt: one statement for many first attempts of one
//! owner (group commit).

use std::collections::HashMap;
use std::time::Duration;

use tokio_postgres::types::Type;
use tracing::instrument;

use super::{Grant, LeaseOwner, check_name, millis};
use crate::error::{Error, ErrorKind, Result};
use crate::statement::Statements;

/// One acquire attempt, alone or in a batch: the name, the data to store, and whether it
/// replaces the data a kept row holds.
#[derive(Debug, Clone, Copy)]
pub struct AcquireRequest<'a> {
    /// The lease's name.
    pub name: &'a str,
    /// Data to store with the grant.
    pub data: Option<&'a [u8]>,
    /// Replace data a kept row holds, instead of keeping it.
    pub replace_data: bool,
    /// The priority of the attempt's place in the waiters' line, when it takes one
    /// ([`LeaseOwner::try_acquire_or_queue`]): the line is ordered by it, higher first, then
    /// by arrival. Default 0.
    pub priority: i32,
}

impl<'a> AcquireRequest<'a> {
    /// An attempt at `name` with no data to store (`data: None`, `replace_data: false`).
    pub fn new(name: &'a str) -> AcquireRequest<'a> {
        AcquireRequest {
            name,
            data: None,
            replace_data: false,
            priority: 0,
        }
    }

    /// The data to store with the grant; a kept row's data wins unless
    /// [`replace_data`](Self::replace_data).
    pub fn data(self, data: &'a [u8]) -> AcquireRequest<'a> {
        AcquireRequest {
            data: Some(data),
            ..self
        }
    }

    /// Replaces the data of a kept row instead of keeping it.
    pub fn replace_data(self) -> AcquireRequest<'a> {
        AcquireRequest {
            replace_data: true,
            ..self
        }
    }

    /// Takes a place in line with `priority`: higher goes first, then arrival order.
    pub fn priority(self, priority: i32) -> AcquireRequest<'a> {
        AcquireRequest { priority, ..self }
    }
}

/// The most names one batch statement may ask for. Each takes its grant lock, a transaction advisory
/// lock held until the statement commits, in the server's shared lock table, which holds about
/// `max_locks_per_transaction` (64 by default) locks per connection: 32 leave room for the
/// statement's other locks, so batches cannot fill the table whatever runs at once.
pub const MAX_NAMES_PER_STATEMENT: usize = 32;

impl LeaseOwner<'_> {
    /// One attempt at each of `requests` (distinct names, at most
    /// [`MAX_NAMES_PER_STATEMENT`]), in one statement, with the conditions of
    /// [`try_acquire`](Self::try_acquire). Returns the grants by name; a name missing from the
    /// map was not granted — held by someone, another waiter first in line, its row locked by
    /// another transaction or its grant lock held by another grant statement (neither waited for) —
    /// and its caller asks again alone to learn which. [`ErrorKind::InvalidConfig`] for more
    /// names, before any SQL.
    #[instrument(skip_all, fields(requests = requests.len()), level = "debug")]
    pub async fn try_acquire_many(
        &self,
        client: &(impl Statements + ?Sized),
        requests: &[AcquireRequest<'_>],
        lease: Duration,
    ) -> Result<HashMap<String, Grant>> {
        if requests.len() > MAX_NAMES_PER_STATEMENT {
            return Err(Error::new(
                ErrorKind::InvalidConfig,
                format!(
                    "a batch acquire asks for at most {MAX_NAMES_PER_STATEMENT} names, not {}",
                    requests.len()
                ),
            ));
        }
        let mut names = Vec::with_capacity(requests.len());
        let mut data = Vec::with_capacity(requests.len());
        let mut replace = Vec::with_capacity(requests.len());
        for request in requests {
            check_name(request.name)?;
            names.push(request.name);
            data.push(request.data);
            replace.push(request.replace_data);
        }
        let rows = client
            .run(
                &self.table.acquire_many,
                &[
                    (&names, Type::TEXT_ARRAY),
                    (&data, Type::BYTEA_ARRAY),
                    (&replace, Type::BOOL_ARRAY),
                    (&self.owner, Type::TEXT),
                    (&millis(lease)?, Type::INT8),
                    (&self.table.sequence, Type::TEXT),
                ],
            )
            .await?;
        rows.iter()
            .map(|row| {
                Ok((
                    row.try_get(0)?,
                    Grant {
                        token: row.try_get(1)?,
                        data: row.try_get(2)?,
                    },
                ))
            })
            .collect()
    }
}
