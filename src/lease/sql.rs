//! SQL fragments the lease statements are made of (see `statements`): the token's timeline
//! base, the waiters' line, handover to the first in line, announcements, and the batch
//! statements' arrays.

/// What a grant's token adds to the sequence's value: the server's current WAL timeline, less
/// one, times 2^40. On a cluster that never failed over it is 0, so tokens are the sequence's
/// values. A promoted standby starts a new timeline, so every token it grants is greater than
/// every token granted before the failover — even when asynchronous replication left its copy
/// of the sequence behind, which would otherwise hand out the same tokens again (measured by the
/// failover scenario: the old holder and the new one both held token 1, and the old holder's
/// renewals and fenced writes matched the new holder's row). Tokens keep strictly increasing as
/// long as a timeline grants fewer than 2^40 leases.
pub(super) const TIMELINE_BASE: &str =
    "(((('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint) - 1) << 40)";

/// The payload announcing the release of `released.name` (see `Released`): the name's length in
/// bytes, a colon, the name, and the waiter first in line for it (queue table `q`), if any, other
/// than `releaser` (an SQL expression: the owner that held it, whose own place the release
/// removes).
pub(super) fn announce(q: &str, releaser: &str) -> String {
    format!(
        "octet_length(released.name)::text || ':' || released.name
         || coalesce(({}), '')",
        first_in_line_but(q, "released.name", releaser)
    )
}

/// What a waiter's place stores of the grant a release may hand it (see [`hand_over`]): its
/// lease in milliseconds, its data, whether that data replaces a kept row's, and the nonce of
/// the attempt that wrote it, which the handover's announcement carries — four SQL expressions.
pub(super) struct Grantable<'a> {
    pub(super) lease_ms: &'a str,
    pub(super) data: &'a str,
    pub(super) replace_data: &'a str,
    pub(super) nonce: &'a str,
}

/// A place that stores no grant: it is announced, never handed the lease.
pub(super) const NOT_GRANTABLE: Grantable<'static> = Grantable {
    lease_ms: "NULL::bigint",
    data: "NULL::bytea",
    replace_data: "false",
    nonce: "NULL::bigint",
};

/// The CTEs that put waiter `owner` in line for `name` for `ms` milliseconds, in queue table
/// `q`, keeping its place when it has a live one (and storing `grant` with it), and prune other
/// waiters whose place lapsed; only when `when` (an SQL condition) holds. Shared by `enqueue`
/// and `acquire_or_queue`.
pub(super) fn line_up(
    q: &str,
    name: &str,
    owner: &str,
    ms: &str,
    grant: Grantable,
    when: &str,
) -> String {
    let Grantable {
        lease_ms,
        data,
        replace_data,
        nonce,
    } = grant;
    format!(
        "pruned AS (
             DELETE FROM {q} WHERE name = {name} AND waiter <> {owner}
               AND until <= clock_timestamp() AND {when}
         ), queued AS (
             INSERT INTO {q} AS w
                 (name, waiter, queued_at, until, lease_ms, data, replace_data, nonce)
             SELECT {name}, {owner}, clock_timestamp(),
                    clock_timestamp() + {ms} * interval '1 millisecond',
                    {lease_ms}, {data}, {replace_data}, {nonce}
             WHERE {when}
             ON CONFLICT (name, waiter) DO UPDATE SET
                 until = EXCLUDED.until, lease_ms = EXCLUDED.lease_ms, data = EXCLUDED.data,
                 replace_data = EXCLUDED.replace_data, nonce = EXCLUDED.nonce,
                 queued_at = CASE WHEN w.until <= clock_timestamp() THEN EXCLUDED.queued_at
                                  ELSE w.queued_at END
         )"
    )
}

