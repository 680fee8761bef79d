//! Metrics through the [`metrics`] facade: counters, gauges and histograms for any recorder
//! (Prometheus, StatsD, …) the application installs. Without a recorder they cost nothing: the
//! handles are no-ops. Each actor registers its handles when it starts, so install the recorder
//! before starting pgcoord's actors. No metric carries a per-process label (an owner identity is
//! new at every start: its series would grow without bound): a process's actors add up, each
//! gauge holding the sum of their shares (a `Share` each), and telling processes apart is the
//! exporter's `instance` label.
//!
//! The names, in one place (docs/OPERATIONS.md lists them with their labels):

use std::sync::atomic::{AtomicU64, Ordering};

use metrics::{Counter, Gauge, Unit, describe_counter, describe_gauge, describe_histogram};

/// Gauge: leases a `LockManager` holds.
pub const LEASES_HELD: &str = "pgcoord_leases_held";
/// Counter: acquires (leases and semaphore permits) by `outcome`: `granted`, `not_acquired`,
/// `cancelled`, `error`.
pub const ACQUIRES: &str = "pgcoord_acquires_total";
/// Histogram, seconds: from an acquire's arrival to its grant.
pub const ACQUIRE_WAIT: &str = "pgcoord_acquire_wait_seconds";
/// Histogram, seconds: one heartbeat's renew statement.
pub const RENEW: &str = "pgcoord_renew_seconds";
/// Counter: renewals that failed and were retried.
pub const RENEW_FAILURES: &str = "pgcoord_renew_failures_total";
/// Counter: locks lost, by `kind` (`lease`, `advisory`) and `reason` (`taken_over`,
/// `deadline_passed`, `connection_lost`, `stalled`, `shutdown`).
pub const LOSSES: &str = "pgcoord_losses_total";
/// Counter: connections asked of the pool, by `result`: `direct` (one was idle), `waited`,
/// `timed_out` (none within the pool timeout).
pub const POOL_GETS: &str = "pgcoord_pool_gets_total";
/// Histogram, seconds: each checkout of a pooled connection, from its start to its connection
/// (near 0 when one was idle), its error or its caller giving up.
pub const POOL_WAIT: &str = "pgcoord_pool_wait_seconds";
/// Gauge: pooled connections, by `state` (`used`, `idle`: their sum is the open ones).
pub const POOL_CONNECTIONS: &str = "pgcoord_pool_connections";
/// Gauge: the most connections the pool opens.
pub const POOL_MAX: &str = "pgcoord_pool_max_connections";
/// Gauge: checkouts under way, waiting for a pooled connection.
pub const POOL_PENDING: &str = "pgcoord_pool_pending_checkouts";
/// Gauge: advisory locks held (each on a session of its own).
pub const ADVISORY_HELD: &str = "pgcoord_advisory_locks_held";
/// Gauge: 1 while the listener is connected with every LISTEN confirmed, else 0.
pub const LISTENER_CONNECTED: &str = "pgcoord_listener_connected";
/// Counter: listener connections opened, the first included.
pub const LISTENER_CONNECTIONS: &str = "pgcoord_listener_connections_total";
/// Counter: notifications the listener handled, by `result`: `delivered` (per subscriber or
/// waiter), `overflowed` (a subscriber's mailbox was full), `garbage`, `undeliverable` (stored
/// payload unavailable), `unmatched_reply`.
pub const NOTIFICATIONS: &str = "pgcoord_notifications_total";
/// Gauge: requests waiting for their reply.
pub const PENDING_REQUESTS: &str = "pgcoord_pending_requests";

/// Counter: events a topic consumer handed to its handler, by `topic`, `consumer` and `result`
/// (`handled`, `failed`: handed over again).
pub const TOPIC_DELIVERIES: &str = "pgcoord_topic_deliveries_total";
/// Counter: acks that moved a topic consumer's cursor, by `topic` and `consumer`.
pub const TOPIC_ACKS: &str = "pgcoord_topic_acks_total";
/// Histogram, seconds: from an event's append to its handover to the handler (the consumer's
/// lag in time), by `topic` and `consumer`.
pub const TOPIC_LAG: &str = "pgcoord_topic_lag_seconds";

