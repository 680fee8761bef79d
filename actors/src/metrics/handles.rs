//! The handles each actor registers when it starts, and the one-off recordings: what the
//! runtime's actors record, by wing (leases, the listener, topics, schedules, worker pools).

use std::time::Duration;

use metrics::{Counter, Gauge, Histogram, counter, gauge, histogram};

use super::*;

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
    pool_max: Share,
    pool_pending: Share,
    pool_direct: Tally,
    pool_waited: Tally,
    pool_timed_out: Tally,
}

impl LeaseMetrics {
    /// The manager's handles, its pool's gauges set at once, its losses at 0.
    pub(crate) fn new(pool: &pgcoord::Pool) -> LeaseMetrics {
        describe();
        losses_at_zero("lease", &["taken_over", "deadline_passed", "shutdown"]);
        // Each checkout, as it ends: the first manager on a pool installs it, so a pool shared
        // by several records each checkout once.
        let wait = histogram!(POOL_WAIT);
        pool.observe_checkouts(move |took| wait.record(took.as_secs_f64()));
        let acquires = |outcome: &'static str| counter!(ACQUIRES, "outcome" => outcome);
        let gets = |result: &'static str| Tally::new(counter!(POOL_GETS, "result" => result));
        let metrics = LeaseMetrics {
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
            pool_max: Share::new(gauge!(POOL_MAX)),
            pool_pending: Share::new(gauge!(POOL_PENDING)),
            pool_direct: gets("direct"),
            pool_waited: gets("waited"),
            pool_timed_out: gets("timed_out"),
        };
        metrics.pool(pool);
        metrics
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
        self.pool_max.set(f64::from(pool.max_size()));
        self.pool_pending.set(f64::from(pool.waiting()));
        // bb8 counts since the pool was built: the counters add what its totals grew by.
        let counts = pool.statistics();
        self.pool_direct.to(counts.get_direct);
        self.pool_waited.to(counts.get_waited);
        self.pool_timed_out.to(counts.get_timed_out);
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

/// The losses of `kind` an actor of that kind can have, exported at 0 from its start: an alert
/// on a rise (`increase(...) > 0`) sees the first loss only if a series was there before it.
fn losses_at_zero(kind: &'static str, reasons: &[&'static str]) {
    for &reason in reasons {
        counter!(LOSSES, "kind" => kind, "reason" => reason).increment(0);
    }
}

/// An `AdvisoryLocks`' handle.
pub(crate) fn advisory_held() -> Share {
    describe();
    losses_at_zero("advisory", &["connection_lost", "stalled", "shutdown"]);
    Share::new(gauge!(ADVISORY_HELD))
}

/// A consumer actor's handles.
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
