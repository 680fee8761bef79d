//! Releasing leases, alone or many in one statement, and the announcement each release makes on
//! the lease channel.

use std::collections::HashSet;

use tokio_postgres::types::Type;
use tracing::instrument;

use super::{LeaseOwner, check_name};
use crate::error::{Error, ErrorKind, Result};
use crate::statement::{Param, Statements};

/// A release (or the first waiter leaving the line) as announced on the lease channel
/// ([`LeaseTable::channel`](super::LeaseTable::channel)): a doorbell, never a grant.
///
/// The payload is the name's length in bytes, a colon, the name, then the waiter first in line,
/// if any: `3:jobworker-7` announces that `job` is free and that `worker-7` is first in line
/// (only it may take it); `3:job` that it is free for anyone. Any name and owner can be written
/// this way (neither may contain NUL, which a payload cannot carry), so other languages can read
/// it too.
///
/// An announcement proves nothing: it may arrive late, never, or from anyone who can NOTIFY the
/// channel. It only says whose attempt may now succeed; the attempt decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Released<'a> {
    /// The lock's name.
    pub name: &'a str,
    /// The waiter first in line, the only one the next grant may go to; `None` when anyone may
    /// take it.
    pub first_in_line: Option<&'a str>,
}

impl<'a> Released<'a> {
    /// Reads an announcement; `None` when `payload` is not one (sent by hand, say).
    pub fn parse(payload: &'a str) -> Option<Released<'a>> {
        let digits = payload.bytes().take_while(u8::is_ascii_digit).count();
        let length: usize = payload[..digits].parse().ok()?;
        let rest = payload[digits..].strip_prefix(':')?;
        // `get` refuses a length past the end or inside a multi-byte character.
        let name = rest.get(..length).filter(|n| !n.is_empty())?;
        let first_in_line = Some(&rest[length..]).filter(|w| !w.is_empty());
        Some(Released {
            name,
            first_in_line,
        })
    }

    /// Whether an attempt by `owner` may succeed now: nobody waits, or `owner` is first.
    pub fn may_grant(&self, owner: &str) -> bool {
        self.first_in_line.is_none_or(|waiter| waiter == owner)
    }
}

/// One release, alone or in a batch: the lease's name, its token, whether its row (and data) is
/// kept, and whether it is announced even when nobody is in line.
#[derive(Debug, Clone, Copy)]
pub struct ReleaseRequest<'a> {
    /// The lease's name.
    pub name: &'a str,
    /// The token of the tenure to end.
    pub token: i64,
    /// Keep the row and its data, free, instead of deleting it.
    pub keep: bool,
    /// Announce the release even when nobody is in line: for listeners that do not line up —
    /// a semaphore's waiters, an election's observers. Otherwise only a lease someone waits for
    /// is announced (a NOTIFY's commit is serialised database-wide).
    pub announce_always: bool,
}

impl LeaseOwner<'_> {
    /// Ends the tenure `request.token` of `request.name` if this owner still holds it: deletes
    /// the row or, with `keep`, keeps it (and its data) free. The release is announced on the
    /// lease channel ([`Released`]) when someone waits for the lease, or always with
    /// `announce_always`. [`ErrorKind::LockLost`] when the owner no longer held the lease with
    /// that token.
    #[instrument(skip_all, fields(lease.name = request.name, lease.token = request.token), level = "debug")]
    pub async fn release(
        &self,
        client: &(impl Statements + ?Sized),
        request: &ReleaseRequest<'_>,
    ) -> Result<()> {
        let ReleaseRequest {
            name,
            token,
            keep,
            announce_always,
        } = *request;
        let params: &[Param<'_>] = &[
            (&name, Type::TEXT),
            (&token, Type::INT8),
            (&keep, Type::BOOL),
            (&self.table.channel, Type::TEXT),
            (&self.owner, Type::TEXT),
            (&announce_always, Type::BOOL),
        ];
        let rows = client.run(&self.table.release, params).await?;
        if rows.is_empty() {
            return Err(Error::new(
                ErrorKind::LockLost,
                format!("lock {name:?} was already released or lost (token {token})"),
            ));
        }
        Ok(())
    }

    /// Each of `requests` (distinct names) released as [`release`](Self::release) would, in
    /// one statement. Returns the names released. A name missing from the set was not
    /// released: lost, or its row locked by another transaction (a renewal, a fencing guard —
    /// not waited for, so that two multi-row statements cannot deadlock); its caller releases
    /// it alone, which tells it which. Send at most
    /// [`MAX_NAMES_PER_STATEMENT`](super::MAX_NAMES_PER_STATEMENT) or so at a time, as the
    /// runtime does: the statement's work grows with the square of its names.
    #[instrument(skip_all, fields(requests = requests.len()), level = "debug")]
    pub async fn release_many(
        &self,
        client: &(impl Statements + ?Sized),
        requests: &[ReleaseRequest<'_>],
    ) -> Result<HashSet<String>> {
        let mut names = Vec::with_capacity(requests.len());
        let mut tokens = Vec::with_capacity(requests.len());
        let mut keep = Vec::with_capacity(requests.len());
        let mut announce_always = Vec::with_capacity(requests.len());
        for request in requests {
            check_name(request.name)?;
            names.push(request.name);
            tokens.push(request.token);
            keep.push(request.keep);
            announce_always.push(request.announce_always);
        }
        let params: &[Param<'_>] = &[
            (&names, Type::TEXT_ARRAY),
            (&tokens, Type::INT8_ARRAY),
            (&keep, Type::BOOL_ARRAY),
            (&announce_always, Type::BOOL_ARRAY),
            (&self.table.channel, Type::TEXT),
            (&self.owner, Type::TEXT),
        ];
        let rows = client.run(&self.table.release_many, params).await?;
        rows.iter().map(|row| Ok(row.try_get(0)?)).collect()
    }
}

