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
use std::time::Duration;

use metrics::{
    Counter, Gauge, Histogram, Unit, counter, describe_counter, describe_gauge, describe_histogram,
    gauge, histogram,
};

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
/// Counter, microseconds: time spent waiting for a pooled connection.
pub const POOL_WAIT: &str = "pgcoord_pool_wait_microseconds_total";
/// Gauge: pooled connections, by `state` (`used`, `idle`: their sum is the open ones).
pub const POOL_CONNECTIONS: &str = "pgcoord_pool_connections";
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
/// Counter: events appended through the runtime's `TopicAppender`, by `result` (`appended`,
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

/// Every name above, for the documentation's table and its test.
pub const ALL: [&str; 31] = [
    LEASES_HELD,
    ACQUIRES,
    ACQUIRE_WAIT,
    RENEW,
    RENEW_FAILURES,
    LOSSES,
    POOL_CONNECTIONS,
    POOL_GETS,
    POOL_WAIT,
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
    describe_counter!(
        POOL_WAIT,
        Unit::Microseconds,
        "time spent waiting for a pooled connection"
    );
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
    fn new(gauge: Gauge) -> Share {
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
struct Tally {
    counter: Counter,
    seen: AtomicU64,
}

impl Tally {
    fn new(counter: Counter) -> Tally {
        Tally {
            counter,
            seen: AtomicU64::new(0),
        }
    }

    fn to(&self, total: u64) {
        let before = self.seen.swap(total, Ordering::Relaxed);
        self.counter.increment(total.saturating_sub(before));
    }
}

/// A `LockManager`'s handles.
pub(crate) struct LeaseMetrics {
    pub(crate) held: Share,
    granted: Counter,
    not_acquired: Counter,
    cancelled: Counter,
    failed: Counter,
    wait: Histogram,
    pub(crate) renew: Histogram,
    pub(crate) renew_failures: Counter,
    pool_used: Share,
    pool_idle: Share,
    pool_direct: Tally,
    pool_waited: Tally,
    pool_timed_out: Tally,
    pool_wait: Tally,
}

impl LeaseMetrics {
    pub(crate) fn new() -> LeaseMetrics {
        describe();
        let acquires = |outcome: &'static str| counter!(ACQUIRES, "outcome" => outcome);
        let gets = |result: &'static str| Tally::new(counter!(POOL_GETS, "result" => result));
        LeaseMetrics {
            held: Share::new(gauge!(LEASES_HELD)),
            granted: acquires("granted"),
            not_acquired: acquires("not_acquired"),
            cancelled: acquires("cancelled"),
            failed: acquires("error"),
            wait: histogram!(ACQUIRE_WAIT),
            renew: histogram!(RENEW),
            renew_failures: counter!(RENEW_FAILURES),
            pool_used: Share::new(gauge!(POOL_CONNECTIONS, "state" => "used")),
            pool_idle: Share::new(gauge!(POOL_CONNECTIONS, "state" => "idle")),
            pool_direct: gets("direct"),
            pool_waited: gets("waited"),
            pool_timed_out: gets("timed_out"),
            pool_wait: Tally::new(counter!(POOL_WAIT)),
        }
    }

    pub(crate) fn granted(&self, waited: Duration) {
        self.granted.increment(1);
        self.wait.record(waited.as_secs_f64());
    }

    pub(crate) fn failed(&self, error: &pgcoord::Error) {
        if error.is_not_acquired() {
            self.not_acquired.increment(1);
        } else {
            self.failed.increment(1);
        }
    }

    pub(crate) fn cancelled(&self) {
        self.cancelled.increment(1);
    }

    pub(crate) fn pool(&self, pool: &pgcoord::Pool) {
        // Used and idle, which sum to the open connections (as OpenTelemetry's `state`).
        let (open, idle) = pool.connections();
        self.pool_used.set(f64::from(open.saturating_sub(idle)));
        self.pool_idle.set(f64::from(idle));
        // bb8 counts since the pool was built: the counters add what its totals grew by.
        let counts = pool.statistics();
        self.pool_direct.to(counts.get_direct);
        self.pool_waited.to(counts.get_waited);
        self.pool_timed_out.to(counts.get_timed_out);
        let waited = u64::try_from(counts.get_wait_time.as_micros()).unwrap_or(u64::MAX);
        self.pool_wait.to(waited);
    }
}

/// A `ListenerActor`'s handles.
pub(crate) struct ListenerMetrics {
    pub(crate) connected: Share,
    pub(crate) connections: Counter,
    pub(crate) delivered: Counter,
    pub(crate) overflowed: Counter,
    pub(crate) garbage: Counter,
    pub(crate) undeliverable: Counter,
    pub(crate) unmatched_reply: Counter,
    pub(crate) pending: Share,
}

impl ListenerMetrics {
    pub(crate) fn new() -> ListenerMetrics {
        describe();
        let notifications = |result: &'static str| counter!(NOTIFICATIONS, "result" => result);
        ListenerMetrics {
            connected: Share::new(gauge!(LISTENER_CONNECTED)),
            connections: counter!(LISTENER_CONNECTIONS),
            delivered: notifications("delivered"),
            overflowed: notifications("overflowed"),
            garbage: notifications("garbage"),
            undeliverable: notifications("undeliverable"),
            unmatched_reply: notifications("unmatched_reply"),
            pending: Share::new(gauge!(PENDING_REQUESTS)),
        }
    }
}

/// Counts one lost lock (rare: the handle is made per loss).
pub(crate) fn loss(kind: &'static str, reason: &'static str) {
    counter!(LOSSES, "kind" => kind, "reason" => reason).increment(1);
}

/// An `AdvisoryLocks`' handle.
pub(crate) fn advisory_held() -> Share {
    describe();
    Share::new(gauge!(ADVISORY_HELD))
}

/// A `TopicConsumer`'s handles.
pub(crate) struct TopicMetrics {
    pub(crate) handled: Counter,
    pub(crate) failed: Counter,
    pub(crate) acks: Counter,
    pub(crate) lag: Histogram,
    pub(crate) redelivered: Counter,
    pub(crate) held_back: Share,
    pub(crate) lag_events: Share,
}

impl TopicMetrics {
    pub(crate) fn new(topic: &str, consumer: &str) -> TopicMetrics {
        describe();
        let labels = [
            ("topic", topic.to_owned()),
            ("consumer", consumer.to_owned()),
        ];
        let deliveries = |result: &'static str| {
            let mut labels = labels.to_vec();
            labels.push(("result", result.to_owned()));
            counter!(TOPIC_DELIVERIES, &labels)
        };
        TopicMetrics {
            handled: deliveries("handled"),
            failed: deliveries("failed"),
            acks: counter!(TOPIC_ACKS, &labels),
            lag: histogram!(TOPIC_LAG, &labels),
            redelivered: counter!(TOPIC_REDELIVERIES, &labels),
            held_back: Share::new(gauge!(TOPIC_HELD_BACK, &labels)),
            lag_events: Share::new(gauge!(TOPIC_LAG_EVENTS, &labels)),
        }
    }
}

/// A schedule runner's handles.
pub(crate) struct ScheduleMetrics {
    pub(crate) done: Counter,
    pub(crate) failed: Counter,
    pub(crate) abandoned: Counter,
    pub(crate) taken_over: Counter,
}

impl ScheduleMetrics {
    pub(crate) fn new(schedule: &str) -> ScheduleMetrics {
        describe();
        let runs = |outcome: &'static str| {
            let labels = [
                ("schedule", schedule.to_owned()),
                ("outcome", outcome.to_owned()),
            ];
            counter!(SCHEDULE_RUNS, &labels)
        };
        ScheduleMetrics {
            done: runs("done"),
            failed: runs("failed"),
            abandoned: runs("abandoned"),
            taken_over: runs("taken_over"),
        }
    }
}

