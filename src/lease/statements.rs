//! The SQL of the lease statements, rendered once per configured table.
//!
//! Every statement that acts on a held lease (renew, release, proclaim, fence) matches its
//! owner as well as its token. Grants happen only where the row is free or expired on the
//! server's clock and the grantee may go as far as the waiters' line says.

use super::sql::*;
use super::{HOLDER_CHANNEL_PREFIX, LeaseTable, MAX_PLACES_LISTED};
use crate::config::Config;
use crate::signal::notify_sql;

impl LeaseTable {
    /// Renders the statements for `config`'s lock table, sequence and lease channel.
    pub fn new(config: &Config) -> LeaseTable {
        let t = config.lock_table.quoted();
        let q = config.lock_queue.quoted();
        // $1 name, $2 owner, $3 data, $4 lease ms, $5 replace data, $6 sequence: the CTEs of
        // one attempt (`locked`, `granted`, `served`), shared by `acquire` and
        // `acquire_or_queue`.
        //
        // The grant lock comes before the token is drawn: the rows of `grant_lock` and
        // `row_busy` are read before the INSERT's values are computed (see `sql::grant_lock`).
        //
        // `ON CONFLICT DO UPDATE` locks the existing row before it evaluates its `WHERE`, so on
        // its own it would wait for any transaction holding that row: a holder's fencing guard
        // (`FOR KEY SHARE`), a DBA's open transaction — past the caller's deadline, on a pooled
        // connection. The `locked` CTE takes the row lock first, skipping a row another
        // transaction holds: a row that exists but was skipped makes `row_busy`, and the attempt
        // answers `Attempt::Busy` at once — without raising an error, so a contended name fills
        // no server log with ERROR lines, and a caller's own transaction stays usable. The CTEs
        // are read by the INSERT's SELECT, so they run first. A missing row is inserted; a
        // concurrent insert of the same name is one short statement to wait for.
        //
        // The grant lock is asked for only by an attempt that may be granted: its row not busy,
        // and nobody else first in line (`may`, read once). Otherwise `taken` is NULL: not
        // busy, and no grant. An attempt that can only be refused (the releaser asking again
        // while the waiter announced first comes for it) would otherwise take the lock from
        // under that waiter's attempt, which would then find it busy and ask again a tick later.
        let grant_one = format!(
            "locked AS (SELECT 1 FROM {t} WHERE name = $1 FOR UPDATE SKIP LOCKED),
             row_busy AS MATERIALIZED (
                 SELECT NOT EXISTS (SELECT 1 FROM locked)
                        AND EXISTS (SELECT 1 FROM {t} WHERE name = $1) AS busy
             ),
             may AS MATERIALIZED (SELECT {may_go} AS go),
             grant_lock AS MATERIALIZED (
                 SELECT CASE WHEN row_busy.busy OR NOT may.go THEN NULL ELSE {grant_lock} END
                        AS taken
                 FROM row_busy, may
             ),
             granted AS (
                 INSERT INTO {t} AS l (name, owner, token, data, acquired_at, expires_at)
                 SELECT $1, $2, {TIMELINE_BASE} + nextval($6::regclass), $3, now(),
                        now() + $4 * interval '1 millisecond'
                 FROM row_busy, may, grant_lock
                 WHERE grant_lock.taken AND NOT row_busy.busy AND may.go
                 ON CONFLICT (name) DO UPDATE SET
                     owner = EXCLUDED.owner, token = EXCLUDED.token, data = {data},
                     acquired_at = EXCLUDED.acquired_at, expires_at = EXCLUDED.expires_at,
                     kept = false
                 WHERE l.owner IS NULL OR l.expires_at <= clock_timestamp()
                 RETURNING l.name, l.token, l.data
             ), served AS (
                 DELETE FROM {q} AS w USING granted WHERE w.name = granted.name AND w.waiter = $2
             )",
            grant_lock = grant_lock("$1", "$6"),
            may_go = may_go(&q, "$1", "$2"),
            data = data_on_grant("$5"),
        );
        // The rows a release ends (`ended`: name, token, keep, announce_always), deleted or (with
        // keep) kept free with their data, and announced on `channel` when someone waits for
        // them, or always with announce_always: only a lease someone waits for costs a NOTIFY,
        // whose commit PostgreSQL serialises database-wide.
        //
        // Someone waits when this statement's snapshot has a place in line, or when the row's
        // `waiter_until` (written by every refused attempt in line, see `acquire_or_queue`) has
        // not passed. The snapshot alone would miss a place committed after it was taken, by an
        // attempt that had the row locked while this statement waited for it. But that attempt
        // also updated the row, so the DELETE or UPDATE here, which acts on the row's newest
        // version (READ COMMITTED re-reads a row updated since the snapshot), returns its mark.
        let release_rows = |channel: &str| {
            format!(
                "deleted AS (
                     DELETE FROM {t} AS l USING ended AS r
                     WHERE l.name = r.name AND l.token = r.token AND NOT r.keep
                     RETURNING l.name, r.announce_always, l.waiter_until
                 ), kept AS (
                     UPDATE {t} AS l SET owner = NULL, token = NULL, acquired_at = NULL,
                         expires_at = NULL, kept = true
                     FROM ended AS r
                     WHERE l.name = r.name AND l.token = r.token AND r.keep
                     RETURNING l.name, r.announce_always, l.waiter_until
                 ), released AS (
                     SELECT * FROM deleted UNION ALL SELECT * FROM kept
                 )
                 SELECT released.name,
                        CASE WHEN released.announce_always
                                  OR released.waiter_until > clock_timestamp()
                                  OR ({first}) IS NOT NULL
                             THEN {notify} END
                 FROM released",
                first = first_in_line(&q, "released.name", None),
                notify = notify_sql(config, channel, &announce(&q, "released.name", None)),
            )
        };
        let mut table = LeaseTable {
            // The grant (token, data), or a row of NULLs when another grant statement of the
            // name held its grant lock or another transaction its row (`Attempt::Busy`), or no
            // row.
            acquire: format!(
                "WITH {grant_one}
                 SELECT token, data FROM granted
                 UNION ALL
                 SELECT NULL::bigint, NULL::bytea FROM grant_lock, row_busy
                 WHERE grant_lock.taken IS FALSE OR row_busy.busy"
            ),
            // + $7 wait ms, $8 priority. `acquire`, and when it grants nothing, a place in line
            // for $7 with priority $8 in the same statement. Columns: the holder as `holder` reads it (owner, token, ms left),
            // the grant (token, data), and whether another grant statement held the grant lock; a
            // grant has no holder columns, a refusal no grant.
            //
            // A refusal also marks the lease's row: `waiter_until` is pushed to the place's end,
            // so a release that took its snapshot before this commits still learns, from the
            // row it ends, that someone waits (see `release_rows`). The mark's UPDATE reads
            // `row_busy` first: the row is locked (or found busy) before anything is written, so
            // a release that holds it makes this attempt busy instead of waiting behind it, and
            // a busy attempt writes nothing, not even its place in line. The column dates from
            // 0001_locks.sql, whose one-deep reservation no longer reads it.
            acquire_or_queue: format!(
                "WITH {grant_one}, {line_up}, marked AS (
                     UPDATE {t} AS l SET waiter_until = greatest(l.waiter_until,
                         clock_timestamp() + $7 * interval '1 millisecond')
                     FROM row_busy
                     WHERE l.name = $1 AND NOT row_busy.busy
                       AND NOT EXISTS (SELECT 1 FROM granted)
                 )
                 SELECT NULL::varchar, NULL::bigint, NULL::bigint, token, data, false FROM granted
                 UNION ALL
                 SELECT l.owner, l.token, {REMAINING_MS}, NULL::bigint, NULL::bytea, false
                 FROM {t} AS l, grant_lock, row_busy
                 WHERE l.name = $1 AND grant_lock.taken IS NOT FALSE AND NOT row_busy.busy
                   AND NOT EXISTS (SELECT 1 FROM granted)
                 UNION ALL
                 SELECT NULL, NULL, NULL, NULL, NULL, true FROM grant_lock, row_busy
                 WHERE grant_lock.taken IS FALSE OR row_busy.busy",
                line_up = line_up(
                    &q,
                    "$7",
                    "$8",
                    "NOT EXISTS (SELECT 1 FROM granted) AND NOT (SELECT busy FROM row_busy)",
                ),
            ),
            // $1 names, $2 data, $3 replace-data flags, $4 owner, $5 lease ms, $6 sequence. The
            // batch form of `acquire`, with its conditions, except that a row another
            // transaction holds is skipped (`SKIP LOCKED`, found by difference in `busy`): its
            // caller asks again alone; so is a name whose grant lock another grant statement holds.
            // New names are inserted in name order, so two batches inserting the same new
            // names cannot deadlock.
            acquire_many: format!(
                "WITH {request}, locked AS (
                     SELECT l.name FROM args, {t} AS l WHERE {BY_NAME}
                     FOR UPDATE OF l SKIP LOCKED
                 ), busy AS (
                     SELECT l.name FROM args, {t} AS l WHERE {BY_NAME}
                     EXCEPT SELECT name FROM locked
                 ), grant_locks AS MATERIALIZED (
                     -- Only for names that may be granted (see `grant_one`); a CASE, so
                     -- that the lock is not asked for before the conditions are read.
                     SELECT r.name FROM req AS r
                     WHERE CASE WHEN r.name IN (SELECT name FROM busy) OR NOT {may_go}
                                THEN false ELSE {grant_lock} END
                 ), granted AS (
                     INSERT INTO {t} AS l (name, owner, token, data, acquired_at, expires_at)
                     SELECT r.name, $4, {TIMELINE_BASE} + nextval($6::regclass), r.data, now(),
                            now() + $5 * interval '1 millisecond'
                     FROM req AS r JOIN grant_locks ON grant_locks.name = r.name
                     WHERE r.name NOT IN (SELECT name FROM busy) AND {may_go}
                     ORDER BY r.name
                     ON CONFLICT (name) DO UPDATE SET
                         owner = EXCLUDED.owner, token = EXCLUDED.token, data = {data},
                         acquired_at = EXCLUDED.acquired_at, expires_at = EXCLUDED.expires_at,
                         kept = false
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
                grant_lock = grant_lock("r.name", "$6"),
                may_go = may_go(&q, "r.name", "$4"),
                data = data_on_grant(
                    "(SELECT x.replace_data FROM req AS x WHERE x.name = EXCLUDED.name)"
                ),
            ),
            // $1 slot names, $2 owner, $3 lease ms, $4 sequence. One grant of any free slot of a
            // semaphore: an existing free row is locked with `SKIP LOCKED LIMIT 1` (concurrent
            // callers take different rows, nobody waits), else a slot without a row is inserted;
            // slots are tried in random order to spread concurrent callers. No row back means
            // none was free for us now (or another grant statement held the slot's grant lock).
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
                 FROM pick WHERE pick.name IS NOT NULL AND {grant_lock}
                 ON CONFLICT (name) DO UPDATE SET
                     owner = EXCLUDED.owner, token = EXCLUDED.token, data = NULL,
                     acquired_at = EXCLUDED.acquired_at, expires_at = EXCLUDED.expires_at,
                     kept = false
                 WHERE l.owner IS NULL OR l.expires_at <= clock_timestamp()
                 RETURNING l.name, l.token",
                grant_lock = grant_lock("pick.name", "$4"),
            ),
            // $1 slot names. How many slots are held now (unexpired).
            count_held: format!(
                "SELECT count(*) FROM {t} WHERE name = ANY($1::text[]) AND owner IS NOT NULL
                   AND expires_at > clock_timestamp()"
            ),
            // $1 name, $2 owner, $3 channel. A waiter leaving the line: when it was first and
            // the lease is free, the next in line is announced, or it would sleep until its
            // next poll.
            leave_line: format!(
                "WITH gone AS (
                     DELETE FROM {q} WHERE name = $1 AND waiter = $2 RETURNING name
                 )
                 SELECT {notify}
                 FROM gone
                 WHERE ({first}) = $2
                   AND NOT EXISTS (SELECT 1 FROM {t} AS l WHERE l.name = $1 AND l.owner IS NOT NULL
                                     AND l.expires_at > clock_timestamp())",
                notify = notify_sql(config, "$3", &announce(&q, "gone.name", Some("$2"))),
                first = first_in_line(&q, "$1", None),
            ),
            // $1 names, $2 owner. The tenures of these names the owner holds.
            owned: format!("SELECT name, token FROM {t} WHERE name = ANY($1::text[]) AND owner = $2"),
            holder: format!(
                "SELECT l.owner, l.token, {REMAINING_MS} FROM {t} AS l WHERE l.name = $1"
            ),
            // $1 names, $2 tokens, $3 lease ms (each lease's own), $4 owner. One statement for every
            // lease of a process; rows of one lease get the same expiry (the statement's start),
            // which tests rely on.
            renew: format!(
                "UPDATE {t} AS l SET expires_at = now() + h.ms * interval '1 millisecond'
                 FROM unnest($1::text[], $2::int8[], $3::int8[]) AS h(name, token, ms)
                 WHERE l.name = h.name AND l.token = h.token AND l.owner = $4
                   AND l.expires_at > clock_timestamp()
                 RETURNING l.token"
            ),
            // $1 name, $2 token, $3 keep, $4 channel, $5 owner, $6 announce always.
            release: format!(
                "WITH ended AS (
                     SELECT name, token, $3::bool AS keep, $6::bool AS announce_always FROM {t}
                     WHERE name = $1 AND token = $2 AND owner = $5
                 ), {rows}",
                rows = release_rows("$4"),
            ),
            // $1 names, $2 tokens, $3 keep flags, $4 announce-always flags, $5 channel, $6
            // owner. The batch form of `release`. Rows another transaction has locked (a
            // renewal, a fencing guard) are skipped rather than waited for, so two multi-row
            // statements never wait on each other's rows in opposite orders (a deadlock,
            // noticed only after the server's `deadlock_timeout`); their callers release alone,
            // which waits for one row.
            release_many: format!(
                "WITH {request}, ended AS (
                     SELECT l.name, l.token, r.keep, r.announce_always FROM args, {t} AS l
                     JOIN req AS r ON l.name = r.name AND l.token = r.token
                     WHERE {BY_NAME} AND l.owner = $6
                     FOR UPDATE OF l SKIP LOCKED
                 ), {rows}",
                request = batch_request(&[
                    ("names", "text", "name"),
                    ("tokens", "int8", "token"),
                    ("keep", "bool", "keep"),
                    ("announce_always", "bool", "announce_always"),
                ]),
                rows = release_rows("$5"),
            ),
            get: format!(
                "SELECT l.name, l.owner, l.token, l.data, CASE WHEN l.owner IS NULL THEN NULL ELSE {REMAINING_MS} END
                 FROM {t} AS l WHERE l.name = $1"
            ),
            list: format!(
                "SELECT l.name, l.owner, l.token, l.data, CASE WHEN l.owner IS NULL THEN NULL ELSE {REMAINING_MS} END
                 FROM {t} AS l ORDER BY l.name"
            ),
            // Every live place in the waiters' line, in line order (the grant's: priority
            // first, then arrival): what an operator looks at.
            line: format!(
                "SELECT name::text, waiter::text, priority,
                        (extract(epoch FROM clock_timestamp() - queued_at) * 1000)::int8,
                        (extract(epoch FROM until - clock_timestamp()) * 1000)::int8
                 FROM {q} WHERE until > clock_timestamp()
                 ORDER BY name, priority DESC, queued_at, waiter
                 LIMIT {MAX_PLACES_LISTED}"
            ),
            // $1 prefix. Every lock whose name starts with it (no pattern: `starts_with`).
            list_prefix: format!(
                "SELECT l.name, l.owner, l.token, l.data, CASE WHEN l.owner IS NULL THEN NULL ELSE {REMAINING_MS} END
                 FROM {t} AS l WHERE starts_with(l.name, $1) ORDER BY l.name"
            ),
            // $1 name, $2 token, $3 data, $4 channel, $5 announcement, $6 owner. New data for a
            // lease held with this token, announced in the same transaction: announced exactly
            // when done.
            proclaim: format!(
                "WITH proclaimed AS (
                     UPDATE {t} SET data = $3
                     WHERE name = $1 AND token = $2 AND owner = $6
                       AND expires_at > clock_timestamp()
                     RETURNING name
                 )
                 SELECT {notify} FROM proclaimed",
                notify = notify_sql(config, "$4", "$5"),
            ),
            // $1 name, $2 token, $3 owner. The migrations' function, which any driver calls
            // too (one home for the rule): it raises PC001 unless the lease is held so.
            fence: format!(
                "SELECT {}($1, $2, $3)::text",
                config.sql_function("pgcoord_locks_fence").quoted()
            ),
            // $1 name, $2 requester. A request for the term that holds the lease now (its
            // token), replacing an earlier one; nothing when no one holds it.
            request_resign: format!(
                "INSERT INTO {r} AS r (name, token, requested_by)
                 SELECT name, token, $2 FROM {t}
                 WHERE name = $1 AND owner IS NOT NULL AND expires_at > clock_timestamp()
                 ON CONFLICT (name) DO UPDATE
                 SET token = EXCLUDED.token, requested_by = EXCLUDED.requested_by,
                     requested_at = clock_timestamp()
                 RETURNING r.token",
                r = config.resign_table().quoted(),
            ),
            // $1 name, $2 token. Whether this term was asked to step down.
            resign_requested: format!(
                "SELECT EXISTS (SELECT 1 FROM {r} WHERE name = $1 AND token = $2)",
                r = config.resign_table().quoted(),
            ),
            // $1 name, $2 scope, $3 text. The holder's channel is computed here, from the row,
            // so reading the holder and reaching it are one statement (see `holder_channel`).
            notify_holder: format!(
                "SELECT l.owner, pg_notify(
                     '{HOLDER_CHANNEL_PREFIX}' || left(encode(sha256(convert_to($2 || l.owner, 'UTF8')), 'hex'), 16),
                     $3)::text
                 FROM {t} AS l
                 WHERE l.name = $1 AND l.owner IS NOT NULL AND l.expires_at > clock_timestamp()"
            ),
            // $1 names, $2 scopes, $3 texts. `notify_holder` for many, in one transaction (one
            // commit: NOTIFYing commits are serialised database-wide); a row per item, in order.
            // LATERAL: one index probe per item, whatever the table's size.
            notify_holders: format!(
                "SELECT h.owner, CASE WHEN h.owner IS NOT NULL THEN pg_notify(
                     '{HOLDER_CHANNEL_PREFIX}' || left(encode(sha256(convert_to(r.scope || h.owner, 'UTF8')), 'hex'), 16),
                     r.text)::text END
                 FROM unnest($1::text[], $2::text[], $3::text[]) WITH ORDINALITY
                      AS r(name, scope, text, position)
                 LEFT JOIN LATERAL (
                     SELECT l.owner FROM {t} AS l
                     WHERE l.name = r.name AND l.owner IS NOT NULL
                       AND l.expires_at > clock_timestamp()
                 ) AS h ON true
                 ORDER BY r.position"
            ),
            // $1 name. A free, kept row where there is none: a name recorded, not held.
            keep_free: format!(
                "INSERT INTO {t} (name, kept) VALUES ($1, true)
                 ON CONFLICT (name) DO NOTHING RETURNING name"
            ),
            // Places whose waiter is gone: lapsed, as an attempt of the same name prunes them,
            // a thousand at most a statement.
            reap_places: format!(
                "WITH reaped AS (
                     DELETE FROM {q} WHERE ctid = ANY (ARRAY(
                         SELECT ctid FROM {q} WHERE until <= clock_timestamp() LIMIT 1000))
                     RETURNING 1
                 )
                 SELECT count(*) FROM reaped"
            ),
            limits: super::limit::LimitStatements::new(config),
            sequence: config.lock_sequence.quoted(),
            channel: config.lease_channel.as_str().to_owned(),
            poll_only: config.poll_only(),
            election_channel: config.election_channel.as_str().to_owned(),
            list_and_line: String::new(),
        };
        table.list_and_line = super::look::list_and_line_sql(&table.list, &table.line);
        table
    }
}
