//! Releasing leases, alone or many in one statement, and the announcement each release makes on
//! the lease channel.

use std::collections::HashSet;

use tokio_postgres::types::Type;
use tracing::instrument;

use super::{LeaseTable, check_name};
use crate::error::{Error, ErrorKind, Result};
use crate::statement::Statements;

/// A release (or the first waiter leaving the line) as announced on the lease channel
/// ([`LeaseTable::channel`]).
///
/// The payload is the name's length in bytes, a colon, the name, then the owner the next grant
/// is reserved for, if any: `3:jobworker-7` announces that `job` is free and reserved for
/// `worker-7`; `3:job` that it is free for anyone. A release that handed the lease straight to
/// the waiter first in line writes `>` instead of the colon, then the name, the new token, `@`,
/// the lock table's oid, `#` and the nonce the waiter's place stored (when it stored one), a
/// colon and the new holder: `3>job1042@16384#-77:worker-7` announces that `worker-7` holds
/// `job` with token 1042 in the lock table whose oid is 16384, handed to the place its attempt
/// with nonce -77 wrote (a reader of the first two forms only, an older version, does not take
/// it for one of them: the text before the first colon is not a number). The oid tells apart
/// lock tables that share a channel (see [`LeaseTable::table_oid`]). Any name and owner can be
/// written
/// this way (neither may contain NUL, which a payload cannot carry), so other languages can
/// read it too. Processes other than the named waiter's have no reason to try: the grant is not
/// theirs until the reservation is used or lapses, or the lease is released again.
///
/// An announcement is a hint, not proof: it may arrive after what it announces was undone, and
/// anyone who can connect may NOTIFY the channel. Read the row ([`LeaseTable::get`]) before
/// acting on a handover as a grant — unless it carries the nonce of your last refused attempt
/// (see [`try_acquire_or_queue`](LeaseTable::try_acquire_or_queue)): that nonce is random, new
/// per attempt, and was seen only by the server, so the announcement is the release's, made for
/// that attempt's wait after it was sent (and the handed lease expires its lease after the
/// release wrote the row, later than that). The nonce is as secret as the waiters' table: a
/// role that can read it can forge such an announcement. Every statement on a held lease
/// matches its owner as well as its token, so such a forgery deceives the waiter's process
/// only, until its first renewal reports the lease lost; the holder's lease is untouched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Released<'a> {
    /// The lock's name.
    pub name: &'a str,
    /// The waiter first in line, the only one the next grant may go to (or, with
    /// `handed_over`, the one it went to); `None` when anyone may take it.
    pub reserved_for: Option<&'a str>,
    /// The token of the grant to `reserved_for` made by the release itself; `None` when the
    /// lease is free.
    pub handed_over: Option<i64>,
    /// With `handed_over`, the oid of the lock table the grant is in; `None` otherwise.
    pub table_oid: Option<u32>,
    /// With `handed_over`, the nonce of the attempt that last wrote the waiter's place (see
    /// [`try_acquire_or_queue`](LeaseTable::try_acquire_or_queue)); `None` otherwise, or when
    /// the place stored none (a waiter of an older version).
    pub nonce: Option<i64>,
}

impl<'a> Released<'a> {
    /// Reads an announcement; `None` when `payload` is not one (sent by hand, say).
    pub fn parse(payload: &'a str) -> Option<Released<'a>> {
        let digits = payload.bytes().take_while(u8::is_ascii_digit).count();
        let length: usize = payload[..digits].parse().ok()?;
        let (handed, rest) = match payload.as_bytes().get(digits)? {
            b':' => (false, &payload[digits + 1..]),
            b'>' => (true, &payload[digits + 1..]),
            _ => return None,
        };
        // `get` refuses a length past the end or inside a multi-byte character.
        let name = rest.get(..length).filter(|n| !n.is_empty())?;
        let rest = &rest[length..];
        if !handed {
            let reserved_for = Some(rest).filter(|w| !w.is_empty());
            return Some(Released {
                name,
                reserved_for,
                handed_over: None,
                table_oid: None,
                nonce: None,
            });
        }
        // Token, oid and nonce hold no colon; the owner is everything after the first one.
        let (grant, owner) = rest.split_once(':')?;
        let (token, table) = grant.split_once('@')?;
        let (table_oid, nonce) = match table.split_once('#') {
            Some((oid, nonce)) => (oid, Some(nonce)),
            None => (table, None),
        };
        let owner = Some(owner).filter(|o| !o.is_empty())?;
        let digits = |text: &str| !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit());
        if !digits(token) || !digits(table_oid) {
            return None;
        }
        let nonce = match nonce {
            Some(nonce) if digits(nonce.strip_prefix('-').unwrap_or(nonce)) => {
                Some(nonce.parse().ok()?)
            }
            Some(_) => return None,
            None => None,
        };
        Some(Released {
            name,
            reserved_for: Some(owner),
            handed_over: Some(token.parse().ok()?),
            table_oid: Some(table_oid.parse().ok()?),
            nonce,
        })
    }