/// Counter: events handed to a topic consumer's handler again, by `topic` and `consumer`: after
/// a handler's `Err`, or after this process lost the consumer's lease before its ack.
pub const TOPIC_REDELIVERIES: &str = "pgcoord_topic_redeliveries_total";
/// Counter: events appended through the runtime (`Coordinator::append`), by `result` (`appended`,
/// `failed`). Appends in an application's own transaction (`TopicTable::append`) are not seen.
pub const TOPIC_APPENDS: &str = "pgcoord_topic_appends_total";

/// Gauge, seconds: the age of the oldest transaction on the server, which holds every topic
/// reader back (no reader reads past what was appended since it began), by `topic` and
/// `consumer`, as a caught-up consumer last looked (every ten polls, at most every 10 s).
pub const TOPIC_HELD_BACK: &str = "pgcoord_topic_held_back_seconds";
/// Gauge: the events a topic consumer could read now and has not handled, as its active
/// instance last knew (exact after a read that was not full; counted, up to a million, at most
/// every 10 s behind a full one), by `topic` and `consumer`. 0 while no instance of this process
/// is active.
pub const TOPIC_LAG_EVENTS: &str = "pgcoord_topic_lag_events";

/// Gauge: keys a worker pool's process holds, by `pool`.
pub const WORKER_KEYS: &str = "pgcoord_worker_keys_held";
/// Counter: keys a worker pool's process claimed or let go, by `pool` and `direction`
/// (`claimed`, `released`).
pub const WORKER_MOVES: &str = "pgcoord_worker_key_moves_total";
/// Counter: messages a `KeyRouter` sent to a key's worker, by `pool` and `outcome` (`handled`:
/// an ask answered, `accepted`: a tell in the worker's mailbox, `failed`: the worker's error or
/// the runtime's, `timeout`: may have been handled, `not_delivered`: no holder in time).
pub const ROUTED: &str = "pgcoord_routed_messages_total";
/// Gauge: told messages in a pool's workers' mailboxes, not yet handled, by `pool` (at most
/// 16 a worker).
pub const WORKER_TOLD: &str = "pgcoord_worker_told_waiting";
/// Histogram, seconds: a routed ask or tell from the call to its answer, by `pool`.
pub const ROUTED_SECONDS: &str = "pgcoord_routed_seconds";
/// Counter: a durable pool's mail handed to its workers, by `pool` and `result` (`handled`,
/// `failed`: the worker's `Err` or a stopped worker; it comes again).
pub const WORKER_MAIL: &str = "pgcoord_worker_mail_total";
/// Histogram, seconds: from a mail's append to its handover to the key's worker, by `pool`.
pub const WORKER_MAIL_LAG: &str = "pgcoord_worker_mail_lag_seconds";

/// Counter: runs of a schedule's ticks in this process, by `schedule` and `outcome` (`done`,
/// `failed`: to be retried or abandoned, `abandoned`, `taken_over`: another process took the
/// tick over before this run finished).
pub const SCHEDULE_RUNS: &str = "pgcoord_schedule_runs_total";

/// Counter: rate-limit statements, by `outcome` (`granted`: something granted; `refused`:
/// nothing). Waiters on one key share one per round. No key label: keys are unbounded.
pub const RATE_TAKES: &str = "pgcoord_rate_takes_total";

/// Counter: rate-limit permits granted.
pub const RATE_PERMITS: &str = "pgcoord_rate_permits_total";

/// Histogram buckets, seconds, for a statement or a round trip: 0.5 ms to 30 s (a pool's
/// default timeout); [`RENEW`], [`POOL_WAIT`], [`ROUTED_SECONDS`].
pub const LATENCY_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// Histogram buckets, seconds, for a wait in line or a lag behind a backlog: 1 ms to an hour;
/// [`ACQUIRE_WAIT`], [`TOPIC_LAG`], [`WORKER_MAIL_LAG`].
pub const WAIT_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0,
];

