//! Metrics through a recording recorder. A binary of its own: the recorder is process-global,
//! and must be installed before the actors start.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use ::metrics::{Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit};
use actix::Actor as _;
use metrics_util::registry::{AtomicStorage, Registry};
use pgcoord_actors::*;
use pgcoord_testkit::{test_pg_config, unique_name};

/// A recorder that keeps every value where tests can read it without resetting it.
#[derive(Clone)]
struct Recording(
    Arc<Registry<Key, AtomicStorage>>,
    Arc<std::sync::Mutex<Vec<Described>>>,
);

/// A metric's description: name, unit, help.
type Described = (String, Option<Unit>, String);

impl Recording {
    fn described(&self, name: KeyName, unit: Option<Unit>, help: SharedString) {
        let described = (name.as_str().to_owned(), unit, help.to_string());
        self.1.lock().unwrap().push(described);
    }
}

impl Recorder for Recording {
    fn describe_counter(&self, name: KeyName, unit: Option<Unit>, help: SharedString) {
        self.described(name, unit, help);
    }
    fn describe_gauge(&self, name: KeyName, unit: Option<Unit>, help: SharedString) {
        self.described(name, unit, help);
    }
    fn describe_histogram(&self, name: KeyName, unit: Option<Unit>, help: SharedString) {
        self.described(name, unit, help);
    }

    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        self.0
            .get_or_create_counter(key, |c| Counter::from_arc(c.clone()))
    }

    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        self.0
            .get_or_create_gauge(key, |g| Gauge::from_arc(g.clone()))
    }

    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        self.0
            .get_or_create_histogram(key, |h| Histogram::from_arc(h.clone()))
    }
}

/// `name` with its labels sorted, as `name{k=v,…}`.
fn id(key: &Key) -> String {
    let mut labels: Vec<String> = key
        .labels()
        .map(|l| format!("{}={}", l.key(), l.value()))
        .collect();
    labels.sort();
    format!("{}{{{}}}", key.name(), labels.join(","))
}

impl Recording {
    fn counter(&self, name: &str, labels: &str) -> u64 {
        let all = self.0.get_counter_handles();
        let found = all
            .iter()
            .find(|(k, _)| id(k) == format!("{name}{{{labels}}}"));
        found
            .unwrap_or_else(|| panic!("{name}{{{labels}}} not recorded"))
            .1
            .load(Ordering::SeqCst)
    }

    /// A counter's value, 0 when it was never recorded.
    fn counter_or_zero(&self, name: &str, labels: &str) -> u64 {
        let all = self.0.get_counter_handles();
        let found = all
            .iter()
            .find(|(k, _)| id(k) == format!("{name}{{{labels}}}"));
        found.map_or(0, |(_, c)| c.load(Ordering::SeqCst))
    }

    fn gauge(&self, name: &str, labels: &str) -> f64 {
        let all = self.0.get_gauge_handles();
        let found = all
            .iter()
            .find(|(k, _)| id(k) == format!("{name}{{{labels}}}"));
        let bits = found
            .unwrap_or_else(|| panic!("{name}{{{labels}}} not recorded"))
            .1
            .load(Ordering::SeqCst);
        f64::from_bits(bits)
    }

    fn samples(&self, name: &str, labels: &str) -> usize {
        let all = self.0.get_histogram_handles();
        let found = all
            .iter()
            .find(|(k, _)| id(k) == format!("{name}{{{labels}}}"));
        found
            .unwrap_or_else(|| panic!("{name}{{{labels}}} not recorded"))
            .1
            .data()
            .len()
    }

    /// A histogram's values so far.
    fn values(&self, name: &str, labels: &str) -> Vec<f64> {
        let all = self.0.get_histogram_handles();
        let found = all
            .iter()
            .find(|(k, _)| id(k) == format!("{name}{{{labels}}}"));
        found
            .unwrap_or_else(|| panic!("{name}{{{labels}}} not recorded"))
            .1
            .data()
    }

    fn names(&self) -> Vec<String> {
        let counters = self.0.get_counter_handles().into_keys();
        let gauges = self.0.get_gauge_handles().into_keys();
        let histograms = self.0.get_histogram_handles().into_keys();
        counters
            .chain(gauges)
            .chain(histograms)
            .map(|k| k.name().to_owned())
            .collect()
    }
}