    /// Whether a process whose owner is `owner` may be granted the lock now (or, after a
    /// handover, holds it).
    pub fn may_grant(&self, owner: &str) -> bool {
        self.reserved_for.is_none_or(|waiter| waiter == owner)
    }

    /// The token `owner` was handed the lease with, when this release handed it to `owner` in
    /// the lock table whose oid is `table_oid` ([`LeaseTable::table_oid`]).
    pub fn handed_to(&self, owner: &str, table_oid: u32) -> Option<i64> {
        self.handed_over
            .filter(|_| self.reserved_for == Some(owner) && self.table_oid == Some(table_oid))
    }

    /// Whether this announcement may be about the lock table whose oid is `table_oid`: a
    /// handover names its table; a release that handed nothing over names none, so it may be
    /// about any table on its channel.
    pub fn may_concern(&self, table_oid: u32) -> bool {
        self.table_oid.is_none_or(|oid| oid == table_oid)
    }
}

/// One release of a batch: the lease's name, its token, and whether its row (and data) is kept.
#[derive(Debug, Clone, Copy)]
pub struct ReleaseRequest<'a> {
    /// The lease's name.
    pub name: &'a str,
    /// The token of the tenure to end.
    pub token: i64,
    /// Keep the row and its data, free, instead of deleting it.
    pub keep: bool,
}

impl LeaseTable {
    /// Releases `name` if `token` still holds it: hands it to the waiter first in line when
    /// that waiter's place stored its grant (a refused
    /// [`try_acquire_or_queue`](Self::try_acquire_or_queue)) and the grant's data would be the
    /// waiter's own; otherwise deletes the row or, with `keep`, keeps it (and its data) free.
    /// Either way it is announced on the lease channel ([`Released`]), and the releaser's own
    /// place in line, if it had one, is removed. A [`ErrorKind::LockLost`] error when `owner`
    /// no longer held the lease with that token.
    #[instrument(skip(self, client), level = "debug")]
    pub async fn release(
        &self,
        client: &(impl Statements + ?Sized),
        name: &str,
        owner: &str,
        token: i64,
        keep: bool,
    ) -> Result<()> {
        let rows = client
            .run(
                &self.release,
                &[
                    (&name, Type::TEXT),
                    (&token, Type::INT8),
                    (&keep, Type::BOOL),
                    (&self.channel, Type::TEXT),
                    (&self.sequence, Type::TEXT),
                    (&owner, Type::TEXT),
                ],
            )
            .await?;
        if rows.is_empty() {
            return Err(Error::new(
                ErrorKind::LockLost,
                format!("lock {name:?} was already released or lost (token {token})"),
            ));
        }
        Ok(())
    }

