//! The SQL of the lease statements, rendered once per configured table.

use super::LeaseTable;
use super::sql::*;
use crate::config::Config;

impl LeaseTable {
    /// Renders the statements for `config`'s lock table, sequence and lease channel.
    pub fn new(config: &Config) -> LeaseTable {
        let t = config.lock_table.quoted();
        let q = config.lock_queue.quoted();
        // Whether `owner` may be granted `name` as far as the queue goes: nobody waits, or it
        // is the first in line.
        let may_go = |name: &str, owner: &str| {
            format!("coalesce(({}), {owner}) = {owner}", first_in_line(&q, name))
        };
        // $1 name, $2 owner, $3 data, $4 lease ms, $5 replace data, $6 sequence: the CTEs of
        // one attempt (`locked`, `granted`, `served`), shared by `acquire` and
        // `acquire_or_queue`.
        let grant_one = format!(
            "locked AS (SELECT 1 FROM {t} WHERE name = $1 FOR UPDATE NOWAIT),
             granted AS (
                 INSERT INTO {t} AS l (name, owner, token, data, acquired_at, expires_at)
                 SELECT $1, $2, {TIMELINE_BASE} + nextval($6::regclass), $3, now(),
                        now() + $4 * interval '1 millisecond'
                 FROM (SELECT count(*) FROM locked) AS row_lock
                 WHERE {first}
                 ON CONFLICT (name) DO UPDATE SET
                     owner = EXCLUDED.owner, token = EXCLUDED.token,
                     data = CASE WHEN $5 THEN EXCLUDED.data ELSE coalesce(l.data, EXCLUDED.data) END,
                     acquired_at = EXCLUDED.acquired_at, expires_at = EXCLUDED.expires_at, kept = false
                 WHERE l.owner IS NULL OR l.expires_at <= clock_timestamp()
                 RETURNING l.name, l.token, l.data
             ), served AS (
                 DELETE FROM {q} AS w USING granted WHERE w.name = granted.name AND w.waiter = $2
             )",
            first = may_go("$1", "$2"),
        );
        LeaseTable {
            // $1 name, $2 owner, $3 data, $4 lease ms, $5 replace data, $6 sequence.
            //
            // `ON CONFLICT DO UPDATE` locks the existing row before it evaluates its `WHERE`, so
            // on its own it would wait for any transaction holding that row: a holder's fencing
            // guard (`FOR KEY SHARE`), a DBA's open transaction — for as long as they last, on a
            // pooled connection, past the caller's deadline. The `locked` CTE takes the row lock
            // first with `NOWAIT`: when the row is locked, the attempt fails at once with 55P03
            // (`lock_not_available`), which `try_acquire` reports as `Attempt::Busy`, and the
            // waiter retries later without holding a connection. The CTE is read by the INSERT's
            // SELECT, so it runs before the insert. A missing row is inserted as before (a
            // concurrent insert of the same name is one short statement to wait for).
            //
            // Waiters queue in the queue table, in arrival order: only the first in line (or
            // anyone, when nobody waits) may take the lease, whether its row exists or not, and
            // a grant takes its waiter out of the queue, so the next one is first.
            acquire: format!("WITH {grant_one} SELECT token, data FROM granted"),
            // $1 name, $2 owner, $3 data, $4 lease ms, $5 replace data, $6 sequence, $7 ms,
            // $8 nonce.
            // `acquire`, and when it grants nothing, `enqueue` in the same statement: a waiter's
            // lost attempt puts it in line (or keeps its place) for $7 without a second round
            // trip. Columns: the holder as `holder` reads it (owner, token, ms left), then the
            // grant (token, data); a grant has no holder columns, a refusal no grant.
            acquire_or_queue: format!(
                "WITH {grant_one}, {line_up}
                 SELECT NULL::varchar, NULL::bigint, NULL::bigint, token, data FROM granted
                 UNION ALL
                 SELECT l.owner, l.token, {REMAINING_MS}, NULL::bigint, NULL::bytea
                 FROM {t} AS l WHERE l.name = $1 AND NOT EXISTS (SELECT 1 FROM granted)",
                line_up = line_up(
                    &q,
                    "$1",
                    "$2",
                    "$7",
                    Grantable {
                        lease_ms: "$4",
                        data: "$3",
                        replace_data: "$5",
                        nonce: "$8",
                    },
                    "NOT EXISTS (SELECT 1 FROM granted)"
                ),
            ),
            // $1 names, $2 data, $3 replace-data flags, $4 owner, $5 lease ms, $6 sequence. The
            // batch form of `acquire` (group commit for one process's concurrent first attempts),
            // with the same conditions, except that a row another transaction holds is skipped
            // (`SKIP LOCKED`, found by difference in `busy`) instead of failing the statement: its
            // caller asks again alone, which tells it Busy or Held. New names are inserted in
            // name order, so two batches inserting the same new names cannot deadlock.
            acquire_many: format!(
                "WITH {request}, locked AS (
                     SELECT l.name FROM args, {t} AS l WHERE {by_name}
                     FOR UPDATE OF l SKIP LOCKED
                 ), busy AS (
                     SELECT l.name FROM args, {t} AS l WHERE {by_name}
                     EXCEPT SELECT name FROM locked
                 ), granted AS (
                     INSERT INTO {t} AS l (name, owner, token, data, acquired_at, expires_at)
                     SELECT r.name, $4, {TIMELINE_BASE} + nextval($6::regclass), r.data, now(),
                            now() + $5 * interval '1 millisecond'
                     FROM req AS r WHERE r.name NOT IN (SELECT name FROM busy) AND {first}
                     ORDER BY r.name
                     ON CONFLICT (name) DO UPDATE SET
                         owner = EXCLUDED.owner, token = EXCLUDED.token,
                         data = CASE WHEN (SELECT q.replace_data FROM req AS q WHERE q.name = EXCLUDED.name)
                                     THEN EXCLUDED.data ELSE coalesce(l.data, EXCLUDED.data) END,
                         acquired_at = EXCLUDED.acquired_at, expires_at = EXCLUDED.expires_at, kept = false
                     WHERE l.owner IS NULL OR l.expires_at <= clock_timestamp()
                     RETURNING l.name, l.token, l.data
                 ), served AS (
                     DELETE FROM {q} AS w USING granted WHERE w.name = granted.name AND w.waiter = $4
                 )
                 SELECT name, token, data FROM granted",
                request = batch_request(&[
                    ("names", "text", "name"),
                    ("data", "bytea", "data"),
                    ("replace_data", "bool", "replace_data"),
                ]),
                by_name = BY_NAME,
                first = may_go("r.name", "$4"),
            ),
            // $1 slot names, $2 owner, $3 lease ms, $4 sequence. One grant of any free slot of a
            // semaphore: an existing free row is locked with `SKIP LOCKED LIMIT 1` (concurrent
            // callers take different rows, nobody waits), else a slot without a row is inserted;
            // slots are tried in random order to spread concurrent callers. The conditions on
            // the row are `acquire`'s; no row back means none was free for us now.
            acquire_any: format!(
                "WITH free AS (
                     SELECT l.name FROM {t} AS l
                     WHERE l.name = ANY($1::text[])
                       AND (l.owner IS NULL OR l.expires_at <= clock_timestamp())
                     ORDER BY random() LIMIT 1
                     FOR UPDATE SKIP LOCKED
                 ), missing AS (
                     SELECT s.name FROM unnest($1::text[]) AS s(name)
                     WHERE NOT EXISTS (SELECT 1 FROM {t} AS l WHERE l.name = s.name)
                     ORDER BY random() LIMIT 1
                 ), pick AS (
                     SELECT coalesce((SELECT name FROM free), (SELECT name FROM missing)) AS name
                 )
                 INSERT INTO {t} AS l (name, owner, token, acquired_at, expires_at)
                 SELECT pick.name, $2, {TIMELINE_BASE} + nextval($4::regclass), now(),
                        now() + $3 * interval '1 millisecond'
                 FROM pick WHERE pick.name IS NOT NULL
                 ON CONFLICT (name) DO UPDATE SET
                     owner = EXCLUDED.owner, token = EXCLUDED.token, data = NULL,
                     acquired_at = EXCLUDED.acquired_at, expires_at = EXCLUDED.expires_at, kept = false
                 WHERE l.owner IS NULL OR l.expires_at <= clock_timestamp()
                 RETURNING l.name, l.token"
            ),
            // $1 slot names. How many slots are held now (unexpired).
            count_held: format!(
                "SELECT count(*) FROM {t} WHERE name = ANY($1::text[]) AND owner IS NOT NULL
                   AND expires_at > clock_timestamp()"
            ),
            // $1 name, $2 owner, $3 ms. Puts `owner` in line for `name` (keeping its place when
            // it is there, refreshing how long it stays), drops waiters whose time ran out, and
            // reports the holder. A waiter refreshes its place at every attempt it loses.
            enqueue: format!(
                "WITH {line_up}
                 SELECT l.owner, l.token, {REMAINING_MS} FROM {t} AS l WHERE l.name = $1",
                line_up = line_up(&q, "$1", "$2", "$3", NOT_GRANTABLE, "true"),
            ),
            // $1 name, $2 owner, $3 channel. A waiter leaving the line: when it was first and the
            // lease is free, the release it would have taken is announced again, naming the next
            // in line, or the others would sleep until their next poll.
            dequeue: format!(
                "WITH gone AS (
                     DELETE FROM {q} WHERE name = $1 AND waiter = $2 RETURNING name
                 ), next AS (
                     SELECT w.waiter FROM {q} AS w
                     WHERE w.name = $1 AND w.waiter <> $2 AND w.until > clock_timestamp()
                     ORDER BY w.queued_at, w.waiter LIMIT 1
                 )
                 SELECT pg_notify($3, octet_length(gone.name)::text || ':' || gone.name
                                      || coalesce((SELECT waiter FROM next), ''))::text
                 FROM gone
                 WHERE ({first_now}) = $2
                   AND NOT EXISTS (SELECT 1 FROM {t} AS l WHERE l.name = $1 AND l.owner IS NOT NULL
                                     AND l.expires_at > clock_timestamp())",
                first_now = first_in_line(&q, "$1"),
            ),
            owned_token: format!("SELECT token FROM {t} WHERE name = $1 AND owner = $2"),
            holder: format!(
                "SELECT l.owner, l.token, {REMAINING_MS} FROM {t} AS l WHERE l.name = $1"
            ),
            // $1 names, $2 tokens, $3 lease ms, $4 owner. One statement for every lease of a
            // process; all rows get the same expiry (the statement's start), which tests rely on.
            // Every statement that acts on a held lease (renew, release, proclaim, fence)
            // matches its owner as well as its token: a process that came to believe it holds
            // another's token (a forged handover announcement, see `Released`) can then renew,
            // release or fence nothing of the holder's.
            renew: format!(
                "UPDATE {t} AS l SET expires_at = now() + $3 * interval '1 millisecond'
                 FROM unnest($1::text[], $2::int8[]) AS h(name, token)
                 WHERE l.name = h.name AND l.token = h.token AND l.owner = $4
                   AND l.expires_at > clock_timestamp()
                 RETURNING l.token"
            ),
            // $1 name, $2 token, $3 keep row, $4 channel, $5 sequence, $6 owner. The lease goes to the
            // waiter first in line when it can (`hand_over`); otherwise the row is deleted, or
            // kept free with $3. Every branch matches on name and token only (and on $3). The
            // announcement names the waiter first in line (see `Released`), so only its process
            // needs to wake.
            release: format!(
                "WITH releaser AS (
                     SELECT owner FROM {t} WHERE name = $1 AND token = $2 AND owner = $6
                 ), heirs AS (
                     SELECT $1::text AS name, $2::bigint AS token, $3::bool AS keep, h.*
                     FROM releaser CROSS JOIN LATERAL ({heir}) AS h
                 ), {hand_over}, own_place AS (
                     DELETE FROM {q} WHERE name = $1 AND waiter = (SELECT owner FROM releaser)
                 ), deleted AS (
                     DELETE FROM {t} WHERE name = $1 AND token = $2 AND owner = $6 AND NOT $3
                       AND NOT EXISTS (SELECT 1 FROM handed)
                     RETURNING name
                 ), kept AS (
                     UPDATE {t} SET owner = NULL, token = NULL, acquired_at = NULL, expires_at = NULL,
                         kept = true
                     WHERE name = $1 AND token = $2 AND owner = $6 AND $3
                       AND NOT EXISTS (SELECT 1 FROM handed)
                     RETURNING name
                 ), released AS (
                     SELECT * FROM deleted UNION ALL SELECT * FROM kept
                 )
                 SELECT released.name, pg_notify($4, {announce})::text FROM released
                 UNION ALL
                 SELECT handed.name, pg_notify($4, {HANDED_OVER})::text FROM handed",
                heir = heir(&q, "$1", "releaser.owner"),
                hand_over = hand_over(&t, &q, "heirs", "$5::regclass"),
                announce = announce(&q, "(SELECT owner FROM releaser)"),
            ),
            // $1 names, $2 tokens, $3 keep flags, $4 channel, $5 sequence, $6 owner. The batch form of
            // `release`, with the same effects. Rows another transaction has locked (a renewal,
            // a fencing guard) are skipped rather than waited for, so two multi-row statements
            // never wait on each other's rows in opposite orders (a deadlock, noticed only after
            // the server's `deadlock_timeout`); their callers release alone, which waits for one
            // row.
            release_many: format!(
                "WITH {request}, locked AS (
                     SELECT l.name, l.token, l.owner, r.keep FROM args, {t} AS l
                     JOIN req AS r ON l.name = r.name AND l.token = r.token
                     WHERE {by_name} AND l.owner = $6
                     FOR UPDATE OF l SKIP LOCKED
                 ), heirs AS (
                     SELECT locked.*, h.* FROM locked CROSS JOIN LATERAL ({heir}) AS h
                 ), {hand_over}, own_place AS (
                     DELETE FROM {q} AS w USING locked
                     WHERE w.name = locked.name AND w.waiter = locked.owner
                 ), deleted AS (
                     DELETE FROM {t} AS l USING locked
                     WHERE l.name = locked.name AND l.token = locked.token AND NOT locked.keep
                       AND locked.name NOT IN (SELECT name FROM handed)
                     RETURNING l.name
                 ), kept AS (
                     UPDATE {t} AS l SET owner = NULL, token = NULL, acquired_at = NULL,
                         expires_at = NULL, kept = true
                     FROM locked
                     WHERE l.name = locked.name AND l.token = locked.token AND locked.keep
                       AND locked.name NOT IN (SELECT name FROM handed)
                     RETURNING l.name
                 ), released AS (
                     SELECT * FROM deleted UNION ALL SELECT * FROM kept
                 )
                 SELECT released.name, pg_notify($4, {announce})::text FROM released
                 UNION ALL
                 SELECT handed.name, pg_notify($4, {HANDED_OVER})::text FROM handed",
                heir = heir(&q, "locked.name", "locked.owner"),
                hand_over = hand_over(&t, &q, "heirs", "$5::regclass"),
                announce = announce(
                    &q,
                    "(SELECT o.owner FROM locked AS o WHERE o.name = released.name)"
                ),
                request = batch_request(&[
                    ("names", "text", "name"),
                    ("tokens", "int8", "token"),
                    ("keep", "bool", "keep"),
                ]),
                by_name = BY_NAME,
            ),
            // Deletes the row of `name` if it is free and not kept (a reserved row of a version
            // before the queue table): safe at any moment, since each condition is checked on
            // the row as it is when deleted.
            cleanup: format!("DELETE FROM {t} WHERE name = $1 AND owner IS NULL AND NOT kept"),
            get: format!(
                "SELECT l.name, l.owner, l.token, l.data, CASE WHEN l.owner IS NULL THEN NULL ELSE {REMAINING_MS} END
                 FROM {t} AS l WHERE l.name = $1"
            ),
            list: format!(
                "SELECT l.name, l.owner, l.token, l.data, CASE WHEN l.owner IS NULL THEN NULL ELSE {REMAINING_MS} END
                 FROM {t} AS l ORDER BY l.name"
            ),
            // $1 prefix. Every lock whose name starts with it (no pattern: `starts_with`).
            list_prefix: format!(
                "SELECT l.name, l.owner, l.token, l.data, CASE WHEN l.owner IS NULL THEN NULL ELSE {REMAINING_MS} END
                 FROM {t} AS l WHERE starts_with(l.name, $1) ORDER BY l.name"
            ),
            // $1 name, $2 token, $3 data, $4 channel, $5 announcement, $6 owner. New data for a lease held
            // with this token, announced in the same transaction: announced exactly when done.
            proclaim: format!(
                "WITH proclaimed AS (
                     UPDATE {t} SET data = $3
                     WHERE name = $1 AND token = $2 AND owner = $6
                       AND expires_at > clock_timestamp()
                     RETURNING name
                 )
                 SELECT pg_notify($4, $5)::text FROM proclaimed"
            ),
            // FOR KEY SHARE conflicts with the token change of a takeover and with release, not
            // with renewals, so the holder keeps renewing while a guarded transaction runs.
            fence: format!(
                "SELECT 1 FROM {t} WHERE name = $1 AND token = $2 AND owner = $3
                   AND expires_at > clock_timestamp()
                 FOR KEY SHARE"
            ),
            table: config.lock_table.quoted(),
            sequence: config.lock_sequence.quoted(),
            channel: config.lease_channel.as_str().to_owned(),
            election_channel: config.election_channel.as_str().to_owned(),
        }
    }
}