/// Every histogram with its buckets. Exporters that need buckets set ahead (Prometheus: without
/// them `metrics-exporter-prometheus` renders summaries, which cannot be summed across
/// instances) take them from here:
///
/// ```ignore
/// let mut builder = metrics_exporter_prometheus::PrometheusBuilder::new();
/// for (name, buckets) in pgcoord_actors::metrics::BUCKETS {
///     builder = builder.set_buckets_for_metric(Matcher::Full(name.to_string()), buckets)?;
/// }
/// ```
pub const BUCKETS: [(&str, &[f64]); 6] = [
    (ACQUIRE_WAIT, WAIT_BUCKETS),
    (RENEW, LATENCY_BUCKETS),
    (POOL_WAIT, LATENCY_BUCKETS),
    (TOPIC_LAG, WAIT_BUCKETS),
    (ROUTED_SECONDS, LATENCY_BUCKETS),
    (WORKER_MAIL_LAG, WAIT_BUCKETS),
];

/// Every name above, for the documentation's table and its test.
pub const ALL: [&str; 33] = [
    LEASES_HELD,
    ACQUIRES,
    ACQUIRE_WAIT,
    RENEW,
    RENEW_FAILURES,
    LOSSES,
    POOL_CONNECTIONS,
    POOL_GETS,
    POOL_WAIT,
    POOL_MAX,
    POOL_PENDING,
    ADVISORY_HELD,
    LISTENER_CONNECTED,
    LISTENER_CONNECTIONS,
    NOTIFICATIONS,
    PENDING_REQUESTS,
    TOPIC_DELIVERIES,
    TOPIC_ACKS,
    TOPIC_LAG,
    TOPIC_REDELIVERIES,
    TOPIC_APPENDS,
    TOPIC_HELD_BACK,
    TOPIC_LAG_EVENTS,
    WORKER_KEYS,
    WORKER_MOVES,
    WORKER_TOLD,
    ROUTED,
    ROUTED_SECONDS,
    WORKER_MAIL,
    WORKER_MAIL_LAG,
    SCHEDULE_RUNS,
    RATE_TAKES,
    RATE_PERMITS,
];

/// Gives the recorder each metric's unit and help text. Called whenever an actor registers its
/// handles (a few times per process), so a recorder installed before then has them.
pub(crate) fn describe() {
    describe_leases();
    describe_signals();
    describe_topics();
    describe_workers();
}

/// Leases, losses and the pool.
fn describe_leases() {
    describe_gauge!(LEASES_HELD, Unit::Count, "leases a LockManager holds");
    describe_counter!(
        ACQUIRES,
        Unit::Count,
        "lease and permit acquires, by outcome"
    );
    describe_histogram!(
        ACQUIRE_WAIT,
        Unit::Seconds,
        "from an acquire's arrival to its grant"
    );
    describe_histogram!(RENEW, Unit::Seconds, "one heartbeat's renew statement");
    describe_counter!(
        RENEW_FAILURES,
        Unit::Count,
        "renewals that failed and were retried"
    );
    describe_counter!(LOSSES, Unit::Count, "locks lost, by kind and reason");
    describe_gauge!(
        POOL_CONNECTIONS,
        Unit::Count,
        "pooled connections, by state"
    );
    describe_counter!(
        POOL_GETS,
        Unit::Count,
        "connections asked of the pool, by result: direct, waited, timed_out"
    );
    describe_histogram!(
        POOL_WAIT,
        Unit::Seconds,
        "each checkout of a pooled connection, from its start to its end"
    );
    describe_gauge!(POOL_MAX, Unit::Count, "the most connections the pool opens");
    describe_gauge!(
        POOL_PENDING,
        Unit::Count,
        "checkouts waiting for a pooled connection"
    );
}

/// Advisory locks, the listener and requests.
fn describe_signals() {
    describe_gauge!(ADVISORY_HELD, Unit::Count, "advisory locks held");
    describe_gauge!(
        LISTENER_CONNECTED,
        "1 while the listener is connected and listening"
    );
    describe_counter!(
        LISTENER_CONNECTIONS,
        Unit::Count,
        "listener connections opened"
    );
    describe_counter!(
        NOTIFICATIONS,
        Unit::Count,
        "notifications handled, by result"
    );
    describe_gauge!(
        PENDING_REQUESTS,
        Unit::Count,
        "requests waiting for their reply"
    );
}

