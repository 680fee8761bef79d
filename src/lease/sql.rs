//! SQL fragments the lease statements are made of (see `statements`): the token's timeline
//! base, the grant lock, the data a grant keeps, the waiters' line, announcements, and the batch statements'
//! arrays.

/// What a grant's token adds to the sequence's value: the server's WAL timeline, less one, times
/// 2^40 (0 on a cluster that never failed over). A promoted standby starts a new timeline, so its
/// tokens are above every earlier one, even when asynchronous replication left its copy of the
/// sequence behind (the failover scenario saw two holders of token 1 without it). Tokens keep
/// increasing while a timeline grants fewer than 2^40 leases.
pub(super) const TIMELINE_BASE: &str =
    "(((('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint) - 1) << 40)";

/// The grant lock of lease `name` (an SQL expression), for the table of sequence `sequence`
/// (a parameter naming it): a transaction advisory lock on the name's 64-bit hash, seeded with
/// the sequence's oid, taken without waiting. A grant statement takes it before it draws its
/// token and holds it until it commits, so two grants of one name never overlap in time and
/// the later one draws the greater token.
///
/// Why the row lock is not enough: PostgreSQL evaluates an `INSERT`'s values, the token among
/// them, before it looks for a conflicting row, and keeps them through the waits and retries of
/// `ON CONFLICT`. Without the grant lock, a statement stalled there (a lock wait, the scheduler) could
/// insert its token after a later grant's tenure had come and gone: a token lower than the
/// previous tenure's (seen in the contention scenario; tested by the `tokens` tests). Two names
/// whose hashes collide only share a grant lock.
pub(super) fn grant_lock(name: &str, sequence: &str) -> String {
    format!("pg_try_advisory_xact_lock(hashtextextended({name}, {sequence}::regclass::oid::int8))")
}

/// The data a grant leaves in an existing row `l` (an `ON CONFLICT DO UPDATE`'s): a kept row's
/// data stays unless `replace` (an SQL condition) holds; a takeover of an expired tenure never
/// keeps the dead holder's data.
pub(super) fn data_on_grant(replace: &str) -> String {
    format!(
        "CASE WHEN l.kept AND NOT ({replace}) THEN coalesce(l.data, EXCLUDED.data)
              ELSE EXCLUDED.data END"
    )
}

/// The live waiter first in line for the lease `name` (an SQL expression), in waiters' table
/// `q`: the highest priority, then arrival order, then the waiter's name. Passing over waiter
/// `but` (an SQL expression) when given: one whose place the same statement removes, which the
/// statement itself still sees.
pub(super) fn first_in_line(q: &str, name: &str, but: Option<&str>) -> String {
    let but = but.map_or(String::new(), |waiter| format!(" AND w.waiter <> {waiter}"));
    format!(
        "SELECT w.waiter FROM {q} AS w WHERE w.name = {name} AND w.until > clock_timestamp(){but}
         ORDER BY w.priority DESC, w.queued_at, w.waiter LIMIT 1"
    )
}

/// Whether `owner` may be granted `name` as far as the line goes: nobody waits, or it is first.
pub(super) fn may_go(q: &str, name: &str, owner: &str) -> String {
    let first = first_in_line(q, name, None);
    format!("coalesce(({first}), {owner}) = {owner}")
}

/// The payload announcing that lease `name` (an SQL expression) is free: its length in bytes, a
/// colon, the name, and the waiter first in line for it in `q` other than `leaving` (an SQL
/// expression), if any (see `Released`).
pub(super) fn announce(q: &str, name: &str, leaving: Option<&str>) -> String {
    format!(
        "octet_length({name})::text || ':' || {name} || coalesce(({}), '')",
        first_in_line(q, name, leaving)
    )
}

/// The CTEs that put waiter `$2` in line for `$1` for `$ms` milliseconds with priority
/// `priority` in waiters' table `q`, keeping its place when it has a live one (its priority as
/// now given), and drop other waiters whose place lapsed; only when `when` (an SQL condition)
/// holds.
pub(super) fn line_up(q: &str, ms: &str, priority: &str, when: &str) -> String {
    format!(
        "pruned AS (
             DELETE FROM {q} WHERE name = $1 AND waiter <> $2
               AND until <= clock_timestamp() AND {when}
         ), queued AS (
             INSERT INTO {q} AS w (name, waiter, queued_at, until, priority)
             SELECT $1, $2, clock_timestamp(), clock_timestamp() + {ms} * interval '1 millisecond',
                    {priority}
             WHERE {when}
             ON CONFLICT (name, waiter) DO UPDATE SET
                 until = EXCLUDED.until,
                 priority = EXCLUDED.priority,
                 queued_at = CASE WHEN w.until <= clock_timestamp() THEN EXCLUDED.queued_at
                                  ELSE w.queued_at END
         )"
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

/// How a batch statement finds its rows in the lock table (`l`): by the array of names, an index
/// condition whatever the table's size. Joined to `req` instead, the generic plan (guessing ten
/// names) scanned tables of up to 2,000–3,000 rows into a hash (measured: 0.72 ms against 0.28
/// ms for 8 names among 2,000). Tested by `batch_statements_find_their_rows_by_index_in_a_large_lock_table`.
pub(super) const BY_NAME: &str = "l.name = ANY(args.names)";

/// Milliseconds left until `expires_at` on the server's clock, never negative.
pub(super) const REMAINING_MS: &str =
    "greatest(0, (extract(epoch FROM l.expires_at - clock_timestamp()) * 1000))::bigint";
