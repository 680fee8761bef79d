//! The SQL of the lease statements, rendered once per configured table.

use super::LeaseTable;
use crate::config::Config;

/// What a grant's token adds to the sequence's value: the server's current WAL timeline, less
/// one, times 2^40. On a cluster that never failed over it is 0, so tokens are the sequence's
/// values. A promoted standby starts a new timeline, so every token it grants is greater than
/// every token granted before the failover — even when asynchronous replication left its copy
/// of the sequence behind, which would otherwise hand out the same tokens again (measured by the
/// failover scenario: the old holder and the new one both held token 1, and the old holder's
/// renewals and fenced writes matched the new holder's row). Tokens keep strictly increasing as
/// long as a timeline grants fewer than 2^40 leases.
const TIMELINE_BASE: &str =
    "(((('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint) - 1) << 40)";

/// The payload announcing the release of `released.name` (see `Released`): the name's length in
/// bytes, a colon, the name, and the waiter first in line for it (queue table `q`), if any, other
/// than `releaser` (an SQL expression: the owner that held it, whose own place the release
/// removes).
fn announce(q: &str, releaser: &str) -> String {
    format!(
        "octet_length(released.name)::text || ':' || released.name
         || coalesce(({}), '')",
        first_in_line_but(q, "released.name", releaser)
    )
}

/// What a waiter's place stores of the grant a release may hand it (see [`hand_over`]): its
/// lease in milliseconds, its data and whether that data replaces a kept row's — three SQL
/// expressions.
struct Grantable<'a> {
    lease_ms: &'a str,
    data: &'a str,
    replace_data: &'a str,
}

/// A place that stores no grant: it is announced, never handed the lease.
const NOT_GRANTABLE: Grantable<'static> = Grantable {
    lease_ms: "NULL::bigint",
    data: "NULL::bytea",
    replace_data: "false",
};

/// The CTEs that put waiter `owner` in line for `name` for `ms` milliseconds, in queue table
/// `q`, keeping its place when it has a live one (and storing `grant` with it), and prune other
/// waiters whose place lapsed; only when `when` (an SQL condition) holds. Shared by `enqueue`
/// and `acquire_or_queue`.
fn line_up(q: &str, name: &str, owner: &str, ms: &str, grant: Grantable, when: &str) -> String {
    let Grantable {
        lease_ms,
        data,
        replace_data,
    } = grant;
    format!(
        "pruned AS (
             DELETE FROM {q} WHERE name = {name} AND waiter <> {owner}
               AND until <= clock_timestamp() AND {when}
         ), queued AS (
             INSERT INTO {q} AS w (name, waiter, queued_at, until, lease_ms, data, replace_data)
             SELECT {name}, {owner}, clock_timestamp(),
                    clock_timestamp() + {ms} * interval '1 millisecond',
                    {lease_ms}, {data}, {replace_data}
             WHERE {when}
             ON CONFLICT (name, waiter) DO UPDATE SET
                 until = EXCLUDED.until, lease_ms = EXCLUDED.lease_ms, data = EXCLUDED.data,
                 replace_data = EXCLUDED.replace_data,
                 queued_at = CASE WHEN w.until <= clock_timestamp() THEN EXCLUDED.queued_at
                                  ELSE w.queued_at END
         )"
    )
}

/// The CTEs of a release that hand the lease straight to the waiter first in line: `handed`
/// grants it (owner, a new token, the waiter's lease and data) and returns name, owner and
/// token, and `served` takes that waiter out of the line. `heirs` is a CTE with, per lease being
/// released, its `name`, `token` and `keep` flag and its first live waiter (`waiter`,
/// `lease_ms`, `heir_data`, `replace_data`); `sequence` the SQL of the token sequence.
///
/// Only a waiter that stored its grant is handed the lease, and only when the data the grant
/// would have is the waiter's own (the row goes, or the waiter replaces its data, or it has
/// none): its process then holds the lease from the announcement alone. Otherwise the release
/// is announced naming that waiter, which asks itself, as before handover.
fn hand_over(t: &str, q: &str, heirs: &str, sequence: &str) -> String {
    format!(
        "handed AS (
             UPDATE {t} AS l SET owner = h.waiter, token = {TIMELINE_BASE} + nextval({sequence}),
                 data = h.heir_data, acquired_at = now(),
                 expires_at = now() + h.lease_ms * interval '1 millisecond', kept = false
             FROM {heirs} AS h
             WHERE l.name = h.name AND l.token = h.token AND h.lease_ms IS NOT NULL
               AND (NOT h.keep OR h.replace_data OR l.data IS NULL)
             RETURNING l.name, l.owner, l.token
         ), served AS (
             DELETE FROM {q} AS w USING handed
             WHERE w.name = handed.name AND w.waiter = handed.owner
         )"
    )
}