/// Durable topics.
fn describe_topics() {
    describe_counter!(
        TOPIC_DELIVERIES,
        Unit::Count,
        "events handed to a consumer's handler, by result"
    );
    describe_counter!(
        TOPIC_ACKS,
        Unit::Count,
        "acks that moved a consumer's cursor"
    );
    describe_histogram!(
        TOPIC_LAG,
        Unit::Seconds,
        "from an event's append to its handover"
    );
    describe_counter!(
        TOPIC_REDELIVERIES,
        Unit::Count,
        "events handed to a handler again"
    );
    describe_counter!(
        TOPIC_APPENDS,
        Unit::Count,
        "appends through the runtime, by result"
    );
    describe_gauge!(
        TOPIC_HELD_BACK,
        Unit::Seconds,
        "age of the oldest transaction, which holds topic readers back"
    );
    describe_gauge!(
        TOPIC_LAG_EVENTS,
        Unit::Count,
        "events a consumer could read now and has not handled"
    );
}

/// Worker pools, schedules and rate limits.
fn describe_workers() {
    describe_gauge!(
        WORKER_KEYS,
        Unit::Count,
        "keys a worker pool's process holds"
    );
    describe_counter!(
        WORKER_MOVES,
        Unit::Count,
        "keys a worker pool's process claimed or let go"
    );
    describe_gauge!(
        WORKER_TOLD,
        Unit::Count,
        "told messages in a pool's workers' mailboxes, not yet handled"
    );
    describe_counter!(
        ROUTED,
        Unit::Count,
        "messages routed to a key's worker, by outcome"
    );
    describe_histogram!(
        ROUTED_SECONDS,
        Unit::Seconds,
        "a routed ask or tell from the call to its answer"
    );
    describe_counter!(
        WORKER_MAIL,
        Unit::Count,
        "a durable pool's mail handed to its workers, by result"
    );
    describe_histogram!(
        WORKER_MAIL_LAG,
        Unit::Seconds,
        "from a mail's append to its handover to the key's worker"
    );
    describe_counter!(
        SCHEDULE_RUNS,
        Unit::Count,
        "runs of a schedule's ticks, by outcome"
    );
    describe_counter!(
        RATE_TAKES,
        Unit::Count,
        "rate-limit statements, by whether they granted anything"
    );
    describe_counter!(RATE_PERMITS, Unit::Count, "rate-limit permits granted");
}

/// One actor's share of a gauge that several actors of the process add to: setting it moves the
/// gauge by the difference, and dropping it takes the share back out, so two managers in one
/// process sum instead of overwriting each other, and a stopped one leaves nothing behind.
pub(crate) struct Share {
    gauge: Gauge,
    mine: AtomicU64,
}

impl Share {
    pub(super) fn new(gauge: Gauge) -> Share {
        Share {
            gauge,
            mine: AtomicU64::new(0f64.to_bits()),
        }
    }

    /// This actor's value now.
    pub(crate) fn set(&self, value: f64) {
        let before = f64::from_bits(self.mine.swap(value.to_bits(), Ordering::Relaxed));
        self.gauge.increment(value - before);
    }
}

impl Drop for Share {
    fn drop(&mut self) {
        self.gauge
            .decrement(f64::from_bits(self.mine.load(Ordering::Relaxed)));
    }
}

/// A counter fed from a running total kept elsewhere (bb8's statistics): each new total adds
/// what it grew by, so the totals of several pools sum.
pub(super) struct Tally {
    counter: Counter,
    seen: AtomicU64,
}

impl Tally {
    pub(super) fn new(counter: Counter) -> Tally {
        Tally {
            counter,
            seen: AtomicU64::new(0),
        }
    }

    pub(super) fn to(&self, total: u64) {
        let before = self.seen.swap(total, Ordering::Relaxed);
        self.counter.increment(total.saturating_sub(before));
    }
}

mod handles;

pub(crate) use handles::*;