    /// Each of `requests` (distinct names, all `owner`'s) released as
    /// [`release`](Self::release) would (handed over, deleted or kept), in one statement.
    /// Returns the names released. A name missing from the set was not released: lost, or its
    /// row locked by another transaction (a renewal, a fencing guard — not waited for, so that
    /// two multi-row statements cannot deadlock); its caller releases it alone, which tells it
    /// which.
    #[instrument(skip_all, fields(requests = requests.len()), level = "debug")]
    pub async fn release_many(
        &self,
        client: &(impl Statements + ?Sized),
        owner: &str,
        requests: &[ReleaseRequest<'_>],
    ) -> Result<HashSet<String>> {
        let mut names = Vec::with_capacity(requests.len());
        let mut tokens = Vec::with_capacity(requests.len());
        let mut keep = Vec::with_capacity(requests.len());
        for request in requests {
            check_name(request.name)?;
            names.push(request.name);
            tokens.push(request.token);
            keep.push(request.keep);
        }
        let rows = client
            .run(
                &self.release_many,
                &[
                    (&names, Type::TEXT_ARRAY),
                    (&tokens, Type::INT8_ARRAY),
                    (&keep, Type::BOOL_ARRAY),
                    (&self.channel, Type::TEXT),
                    (&self.sequence, Type::TEXT),
                    (&owner, Type::TEXT),
                ],
            )
            .await?;
        rows.iter().map(|row| Ok(row.try_get(0)?)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::Released;

    #[test]
    fn announcements_are_read_back_whatever_the_names_hold() {
        let free = Released::parse("3:job").unwrap();
        assert_eq!((free.name, free.reserved_for), ("job", None));
        assert!(free.may_grant("anyone"));
        let reserved = Released::parse("3:jobworker-7").unwrap();
        assert_eq!(
            (reserved.name, reserved.reserved_for),
            ("job", Some("worker-7"))
        );
        assert!(reserved.may_grant("worker-7") && !reserved.may_grant("worker-8"));
        // Colons and digits inside names, multi-byte characters: the length says where it ends.
        let odd = Released::parse("7:1:ä:b2:c").unwrap();
        assert_eq!((odd.name, odd.reserved_for), ("1:ä:b2", Some(":c")));
    }

    #[test]
    fn handovers_are_read_back_and_name_their_new_holder_and_table() {
        let handed = Released::parse("3>job1042@16384:worker-7").unwrap();
        assert_eq!(
            (handed.name, handed.reserved_for, handed.handed_over),
            ("job", Some("worker-7"), Some(1042))
        );
        assert_eq!(handed.table_oid, Some(16384));
        assert_eq!(handed.handed_to("worker-7", 16384), Some(1042));
        assert_eq!(handed.handed_to("worker-8", 16384), None);
        // The same owner in another lock table sharing the channel: not its lease.
        assert_eq!(handed.handed_to("worker-7", 16385), None);
        assert!(handed.may_concern(16384) && !handed.may_concern(16385));
        assert!(!handed.may_grant("worker-8"));
        // Colons, digits and `@` in the name and the owner; a token of the timeline after a
        // failover.
        let odd = Released::parse("5>a:1>@1099511627777@7:9:x@1").unwrap();
        assert_eq!(
            (odd.name, odd.reserved_for, odd.handed_over, odd.table_oid),
            ("a:1>@", Some("9:x@1"), Some(1099511627777), Some(7))
        );
        // A plain reservation never reads as a handover, whatever the owner's name holds, and
        // may concern any table.
        let plain = Released::parse("3:job1042@16384:worker-7").unwrap();
        assert_eq!(
            (plain.reserved_for, plain.handed_over, plain.table_oid),
            (Some("1042@16384:worker-7"), None, None)
        );
        assert_eq!(plain.handed_to("worker-7", 16384), None);
        assert!(plain.may_concern(16384) && plain.may_concern(1));
        assert_eq!(handed.nonce, None, "a place of an older version");
    }

    #[test]
    fn handovers_carry_the_nonce_of_the_place_they_were_made_for() {
        for (payload, nonce) in [
            ("3>job1042@16384#77:worker-7", 77),
            ("3>job1042@16384#-9223372036854775808:worker-7", i64::MIN),
            ("3>job1042@16384#9223372036854775807:w#1:x", i64::MAX),
        ] {
            let handed = Released::parse(payload).unwrap();
            assert_eq!(handed.nonce, Some(nonce), "{payload}");
            assert_eq!(
                (handed.handed_over, handed.table_oid),
                (Some(1042), Some(16384))
            );
            assert_eq!(
                handed.handed_to(handed.reserved_for.unwrap(), 16384),
                Some(1042)
            );
        }
        // `#` in the owner is the owner's.
        let odd = Released::parse("3>job1@2:w#1").unwrap();
        assert_eq!((odd.reserved_for, odd.nonce), (Some("w#1"), None));
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
            "3>job12",
            "3>job:w",
            "3>jobx:w",
            "3>job12:",
            ">job1:w",
            "3>job12:w",
            "3>job12@:w",
            "3>job@5:w",
            "3>job12@5:",
            "3>job-1@5:w",
            "3>job1@-5:w",
            "3>job1@5x:w",
            "3>job1@4294967296:w",
            "3>job1@5#:w",
            "3>job1@5#-:w",
            "3>job1@5#x:w",
            "3>job1@5#1-:w",
            "3>job1@5#--1:w",
            "3>job1@5#1#2:w",
            "3>job1@5#9223372036854775808:w",
            "3>job1#7@5:w",
        ] {
            assert_eq!(Released::parse(payload), None, "{payload:?}");
        }
    }
}