/// The payload announcing that `handed.name` was handed to `handed.owner` with `handed.token`
/// (see `Released`): the name's length in bytes, `>`, the name, the token, a colon, the owner.
const HANDED_OVER: &str = "octet_length(handed.name)::text || '>' || handed.name
     || handed.token::text || ':' || handed.owner";

/// The live waiter first in line for `name` (an SQL expression), in queue table `q`, other than
/// `releaser` (see `announce`), with what its place stores of its grant: `waiter`, `lease_ms`,
/// `heir_data`, `replace_data`.
fn heir(q: &str, name: &str, releaser: &str) -> String {
    format!(
        "SELECT w.waiter, w.lease_ms, w.data AS heir_data, w.replace_data FROM {q} AS w
         WHERE w.name = {name} AND w.until > clock_timestamp() AND w.waiter <> {releaser}
         ORDER BY w.queued_at, w.waiter LIMIT 1"
    )
}

/// `first_in_line`, passing over `releaser`'s place (see `announce`).
fn first_in_line_but(q: &str, name: &str, releaser: &str) -> String {
    format!(
        "SELECT w.waiter FROM {q} AS w WHERE w.name = {name} AND w.until > clock_timestamp()
           AND w.waiter <> {releaser}
         ORDER BY w.queued_at, w.waiter LIMIT 1"
    )
}

/// The live waiter first in line for the lease `name` (an SQL expression), in queue table `q`.
fn first_in_line(q: &str, name: &str) -> String {
    format!(
        "SELECT w.waiter FROM {q} AS w WHERE w.name = {name} AND w.until > clock_timestamp()
         ORDER BY w.queued_at, w.waiter LIMIT 1"
    )
}

/// The CTEs `args` and `req` of a batch statement. Each of `fields` is (array, element type,
/// field): parameter `$n` is the n-th array, `args.<array>`, and `req` has a row per batch
/// item with the fields, in order.
///
/// Why through a one-row `args` CTE and not `unnest($1, …)` directly: a prepared statement's
/// first five runs are planned for their parameters' values ("custom" plans), and PostgreSQL
/// keeps planning every run afresh while a custom plan looks cheaper than the generic one. With
/// `unnest($1)` and `= ANY($1)` the planner sees the array's length, so a batch of 1–8 names
/// always looks cheaper custom-planned, and each run paid about 0.4 ms of planning, more than
/// the statement itself (measured: a batch acquire+release of one name cost the server
/// 0.75–0.84 ms of CPU, against 0.19–0.33 ms for the single statements). Read through a CTE
/// column, the array's length is unknown to every plan, so both plans cost the same and the
/// generic one, planned once per connection, is kept.
fn batch_request(fields: &[(&str, &str, &str)]) -> String {
    let arrays: Vec<String> = (fields.iter().enumerate())
        .map(|(i, (array, ty, _))| format!("${}::{ty}[] AS {array}", i + 1))
        .collect();
    let unnested: Vec<String> = (fields.iter())
        .map(|(array, _, _)| format!("args.{array}"))
        .collect();
    let names: Vec<&str> = fields.iter().map(|(_, _, field)| *field).collect();
    format!(
        "args AS MATERIALIZED (SELECT {}), req AS (SELECT r.* FROM args, unnest({}) AS r({}))",
        arrays.join(", "),
        unnested.join(", "),
        names.join(", ")
    )
}