#[actix_rt::test]
async fn every_documented_metric_is_recorded_with_its_labels() {
    let seen = Recording(Arc::new(Registry::atomic()), Arc::default());
    ::metrics::set_global_recorder(seen.clone()).expect("the only recorder of this binary");

    let table = unique_name("metrics");
    let config = |owner: &str| {
        pgcoord::Config::builder()
            .pg_config(&test_pg_config().unwrap())
            .lock_table(&table)
            .payload_table(format!("{table}_p"))
            .topic_table(format!("{table}_t"))
            .schedule_table(format!("{table}_s"))
            .owner(owner)
            .lease(Duration::from_secs(10))
            .heartbeat(Duration::from_secs(2))
            .build()
            .unwrap()
    };
    let admin = pgcoord::db::connect_spawned(&config("admin"))
        .await
        .unwrap();
    pgcoord::schema::migrate(&admin, &config("admin"))
        .await
        .unwrap();
    let me = Coordinator::connect(config("me")).await.unwrap();
    let other = Coordinator::connect(config("other")).await.unwrap();

    // Leases: two granted and released, one refused, one lost.
    for name in ["a", "b"] {
        let lease = me.acquire(Acquire::new(name)).await.unwrap();
        lease.release().await.unwrap();
    }
    let held = me.acquire(Acquire::new("held")).await.unwrap();
    let refused = other
        .locks()
        .unwrap()
        .call(Acquire::new("held").fail_if_locked())
        .await;
    assert!(refused.is_err());
    let now = &seen;
    assert_eq!(now.gauge("pgcoord_leases_held", ""), 1.0);
    let delete = format!("DELETE FROM \"{table}\" WHERE name = 'held'");
    admin.execute(&delete, &[]).await.unwrap();
    me.locks().unwrap().call(RunNow).await.unwrap();
    held.lost().await;
    let now = &seen;
    assert_eq!(now.gauge("pgcoord_leases_held", ""), 0.0);
    let acquires = "pgcoord_acquires_total";
    assert_eq!(now.counter(acquires, "outcome=granted"), 3);
    assert_eq!(now.counter(acquires, "outcome=not_acquired"), 1);
    assert!(now.samples("pgcoord_acquire_wait_seconds", "") >= 3);
    let lost = "kind=lease,reason=taken_over";
    assert_eq!(now.counter("pgcoord_losses_total", lost), 1);
    assert!(now.samples("pgcoord_renew_seconds", "") >= 1);

    // Advisory locks.
    let guard = me
        .advisory()
        .unwrap()
        .call(AdvisoryLock::new(7))
        .await
        .unwrap();
    let held = "pgcoord_advisory_locks_held";
    assert_eq!(seen.gauge(held, ""), 1.0);
    guard.release().await.unwrap();
    assert_eq!(seen.gauge(held, ""), 0.0);

    // The listener: connected, one connection, a message delivered.
    let mut heard = me.subscribe("metered").await.unwrap();
    let publish = Publish::new("metered", b"x".to_vec());
    other.signals().unwrap().call(publish).await.unwrap();
    let next = tokio::time::timeout(
        Duration::from_secs(10),
        futures_util::StreamExt::next(&mut heard),
    );
    assert!(matches!(next.await, Ok(Some(Heard::Signal(_)))));
    let now = &seen;
    // Two coordinators in this process, two listeners: the gauge is their sum, not the last
    // one's value (no per-process label: an owner identity is new at every start).
    assert_eq!(now.gauge("pgcoord_listener_connected", ""), 2.0);
    assert_eq!(now.counter("pgcoord_listener_connections_total", ""), 2);
    let delivered = "result=delivered";
    assert!(now.counter("pgcoord_notifications_total", delivered) >= 1);

    // A topic consumer: one event appended through the runtime, failed once, handed over
    // again, handled and acked, its lag recorded.
    me.append("t", b"e").await.unwrap();
    let failed_once = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let consume = Consume::new("t", "c", move |_| {
        let fail = !failed_once.swap(true, Ordering::SeqCst);
        async move { if fail { Err("once".to_owned()) } else { Ok(()) } }
    });
    let consumer = me.consume(consume.poll(Duration::from_millis(20))).unwrap();
    let labels = "consumer=c,topic=t";
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while seen.counter("pgcoord_topic_acks_total", labels) < 1 {
        assert!(std::time::Instant::now() < deadline, "never acked");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let handled = "consumer=c,result=handled,topic=t";
    assert_eq!(seen.counter("pgcoord_topic_deliveries_total", handled), 1);
    let failed = "consumer=c,result=failed,topic=t";
    assert_eq!(seen.counter("pgcoord_topic_deliveries_total", failed), 1);
    assert_eq!(seen.counter("pgcoord_topic_redeliveries_total", labels), 1);
    assert_eq!(seen.samples("pgcoord_topic_lag_seconds", labels), 2);
    let appended = "result=appended";
    assert_eq!(seen.counter("pgcoord_topic_appends_total", appended), 1);
    // A transaction left open holds readers back: the caught-up consumer's gauge shows its age.
    let mut open = pgcoord::db::connect_spawned(&config("admin"))
        .await
        .unwrap();
    let tx = open.transaction().await.unwrap();
    tx.execute("SELECT pg_current_xact_id()", &[])
        .await
        .unwrap();
    while seen.gauge("pgcoord_topic_held_back_seconds", labels) < 0.5 {
        assert!(
            std::time::Instant::now() < deadline,
            "no transaction seen holding back"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tx.rollback().await.unwrap();
    consumer.stop().await;

    // The lag in events: a consumer reading 5 at a time, 300 events waiting, 50 ms an event:
    // at least a window behind its full reads, counted ten seconds into its tenure (some 200
    // events then: more than a window, fewer than were appended), 0 once all are handled.
    let bodies: Vec<Vec<u8>> = (0..300u16).map(|i| i.to_be_bytes().to_vec()).collect();
    let events: Vec<(&str, &[u8])> = bodies.iter().map(|b| ("lagging", &b[..])).collect();
    let topic_table = pgcoord::topic::TopicTable::new(&config("admin"));
    topic_table.append_many(&open, &events).await.unwrap();
    let consume = Consume::new("lagging", "c", |_| async {
        tokio::time::sleep(Duration::from_millis(50)).await;
        Ok(())
    });
    let consumer = me.consume(consume.window(5)).unwrap();
    let lagging = "consumer=c,topic=lagging";
    let lag = |seen: &Recording| seen.gauge("pgcoord_topic_lag_events", lagging);
    let started = std::time::Instant::now();
    let deadline = started + Duration::from_secs(60);
    while lag(&seen) != 5.0 {
        assert!(std::time::Instant::now() < deadline, "lag {}", lag(&seen));
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    while lag(&seen) == 5.0 {
        assert!(std::time::Instant::now() < deadline, "never counted");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let counted = lag(&seen);
    assert!(
        started.elapsed() >= Duration::from_secs(10),
        "counted early"
    );
    assert!(counted > 5.0 && counted < 300.0, "counted {counted}");
    let handled = "consumer=c,result=handled,topic=lagging";
    while seen.counter("pgcoord_topic_deliveries_total", handled) < 300 || lag(&seen) != 0.0 {
        assert!(std::time::Instant::now() < deadline, "lag {}", lag(&seen));
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    consumer.stop().await;

    // The pool's gauges are sampled once a second.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let used = seen.gauge("pgcoord_pool_connections", "state=used");
    let idle = seen.gauge("pgcoord_pool_connections", "state=idle");
    assert!(used + idle >= 1.0, "used {used}, idle {idle}");
    assert!(seen.counter("pgcoord_pool_gets_total", "result=direct") >= 1);
    // A pool of one connection, which the application holds while an acquire needs it: the
    // acquire waits for it, and the wait is counted.
    let tight = pgcoord::Config::builder()
        .pg_config(&test_pg_config().unwrap())
        .lock_table(&table)
        .payload_table(format!("{table}_p"))
        .topic_table(format!("{table}_t"))
        .owner("tight")
        .build()
        .unwrap();
    let manager = pgcoord::bb8_postgres::PostgresConnectionManager::new(
        tight.pg_config().clone(),
        tight.tls().clone(),
    );
    let app_pool = pgcoord::bb8::Pool::builder()
        .max_size(1)
        .build(manager)
        .await
        .unwrap();
    let pool = pgcoord::Pool::from_bb8(&tight, app_pool.clone());
    let tight = Coordinator::connect_with_pool(tight, pool).await.unwrap();
    let waited_before = seen.counter("pgcoord_pool_gets_total", "result=waited");
    let long_waits = || {
        let waits = seen.values("pgcoord_pool_wait_seconds", "");
        waits.into_iter().filter(|&w| w >= 0.2).count()
    };
    let long_before = long_waits();
    let taken = app_pool.get_owned().await.unwrap();
    let acquire = tight.acquire(Acquire::new("tight"));
    let handed_back = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        drop(taken);
    });
    acquire.await.unwrap().release().await.unwrap();
    handed_back.await.unwrap();
    let waited = "result=waited";
    while seen.counter("pgcoord_pool_gets_total", waited) == waited_before {
        assert!(std::time::Instant::now() < deadline, "no get waited");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The acquire's checkout waited for the connection held 300 ms, and was timed in seconds.
    assert!(long_waits() > long_before);
    let timed_out = "result=timed_out";
    assert_eq!(seen.counter("pgcoord_pool_gets_total", timed_out), 0);

    // A routed, durable worker pool: its key claimed, a message routed and answered, one to a
    // key nobody holds not delivered; a mail refused once, then handled.
    let refused = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let pool = WorkerPool::new(
        &config("me"),
        me.locks().unwrap().clone(),
        "metered",
        vec!["k".into()],
        move |_: WorkerKey| Echo(refused.clone()),
    )
    .routed(me.signals().unwrap().clone())
    .durable(&me)
    .unwrap()
    .start();
    let router = KeyRouter::new(
        "metered",
        other.locks().unwrap().clone(),
        other.signals().unwrap().clone(),
    );
    let answer = router
        .ask("k", b"hi".to_vec(), Duration::from_secs(10))
        .await;
    assert_eq!(answer.unwrap(), b"hi");
    // A deadline that passes while a look for the holder is in flight is `timeout` (the look
    // may have reached one), one that passes between looks `not_delivered`: on a busy machine
    // the look can take the whole 100 ms, so asked until one is not delivered.
    let routed = "pgcoord_routed_messages_total";
    let mut asks = 0;
    while seen.counter_or_zero(routed, "outcome=not_delivered,pool=metered") == 0 {
        assert!(
            asks < 20,
            "no ask to a key nobody holds was counted not delivered"
        );
        asks += 1;
        let nobody = router
            .ask("none", b"x".to_vec(), Duration::from_millis(100))
            .await;
        assert_eq!(nobody.unwrap_err().kind(), pgcoord::ErrorKind::Timeout);
    }
    let now = &seen;
    assert_eq!(now.gauge("pgcoord_worker_keys_held", "pool=metered"), 1.0);
    let claimed = "direction=claimed,pool=metered";
    assert_eq!(now.counter("pgcoord_worker_key_moves_total", claimed), 1);
    assert_eq!(now.counter(routed, "outcome=handled,pool=metered"), 1);
    assert_eq!(now.counter(routed, "outcome=not_delivered,pool=metered"), 1);
    let timed_out = now.counter_or_zero(routed, "outcome=timeout,pool=metered");
    assert_eq!(timed_out, asks - 1);
    assert_eq!(
        now.samples("pgcoord_routed_seconds", "pool=metered") as u64,
        1 + asks
    );
    router
        .tell("k", b"told".to_vec(), Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!(now.counter(routed, "outcome=accepted,pool=metered"), 1);
    let told = "pgcoord_worker_told_waiting";
    pgcoord_testkit::eventually(Duration::from_secs(5), "the tell handled", async || {
        now.gauge(told, "pool=metered") == 0.0
    })
    .await;
    me.append(&mail_topic("metered", "k"), b"m").await.unwrap();
    let mail = |result: &str| {
        seen.counter(
            "pgcoord_worker_mail_total",
            &format!("pool=metered,result={result}"),
        )
    };
    pgcoord_testkit::eventually(Duration::from_secs(10), "the mail handled", async || {
        mail("handled") == 1
    })
    .await;
    assert_eq!(mail("failed"), 1);
    assert_eq!(
        seen.samples("pgcoord_worker_mail_lag_seconds", "pool=metered"),
        2
    );
    pool.send(Shutdown).await.unwrap();
    // The pool lets its keys go as it stops, just after it answered.
    pgcoord_testkit::eventually(Duration::from_secs(5), "the key let go", async || {
        seen.gauge("pgcoord_worker_keys_held", "pool=metered") == 0.0
    })
    .await;
    let released = "direction=released,pool=metered";
    assert_eq!(seen.counter("pgcoord_worker_key_moves_total", released), 1);

    // A schedule: its ticks run and counted by outcome.
    let every = pgcoord::schedule::Timing::every(Duration::from_millis(100)).unwrap();
    let schedule = Schedule::new("metered", every, |_| async { Ok(()) });
    let runner = me.schedule(schedule).unwrap();
    let done = "outcome=done,schedule=metered";
    pgcoord_testkit::eventually(Duration::from_secs(10), "a tick run", async || {
        seen.counter("pgcoord_schedule_runs_total", done) >= 1
    })
    .await;
    runner.send(pgcoord_actors::Shutdown).await.unwrap();
    let stats = runner.send(GetStats::new()).await.unwrap();
    assert_eq!(
        seen.counter("pgcoord_schedule_runs_total", done),
        stats.done
    );

    // A rate limit: permits granted and takes refused.
    let limiter =
        me.rate_limiter(pgcoord::rate::RateLimit::new(2, Duration::from_secs(60)).unwrap());
    assert_eq!(limiter.try_take("metered", 2).await.unwrap().granted, 2);
    assert_eq!(limiter.try_take("metered", 1).await.unwrap().granted, 0);
    let takes =
        |outcome: &str| seen.counter("pgcoord_rate_takes_total", &format!("outcome={outcome}"));
    assert_eq!((takes("granted"), takes("refused")), (1, 1));
    assert_eq!(seen.counter("pgcoord_rate_permits_total", ""), 2);
    // Fifty waiters on one key share statements: fewer than fifty for fifty permits.
    let rate = pgcoord::rate::RateLimit::per_second(1_000).unwrap();
    let hot = me.rate_limiter(rate.burst(5).unwrap());
    let waiters = (0..50).map(|_| hot.take("hot", 1, Duration::from_secs(10)));
    for taken in futures_util::future::join_all(waiters).await {
        taken.unwrap();
    }
    assert_eq!(seen.counter("pgcoord_rate_permits_total", ""), 52);
    let statements = takes("granted") + takes("refused") - 2;
    assert!(statements < 50, "{statements} statements for 50 waiters");

    // No series is per process.
    let keys = (seen.0.get_counter_handles().into_keys())
        .chain(seen.0.get_gauge_handles().into_keys())
        .chain(seen.0.get_histogram_handles().into_keys());
    for key in keys {
        assert!(key.labels().all(|l| l.key() != "owner"), "{}", id(&key));
    }
    // Every name the module documents was recorded.
    let names = seen.names();
    for name in pgcoord_actors::metrics::ALL {
        assert!(names.iter().any(|n| n == name), "{name} never recorded");
    }
    // And described, with help text (and a unit where one applies).
    let described = seen.1.lock().unwrap().clone();
    for name in pgcoord_actors::metrics::ALL {
        let found = described.iter().find(|(n, _, _)| n == name);
        assert!(
            found.is_some_and(|(_, _, help)| !help.is_empty()),
            "{name} not described"
        );
    }
    let unit = |name: &str| {
        described
            .iter()
            .find(|(n, _, _)| n == name)
            .and_then(|d| d.1)
    };
    assert_eq!(unit("pgcoord_acquire_wait_seconds"), Some(Unit::Seconds));
}

/// A routed pool's worker that answers what it is sent; refuses the first mail.
struct Echo(Arc<std::sync::atomic::AtomicBool>);

impl actix::Actor for Echo {
    type Context = actix::Context<Self>;
}

impl actix::Handler<Shutdown> for Echo {
    type Result = ();
    fn handle(&mut self, _: Shutdown, ctx: &mut actix::Context<Self>) {
        actix::ActorContext::stop(ctx);
    }
}

impl actix::Handler<Mail> for Echo {
    type Result = Result<(), String>;
    fn handle(&mut self, _: Mail, _: &mut actix::Context<Self>) -> Self::Result {
        match self.0.swap(true, Ordering::SeqCst) {
            false => Err("refused once".to_owned()),
            true => Ok(()),
        }
    }
}

impl actix::Handler<Routed> for Echo {
    type Result = Result<Vec<u8>, String>;
    fn handle(&mut self, routed: Routed, _: &mut actix::Context<Self>) -> Self::Result {
        Ok(routed.payload().to_vec())
    }
}