impl super::LeaseTable {
    /// Ends the current tenure of `name` as its holder's release would (the waiter first in line
    /// announced), matched on the owner and token read first: what an operator does to a lease
    /// whose holder is stuck. With `expected`, only the tenure with that token is ended
    /// ([`ErrorKind::FailedPrecondition`] when another holds it now): a confirmation that names
    /// what was looked at. A limited semaphore's slot keeps its row, free. The holder learns at
    /// its next renewal; its fenced writes stop at once. The owner and token released.
    pub async fn force_release(
        &self,
        client: &(impl Statements + ?Sized),
        name: &str,
        expected: Option<i64>,
    ) -> Result<(String, i64)> {
        let lease = self.get(client, name).await?;
        let (Some(token), Some(owner)) = (lease.token, lease.owner.clone()) else {
            return Err(Error::new(
                ErrorKind::NotFound,
                format!("lease {name:?} is not held"),
            ));
        };
        let changed = || {
            Error::new(
                ErrorKind::FailedPrecondition,
                format!("lease {name:?} changed hands meanwhile; look again"),
            )
        };
        if expected.is_some_and(|expected| expected != token) {
            return Err(changed());
        }
        // A permit of a limited semaphore keeps its slot's row (its slots' rows are made only
        // by a change of limit).
        let limited = match name.rsplit_once('#') {
            Some((semaphore, index)) if index.parse::<u32>().is_ok() => {
                self.limit(client, semaphore).await?.is_some()
            }
            _ => false,
        };
        // Announced always: it may be a semaphore's permit or an election's term, whose
        // listeners do not line up.
        let request = ReleaseRequest {
            name,
            token,
            keep: limited,
            announce_always: true,
        };
        match self.owner(&owner)?.release(client, &request).await {
            Ok(()) => Ok((owner, token)),
            Err(e) if e.is_lock_lost() => Err(changed()),
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Released;

    #[test]
    fn announcements_are_read_back_whatever_the_names_hold() {
        let free = Released::parse("3:job").unwrap();
        assert_eq!((free.name, free.first_in_line), ("job", None));
        assert!(free.may_grant("anyone"));
        let reserved = Released::parse("3:jobworker-7").unwrap();
        assert_eq!(
            (reserved.name, reserved.first_in_line),
            ("job", Some("worker-7"))
        );
        assert!(reserved.may_grant("worker-7") && !reserved.may_grant("worker-8"));
        // Colons and digits inside names, multi-byte characters: the length says where it ends.
        let odd = Released::parse("7:1:ä:b2:c").unwrap();
        assert_eq!((odd.name, odd.first_in_line), ("1:ä:b2", Some(":c")));
        // The handover form of earlier versions reads as nothing at all.
        assert_eq!(Released::parse("3>job1042@16384#-77:worker-7"), None);
    }

    #[test]
    fn anything_else_is_not_an_announcement() {
        for payload in [
            "",
            "job",
            ":job",
            "0:",
            "x:job",
            "9:job",
            "1:ä",
            "-1:job",
            "3>job",
            "3>job12:w",
            ">job1:w",
        ] {
            assert_eq!(Released::parse(payload), None, "{payload:?}");
        }
    }
}