/// The CTEs of a release that hand the lease straight to the waiter first in line: `handed`
/// grants it (owner, a new token, the waiter's lease and data) and returns name, owner, token,
/// the lock table's oid and the nonce of the waiter's place, and `served` takes that waiter out
/// of the line. `heirs` is a CTE with, per lease being released, its `name`, `token` and `keep`
/// flag and its first live waiter (`waiter`, `lease_ms`, `heir_data`, `replace_data`,
/// `heir_nonce`); `sequence` the SQL of the token sequence.
///
/// The handed lease expires its lease after the moment the row is written
/// (`clock_timestamp()`), not after the transaction's start (`now()`): the place it was handed
/// to was read before that moment, so the waiter's attempt that wrote it was sent earlier still,
/// and a waiter counting its deadline from that attempt counts from before the grant. From the
/// transaction's start, a release inside a long transaction (or one queued behind a table lock)
/// could have set an expiry earlier than the waiter's deadline.
///
/// Only a waiter that stored its grant is handed the lease, and only when the data the grant
/// would have is the waiter's own (the row goes, or the waiter replaces its data, or it has
/// none): its process then holds the lease from the announcement alone. Otherwise the release
/// is announced naming that waiter, which asks itself, as before handover.
pub(super) fn hand_over(t: &str, q: &str, heirs: &str, sequence: &str) -> String {
    format!(
        "handed AS (
             UPDATE {t} AS l SET owner = h.waiter, token = {TIMELINE_BASE} + nextval({sequence}),
                 data = h.heir_data, acquired_at = now(),
                 expires_at = clock_timestamp() + h.lease_ms * interval '1 millisecond',
                 kept = false
             FROM {heirs} AS h
             WHERE l.name = h.name AND l.token = h.token AND h.lease_ms IS NOT NULL
               AND (NOT h.keep OR h.replace_data OR l.data IS NULL)
             RETURNING l.name, l.owner, l.token, l.tableoid, h.heir_nonce AS nonce
         ), served AS (
             DELETE FROM {q} AS w USING handed
             WHERE w.name = handed.name AND w.waiter = handed.owner
         )"
    )
}

/// The payload announcing that `handed.name` was handed to `handed.owner` with `handed.token`
/// in the lock table `handed.tableoid` (see `Released`): the name's length in bytes, `>`, the
/// name, the token, `@`, the table's oid, then `#` and the nonce of the waiter's place when it
/// stored one, a colon, the owner. The oid tells the lock tables that share a channel apart
/// (one name in two schemas share the default channel), so a handover is never taken for a
/// lease of another table; the nonce tells the waiter the grant is its current wait's.
pub(super) const HANDED_OVER: &str = "octet_length(handed.name)::text || '>' || handed.name
     || handed.token::text || '@' || handed.tableoid::text
     || coalesce('#' || handed.nonce::text, '') || ':' || handed.owner";

/// The live waiter first in line for `name` (an SQL expression), in queue table `q`, other than
/// `releaser` (see `announce`), with what its place stores of its grant: `waiter`, `lease_ms`,
/// `heir_data`, `replace_data`, `heir_nonce`.
pub(super) fn heir(q: &str, name: &str, releaser: &str) -> String {
    let columns =
        "w.waiter, w.lease_ms, w.data AS heir_data, w.replace_data, w.nonce AS heir_nonce";
    line_head(q, name, columns, Some(releaser))
}

/// `first_in_line`, passing over `releaser`'s place (see `announce`).
pub(super) fn first_in_line_but(q: &str, name: &str, releaser: &str) -> String {
    line_head(q, name, "w.waiter", Some(releaser))
}

/// The live waiter first in line for the lease `name` (an SQL expression), in queue table `q`.
pub(super) fn first_in_line(q: &str, name: &str) -> String {
    line_head(q, name, "w.waiter", None)
}

/// `columns` of the live waiter (`w`) first in line for `name` in queue table `q`, passing over
/// the waiter `but` (an SQL expression) when given: arrival order, then the waiter's name.
fn line_head(q: &str, name: &str, columns: &str, but: Option<&str>) -> String {
    let but = but.map_or(String::new(), |waiter| format!(" AND w.waiter <> {waiter}"));
    format!(
        "SELECT {columns} FROM {q} AS w WHERE w.name = {name} AND w.until > clock_timestamp(){but}
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
pub(super) fn batch_request(fields: &[(&str, &str, &str)]) -> String {
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
pub(super) const BY_NAME: &str = "l.name = ANY(args.names)";

/// Milliseconds left until `expires_at` on the server's clock, never negative.
pub(super) const REMAINING_MS: &str =
    "greatest(0, (extract(epoch FROM l.expires_at - clock_timestamp()) * 1000))::bigint";