/// How a batch statement finds its rows in the lock table (`l`): by the array of names itself,
/// an index condition (`name = ANY(…)`) whatever the table's size. The generic plan cannot know
/// how many names a batch holds and guesses ten; joined to the `req` rows instead, it scanned
/// the whole table into a hash whenever the table looked small next to ten index probes: up to
/// 2,000–3,000 rows on PostgreSQL 15 (measured: with 2,000 leases held, an acquire batch of 8
/// names ran 0.72 ms, by the array 0.28 ms). Tested by
/// `batch_statements_find_their_rows_by_index_in_a_large_lock_table`.
const BY_NAME: &str = "l.name = ANY(args.names)";

/// Milliseconds left until `expires_at` on the server's clock, never negative.
const REMAINING_MS: &str =
    "greatest(0, (extract(epoch FROM l.expires_at - clock_timestamp()) * 1000))::bigint";

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
            // $1 name, $2 owner, $3 data, $4 lease ms, $5 replace data, $6 sequence, $7 ms.
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
            // $1 names, $2 tokens, $3 lease ms. One statement for every lease of a process; all
            // rows get the same expiry (the statement's start), which tests rely on.
            renew: format!(
                "UPDATE {t} AS l SET expires_at = now() + $3 * interval '1 millisecond'
                 FROM unnest($1::text[], $2::int8[]) AS h(name, token)
                 WHERE l.name = h.name AND l.token = h.token AND l.expires_at > clock_timestamp()
                 RETURNING l.token"
            ),
            // $1 name, $2 token, $3 keep row, $4 channel, $5 sequence. The lease goes to the
            // waiter first in line when it can (`hand_over`); otherwise the row is deleted, or
            // kept free with $3. Every branch matches on name and token only (and on $3). The
            // announcement names the waiter first in line (see `Released`), so only its process
            // needs to wake.
            release: format!(
                "WITH releaser AS (
                     SELECT owner FROM {t} WHERE name = $1 AND token = $2
                 ), heirs AS (
                     SELECT $1::text AS name, $2::bigint AS token, $3::bool AS keep, h.*
                     FROM releaser CROSS JOIN LATERAL ({heir}) AS h
                 ), {hand_over}, own_place AS (
                     DELETE FROM {q} WHERE name = $1 AND waiter = (SELECT owner FROM releaser)
                 ), deleted AS (
                     DELETE FROM {t} WHERE name = $1 AND token = $2 AND NOT $3
                       AND NOT EXISTS (SELECT 1 FROM handed)
                     RETURNING name
                 ), kept AS (
                     UPDATE {t} SET owner = NULL, token = NULL, acquired_at = NULL, expires_at = NULL,
                         kept = true
                     WHERE name = $1 AND token = $2 AND $3 AND NOT EXISTS (SELECT 1 FROM handed)
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
            // $1 names, $2 tokens, $3 keep flags, $4 channel, $5 sequence. The batch form of
            // `release`, with the same effects. Rows another transaction has locked (a renewal,
            // a fencing guard) are skipped rather than waited for, so two multi-row statements
            // never wait on each other's rows in opposite orders (a deadlock, noticed only after
            // the server's `deadlock_timeout`); their callers release alone, which waits for one
            // row.
            release_many: format!(
                "WITH {request}, locked AS (
                     SELECT l.name, l.token, l.owner, r.keep FROM args, {t} AS l
                     JOIN req AS r ON l.name = r.name AND l.token = r.token
                     WHERE {by_name}
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
            // $1 name, $2 token, $3 data, $4 channel, $5 announcement. New data for a lease held
            // with this token, announced in the same transaction: announced exactly when done.
            proclaim: format!(
                "WITH proclaimed AS (
                     UPDATE {t} SET data = $3
                     WHERE name = $1 AND token = $2 AND expires_at > clock_timestamp()
                     RETURNING name
                 )
                 SELECT pg_notify($4, $5)::text FROM proclaimed"
            ),
            // FOR KEY SHARE conflicts with the token change of a takeover and with release, not
            // with renewals, so the holder keeps renewing while a guarded transaction runs.
            fence: format!(
                "SELECT 1 FROM {t} WHERE name = $1 AND token = $2 AND expires_at > clock_timestamp()
                 FOR KEY SHARE"
            ),
            sequence: config.lock_sequence.quoted(),
            channel: config.lease_channel.as_str().to_owned(),
            election_channel: config.election_channel.as_str().to_owned(),
        }
    }
}