/// A `TopicAppender`'s handles.
pub(crate) struct AppendMetrics {
    pub(crate) appended: Counter,
    pub(crate) failed: Counter,
}

impl AppendMetrics {
    pub(crate) fn new() -> AppendMetrics {
        describe();
        let appends = |result: &'static str| counter!(TOPIC_APPENDS, "result" => result);
        AppendMetrics {
            appended: appends("appended"),
            failed: appends("failed"),
        }
    }
}

/// A worker pool's handles.
pub(crate) struct WorkerMetrics {
    pub(crate) keys: Share,
    pub(crate) claimed: Counter,
    pub(crate) released: Counter,
    pub(crate) told: Gauge,
    pub(crate) mail: MailMetrics,
}

/// A durable worker pool's mail handles, shared by its deliveries.
#[derive(Clone)]
pub(crate) struct MailMetrics {
    pub(crate) handled: Counter,
    pub(crate) failed: Counter,
    pub(crate) lag: Histogram,
}

impl WorkerMetrics {
    pub(crate) fn new(pool: &str) -> WorkerMetrics {
        describe();
        let moves = |direction: &'static str| counter!(WORKER_MOVES, "pool" => pool.to_owned(), "direction" => direction);
        WorkerMetrics {
            keys: Share::new(gauge!(WORKER_KEYS, "pool" => pool.to_owned())),
            claimed: moves("claimed"),
            released: moves("released"),
            told: gauge!(WORKER_TOLD, "pool" => pool.to_owned()),
            mail: MailMetrics {
                handled: counter!(WORKER_MAIL, "pool" => pool.to_owned(), "result" => "handled"),
                failed: counter!(WORKER_MAIL, "pool" => pool.to_owned(), "result" => "failed"),
                lag: histogram!(WORKER_MAIL_LAG, "pool" => pool.to_owned()),
            },
        }
    }
}

/// What a routed ask ended with, for [`ROUTED`].
pub(crate) fn routed(pool: &str, outcome: &'static str, took: Duration) {
    describe();
    counter!(ROUTED, "pool" => pool.to_owned(), "outcome" => outcome).increment(1);
    histogram!(ROUTED_SECONDS, "pool" => pool.to_owned()).record(took.as_secs_f64());
}
