//! The behavioural suite both backends pass: each test is written once against [`Coordinator`]
//! and runs on PostgreSQL (two `Coordinator`s, as two processes) and in memory (two
//! coordinators of one `MemoryBackend`). Where a test forces something — a lease
//! taken over, a listener reconnect — each backend does it its own way: on PostgreSQL the row is
//! deleted and the listener's backend terminated; in memory the test hooks do it.

use std::time::{Duration, Instant};

use futures_util::StreamExt;
use pgcoord::ErrorKind;
use pgcoord::topic::{Cursor, TopicTable};
use pgcoord_actors::backend::memory::MemoryBackend;
use pgcoord_actors::*;
use pgcoord_testkit::unique_name;
use tokio_postgres::Client;

use super::Setup;

/// A backend under test: two processes' runtimes on one database, and what a test forces.
pub(super) trait Harness {
    /// The two processes, with owners "a" and "b".
    fn processes(&self) -> (Coordinator, Coordinator);
    /// Takes the lease `name` from its holder, as a takeover after an expiry would.
    async fn force_loss(&self, name: &str);
    /// Ends the lease `name` as its holder stopping to renew would: expired, its row kept.
    async fn expire(&self, name: &str);
    /// Makes the first process's listener reconnect.
    async fn reconnect(&self);
    /// The stored cursor of `consumer` of `topic` (its last ack that committed); `None` when it
    /// never started.
    async fn stored_cursor(&self, topic: &str, consumer: &str) -> Option<Cursor>;
}

pub(super) struct Postgres {
    a: Coordinator,
    b: Coordinator,
    admin: Client,
    table: String,
    topics: TopicTable,
    app: String,
}

impl Postgres {
    pub(super) async fn new() -> Postgres {
        let (setup, admin) = Setup::new(Duration::from_secs(2), Duration::from_millis(400)).await;
        let app = unique_name("backend");
        let start = |owner: &str, app: &str| {
            Coordinator::start(setup.builder(owner).application_name(app).build().unwrap())
        };
        Postgres {
            a: start("a", &app),
            b: start("b", &unique_name("backend")),
            admin,
            table: setup.quoted_table(),
            topics: TopicTable::new(&setup.builder("admin").build().unwrap()),
            app,
        }
    }
}

impl Harness for Postgres {
    fn processes(&self) -> (Coordinator, Coordinator) {
        (self.a.clone(), self.b.clone())
    }

    async fn force_loss(&self, name: &str) {
        let sql = format!("DELETE FROM {} WHERE name = $1", self.table);
        let deleted = self.admin.execute(&sql, &[&name]).await.unwrap();
        assert_eq!(deleted, 1, "{name} was held");
    }

    async fn expire(&self, name: &str) {
        let sql = format!(
            "UPDATE {} SET expires_at = clock_timestamp() - interval '1 second' WHERE name = $1",
            self.table
        );
        let expired = self.admin.execute(&sql, &[&name]).await.unwrap();
        assert_eq!(expired, 1, "{name} was held");
    }

    async fn reconnect(&self) {
        let killed = self
            .admin
            .execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1",
                &[&format!("{} listener", self.app)],
            )
            .await
            .unwrap();
        assert_eq!(killed, 1, "the listener's backend");
    }

    async fn stored_cursor(&self, topic: &str, consumer: &str) -> Option<Cursor> {
        match self.topics.cursor(&self.admin, topic, consumer).await {
            Ok(cursor) => Some(cursor),
            Err(e) if e.kind() == ErrorKind::NotFound => None,
            Err(e) => panic!("the cursor of {topic}/{consumer}: {e}"),
        }
    }
}

pub(super) struct Memory {
    backend: MemoryBackend,
    a: Coordinator,
    b: Coordinator,
}

impl Memory {
    pub(super) async fn new() -> Memory {
        let backend = MemoryBackend::new();
        Memory {
            a: backend.coordinator("a"),
            b: backend.coordinator("b"),
            backend,
        }
    }
}

impl Harness for Memory {
    fn processes(&self) -> (Coordinator, Coordinator) {
        (self.a.clone(), self.b.clone())
    }

    async fn force_loss(&self, name: &str) {
        assert!(self.backend.force_loss(name), "{name} was held");
    }

    async fn expire(&self, name: &str) {
        // Nothing expires in memory: a takeover is what expiry leads to.
        assert!(self.backend.force_loss(name), "{name} was held");
    }

    async fn reconnect(&self) {
        self.backend.reconnect(&self.a).unwrap();
    }

    async fn stored_cursor(&self, topic: &str, consumer: &str) -> Option<Cursor> {
        self.backend.cursor(topic, consumer)
    }
}

/// Runs the test `$name` on both backends.
macro_rules! on_both_backends {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[actix_rt::test]
            async fn postgres() {
                super::$name(super::Postgres::new().await).await
            }
            #[actix_rt::test]
            async fn memory() {
                super::$name(super::Memory::new().await).await
            }
        }
    )*};
}

on_both_backends!(
    one_holder_at_a_time_with_increasing_tokens,
    a_waiter_is_served_on_release_and_a_timeout_ends_the_wait,
    data_is_stored_kept_and_replaced,
    a_lease_taken_over_is_reported_once_and_goes_to_the_waiter,
    every_subscriber_gets_every_message_in_order,
    requests_get_replies_errors_and_timeouts,
    a_reconnect_is_announced_and_subscriptions_survive_it,
    bad_input_is_refused,
    a_dropped_lease_is_released_and_a_cancelled_wait_leaves_nothing_behind,
    a_lease_taken_over_after_expiry_has_the_new_holders_data,
    a_release_is_no_loss,
    a_topic_goes_in_order_to_one_consumer_instance_and_on_to_the_next,
    a_handler_error_hands_the_same_event_over_and_bad_input_is_refused,
    permits_and_a_stored_limit_that_is_raised_and_lowered,
    a_claim_takes_the_free_names_and_a_prefix_lists_them,
    a_stopped_consumer_has_finished_its_event_and_let_its_lease_go,
);

/// `TopicConsumer::stop` returns once the consumer has stopped: the event its handler was in is
/// finished and acked, and the consumer's lease is free — not some time later.
async fn a_stopped_consumer_has_finished_its_event_and_let_its_lease_go(h: impl Harness) {
    let (a, _) = h.processes();
    let topic = unique_name("stopping");
    let cursor = a.append(&topic, &[1]).await.unwrap();
    let (started, mut handling) = tokio::sync::mpsc::unbounded_channel();
    let finished = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let done = finished.clone();
    let consume = Consume::new(&topic, "c", move |_: Delivery| {
        let (started, done) = (started.clone(), done.clone());
        async move {
            let _ = started.send(());
            tokio::time::sleep(Duration::from_millis(500)).await;
            done.store(true, std::sync::atomic::Ordering::SeqCst);
            Ok(())
        }
    });
    let consumer = a.consume(consume).unwrap();
    tokio::time::timeout(Duration::from_secs(10), handling.recv())
        .await
        .expect("the event is handed over");
    consumer.stop().await;
    assert!(
        finished.load(std::sync::atomic::Ordering::SeqCst),
        "the handler was waited for"
    );
    assert_eq!(
        h.stored_cursor(&topic, "c").await,
        Some(cursor),
        "and its event acked"
    );
    match a.get(&format!("{topic}/consumers/c")).await {
        Ok(info) => assert_eq!(info.owner, None, "the lease is free: {info:?}"),
        Err(e) => assert_eq!(e.kind(), ErrorKind::NotFound, "{e}"),
    }
    consumer.stop().await; // a second stop returns at once
}

/// What a worker pool asks of its leases, through the same seam on both backends: a claim takes
/// the free names at once and skips the others, a listing by prefix reads them.
async fn a_claim_takes_the_free_names_and_a_prefix_lists_them(h: impl Harness) {
    let (a, b) = h.processes();
    let prefix = format!("{}/", unique_name("claim"));
    let name = |k: &str| format!("{prefix}{k}");
    let theirs = b.acquire(Acquire::new(name("x"))).await.unwrap();
    let names = vec![name("x"), name("y"), name("z")];
    let ours = a.claim(Claim::new(names.clone())).await.unwrap();
    let mut claimed: Vec<&str> = ours.iter().map(Lease::name).collect();
    claimed.sort();
    assert_eq!(claimed, [name("y"), name("z")], "x is b's");
    let again = a.claim(Claim::new(names)).await.unwrap();
    assert!(again.is_empty(), "nothing more is free: {again:?}");
    let listed = a.list_prefix(&prefix).await.unwrap();
    let owners: Vec<(&str, Option<&str>)> = (listed.iter())
        .map(|l| (l.name.as_str(), l.owner.as_deref()))
        .collect();
    let (x, y, z) = (name("x"), name("y"), name("z"));
    assert_eq!(
        owners,
        [
            (x.as_str(), Some("b")),
            (y.as_str(), Some("a")),
            (z.as_str(), Some("a"))
        ]
    );
    // Kept on release: the row stays, free.
    let kept = a
        .claim(Claim::new(vec![name("w")]).keep_on_release())
        .await
        .unwrap();
    assert_eq!(kept.len(), 1);
    for lease in kept.into_iter().chain(ours) {
        lease.release().await.unwrap();
    }
    theirs.release().await.unwrap();
    let listed = b.list_prefix(&prefix).await.unwrap();
    let left: Vec<(&str, Option<&str>)> = (listed.iter())
        .map(|l| (l.name.as_str(), l.owner.as_deref()))
        .collect();
    assert_eq!(left, [(name("w").as_str(), None)]);
}

async fn permits_and_a_stored_limit_that_is_raised_and_lowered(h: impl Harness) {
    let (a, b) = h.processes();
    // A fixed count: two permits, each a slot's lease; a third waits for a release.
    let name = unique_name("sem");
    let one = a
        .acquire_permit(AcquirePermit::new(&name, 2))
        .await
        .unwrap();
    let two = b
        .acquire_permit(AcquirePermit::new(&name, 2))
        .await
        .unwrap();
    assert_ne!(one.name(), two.name());
    let full = (a.acquire_permit(AcquirePermit::new(&name, 2).timeout(Duration::from_millis(200))))
        .await
        .unwrap_err();
    assert_eq!(full.kind(), ErrorKind::NotAcquired);
    let waiting = tokio::spawn(
        a.acquire_permit(AcquirePermit::new(&name, 2).timeout(Duration::from_secs(5))),
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
    let slot = two.name().to_owned();
    two.release().await.unwrap();
    assert_eq!(waiting.await.unwrap().unwrap().name(), slot);
    drop(one);

    // A stored limit: none yet, then 1; raised to 2, a waiter gets in; lowered to 0, the
    // permits are taken back from their holders.
    let name = unique_name("limited");
    let err = a
        .acquire_permit(AcquirePermit::limited(&name))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound);
    assert_eq!(b.limit(&name).await.unwrap(), None);
    let change = a.set_limit(SetLimit::new(&name, 1)).await.unwrap();
    assert_eq!((change.previous, change.revoked), (None, 0));
    assert_eq!(
        b.limit(&name).await.unwrap(),
        Some(1),
        "read by another process"
    );
    let first = a
        .acquire_permit(AcquirePermit::limited(&name))
        .await
        .unwrap();
    let waiting = tokio::spawn(
        b.acquire_permit(AcquirePermit::limited(&name).timeout(Duration::from_secs(5))),
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!waiting.is_finished());
    let raised = Instant::now();
    b.set_limit(SetLimit::new(&name, 2)).await.unwrap();
    let second = waiting.await.unwrap().unwrap();
    assert!(
        raised.elapsed() < Duration::from_secs(1),
        "{:?}",
        raised.elapsed()
    );
    let change = b.set_limit(SetLimit::new(&name, 0)).await.unwrap();
    assert_eq!((change.previous, change.revoked), (Some(2), 2));
    assert_eq!(a.limit(&name).await.unwrap(), Some(0));
    for permit in [first, second] {
        let lost = tokio::time::timeout(Duration::from_secs(5), permit.lost()).await;
        assert_eq!(lost, Ok(Some(LossReason::TakenOver)));
    }
    let err = a.set_limit(SetLimit::new(&name, 10_001)).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidConfig);
}

type Seen = std::sync::Arc<std::sync::Mutex<Vec<u8>>>;

/// Consumer "c" of `topic`, recording each event's one-byte body; a handler failing once at
/// `fail_at`.
fn recording(topic: &str, seen: &Seen, fail_at: Option<u8>) -> Consume {
    let (seen, failed) = (
        seen.clone(),
        std::sync::Arc::new(std::sync::Mutex::new(false)),
    );
    Consume::new(topic, "c", move |delivery: Delivery| {
        let body = delivery.event().body[0];
        let fail = Some(body) == fail_at && !std::mem::replace(&mut *failed.lock().unwrap(), true);
        if !fail {
            seen.lock().unwrap().push(body);
        }
        async move {
            if fail {
                Err("not yet".to_owned())
            } else {
                Ok(())
            }
        }
    })
    .window(4)
    .poll(Duration::from_millis(100))
}

async fn until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < deadline, "{what}: not within 10 s");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn until_active(consuming: &TopicConsumer) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !consuming.stats().await.unwrap().active {
        assert!(Instant::now() < deadline, "never active");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn a_topic_goes_in_order_to_one_consumer_instance_and_on_to_the_next(h: impl Harness) {
    let (a, b) = h.processes();
    let topic = unique_name("topic");
    let (seen_a, seen_b) = (Seen::default(), Seen::default());
    let first = a.consume(recording(&topic, &seen_a, None)).unwrap();
    until_active(&first).await;
    let second = b.consume(recording(&topic, &seen_b, None)).unwrap();
    let mut last = Cursor::START;
    for i in 0..10u8 {
        let cursor = a.append(&topic, &[i]).await.unwrap();
        assert!(cursor > last);
        last = cursor;
    }
    until("10 delivered", || seen_a.lock().unwrap().len() == 10).await;
    assert_eq!(*seen_a.lock().unwrap(), (0..10).collect::<Vec<u8>>());
    assert!(seen_b.lock().unwrap().is_empty(), "one active instance");
    assert!(!second.stats().await.unwrap().active);
    // Acks are batched: wait for the one through the 10th to be stored, or the second would
    // rightly hand over again what the first handled but had not acked yet.
    let deadline = Instant::now() + Duration::from_secs(10);
    while h.stored_cursor(&topic, "c").await != Some(last) {
        assert!(Instant::now() < deadline, "the first never acked the 10th");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The first loses the consumer's lease: the second, waiting in line, takes over from the
    // stored cursor.
    h.force_loss(&format!("{topic}/consumers/c")).await;
    // Taken from it by hand, the first learns of it at its next renewal: until then it is a
    // holder that does not know (what fencing its acks is for), so it is waited out.
    let deadline = Instant::now() + Duration::from_secs(10);
    while first.stats().await.unwrap().active {
        assert!(Instant::now() < deadline, "the first never saw its loss");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    until_active(&second).await;
    for i in 10..20u8 {
        b.append(&topic, &[i]).await.unwrap();
    }
    until("10 more delivered", || seen_b.lock().unwrap().len() == 10).await;
    assert_eq!(*seen_b.lock().unwrap(), (10..20).collect::<Vec<u8>>());
    assert_eq!(seen_a.lock().unwrap().len(), 10, "nothing after its loss");
    let stats = second.stats().await.unwrap();
    assert_eq!((stats.delivered, stats.tenures), (10, 1));
    first.stop().await;
    second.stop().await;
}

async fn a_handler_error_hands_the_same_event_over_and_bad_input_is_refused(h: impl Harness) {
    let (a, _) = h.processes();
    let topic = unique_name("topic");
    for i in 0..10u8 {
        a.append(&topic, &[i]).await.unwrap();
    }
    let seen = Seen::default();
    let consuming = a.consume(recording(&topic, &seen, Some(5))).unwrap();
    until("all handled", || seen.lock().unwrap().len() == 10).await;
    assert_eq!(*seen.lock().unwrap(), (0..10).collect::<Vec<u8>>());
    let stats = consuming.stats().await.unwrap();
    assert_eq!(
        (stats.delivered, stats.handler_errors, stats.redelivered),
        (11, 1, 1)
    );
    consuming.stop().await;
    // Typed errors, before anything starts or is appended.
    let err = a
        .consume(recording(&topic, &seen, None).window(0))
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidConfig);
    let err = a.consume(recording("", &seen, None)).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidName);
    let err = a.append("", &[1]).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidName);
}

async fn a_lease_taken_over_after_expiry_has_the_new_holders_data(h: impl Harness) {
    let (a, b) = h.processes();
    let name = unique_name("expired");
    let dead = a
        .acquire(Acquire::new(&name).data(b"dead's".to_vec()))
        .await
        .unwrap();
    h.expire(&name).await;
    let request = Acquire::new(&name)
        .data(b"mine".to_vec())
        .timeout(Duration::from_secs(5));
    let next = b.acquire(request).await.unwrap();
    assert_eq!(next.data(), Some(&b"mine"[..]), "the new holder's own data");
    let info = a.get(&name).await.unwrap();
    assert_eq!(info.data.as_deref(), Some(&b"mine"[..]));
    assert_eq!(info.token, Some(next.token()));
    let reason = tokio::time::timeout(Duration::from_secs(5), dead.lost())
        .await
        .expect("the old holder learns of it");
    assert_eq!(reason, Some(LossReason::TakenOver));
    next.release().await.unwrap();
}

async fn a_release_is_no_loss(h: impl Harness) {
    let (a, _) = h.processes();
    let name = unique_name("released");
    let mut losses = a.lock_losses().await.unwrap();
    // Released with `release`, and by dropping the handle: `lost()` ends without a loss.
    let lease = a.acquire(Acquire::new(&name)).await.unwrap();
    let lost = lease.lost();
    assert_eq!(lease.loss(), None);
    lease.release().await.unwrap();
    let ended = tokio::time::timeout(Duration::from_secs(5), lost).await;
    assert_eq!(ended, Ok(None), "a clean release is not a loss");
    let lease = a.acquire(Acquire::new(&name)).await.unwrap();
    let lost = lease.lost();
    drop(lease);
    let ended = tokio::time::timeout(Duration::from_secs(5), lost).await;
    assert_eq!(ended, Ok(None), "a dropped handle's release is not a loss");
    let reported = tokio::time::timeout(Duration::from_millis(100), losses.next()).await;
    assert!(reported.is_err(), "{reported:?}");
}

async fn one_holder_at_a_time_with_increasing_tokens(h: impl Harness) {
    let (a, b) = h.processes();
    let name = unique_name("one");
    let first = a.acquire(Acquire::new(&name)).await.unwrap();
    let refused = b
        .acquire(Acquire::new(&name).fail_if_locked())
        .await
        .unwrap_err();
    assert_eq!(refused.kind(), ErrorKind::NotAcquired);
    let holder = refused.holder().expect("the holder is named");
    assert_eq!((holder.owner.as_str(), holder.token), ("a", first.token()));
    let again = a.acquire(Acquire::new(&name)).await.unwrap_err();
    assert_eq!(again.kind(), ErrorKind::AlreadyHeld);

    let token = first.token();
    first.release().await.unwrap();
    let second = b.acquire(Acquire::new(&name)).await.unwrap();
    assert!(second.token() > token, "tokens only increase");
    second.release().await.unwrap();
}

async fn a_waiter_is_served_on_release_and_a_timeout_ends_the_wait(h: impl Harness) {
    let (a, b) = h.processes();
    let name = unique_name("wait");
    let held = a.acquire(Acquire::new(&name)).await.unwrap();

    let started = Instant::now();
    let refused = b
        .acquire(Acquire::new(&name).timeout(Duration::from_millis(300)))
        .await
        .unwrap_err();
    assert_eq!(refused.kind(), ErrorKind::NotAcquired, "{refused}");
    assert!(started.elapsed() >= Duration::from_millis(300));

    let waiter = actix_rt::spawn(b.acquire(Acquire::new(&name)));
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!waiter.is_finished(), "waits while the lease is held");
    held.release().await.unwrap();
    let served = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("served within the bound")
        .unwrap()
        .unwrap();
    served.release().await.unwrap();
}

async fn data_is_stored_kept_and_replaced(h: impl Harness) {
    let (a, b) = h.processes();
    let name = unique_name("data");
    let missing = a.get(&name).await.unwrap_err();
    assert_eq!(missing.kind(), ErrorKind::NotFound);

    let lease = a
        .acquire(Acquire::new(&name).data(b"v1".to_vec()).keep_on_release())
        .await
        .unwrap();
    assert_eq!(lease.data(), Some(&b"v1"[..]));
    let info = b.get(&name).await.unwrap();
    assert_eq!(info.owner.as_deref(), Some("a"));
    assert_eq!(info.token, Some(lease.token()));
    lease.release().await.unwrap();

    // Kept: free, with its data, which a new holder's data does not replace unless asked.
    let info = b.get(&name).await.unwrap();
    assert_eq!((info.owner, info.data.as_deref()), (None, Some(&b"v1"[..])));
    let lease = b
        .acquire(Acquire::new(&name).data(b"v2".to_vec()).keep_on_release())
        .await
        .unwrap();
    assert_eq!(lease.data(), Some(&b"v1"[..]));
    lease.release().await.unwrap();
    let lease = b
        .acquire(Acquire::new(&name).data(b"v3".to_vec()).replace_data())
        .await
        .unwrap();
    assert_eq!(lease.data(), Some(&b"v3"[..]));
    lease.release().await.unwrap();
    // Not kept this time: the row is gone.
    assert_eq!(a.get(&name).await.unwrap_err().kind(), ErrorKind::NotFound);
}

async fn a_lease_taken_over_is_reported_once_and_goes_to_the_waiter(h: impl Harness) {
    let (a, b) = h.processes();
    let name = unique_name("taken");
    let mut losses = a.lock_losses().await.unwrap();
    let lease = a.acquire(Acquire::new(&name)).await.unwrap();
    let waiter = actix_rt::spawn(b.acquire(Acquire::new(&name)));
    tokio::time::sleep(Duration::from_millis(100)).await;

    h.force_loss(&name).await;
    let reason = tokio::time::timeout(Duration::from_secs(5), lease.lost())
        .await
        .expect("the holder learns of it");
    assert_eq!(reason, Some(LossReason::TakenOver));
    let reported = tokio::time::timeout(Duration::from_secs(5), losses.next()).await;
    let reported = reported.expect("reported").expect("the stream runs");
    assert_eq!(reported.key, LockKey::Lease(name.clone()));
    assert_eq!(reported.token, Some(lease.token()));

    let next = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the waiter gets it")
        .unwrap()
        .unwrap();
    assert!(next.token() > lease.token());
    let stale = lease.release().await.unwrap_err();
    assert_eq!(stale.kind(), ErrorKind::LockLost);
    next.release().await.unwrap();
    let again = tokio::time::timeout(Duration::from_millis(100), losses.next()).await;
    assert!(again.is_err(), "reported once: {again:?}");
}

async fn every_subscriber_gets_every_message_in_order(h: impl Harness) {
    let (a, b) = h.processes();
    let channel = unique_name("events");
    let at_a = a.subscribe(&channel).await.unwrap();
    let at_b = b.subscribe(&channel).await.unwrap();
    for i in 0..20u8 {
        a.publish(Publish::new(&channel, vec![i])).await.unwrap();
    }
    for subscription in [at_a, at_b] {
        let got = tokio::time::timeout(Duration::from_secs(5), subscription.take(20).collect());
        let got: Vec<Heard> = got.await.expect("twenty messages");
        let signals: Vec<Signal> = (got.into_iter())
            .map(|heard| match heard {
                Heard::Signal(signal) => signal,
                gap => panic!("no gap without a reconnect: {gap:?}"),
            })
            .collect();
        let payloads: Vec<u8> = signals.iter().map(|s| s.payload[0]).collect();
        assert_eq!(payloads, (0..20).collect::<Vec<u8>>());
        assert!(signals.iter().all(|s| &*s.channel == channel.as_str()));
    }
}

async fn requests_get_replies_errors_and_timeouts(h: impl Harness) {
    let (a, b) = h.processes();
    let echo = unique_name("echo");
    let failing = unique_name("failing");
    let panicking = unique_name("panicking");
    b.serve(Serve::new(&echo, |p| async move { Ok(p) }))
        .await
        .unwrap();
    b.serve(Serve::new(&failing, |_| async move {
        Err("no such customer".to_owned())
    }))
    .await
    .unwrap();
    b.serve(Serve::new(
        &panicking,
        |_| async move { panic!("handler bug") },
    ))
    .await
    .unwrap();

    let reply = a.ask(Ask::new(&echo, b"hi".to_vec())).await.unwrap();
    assert_eq!(reply, b"hi");
    let e = a.ask(Ask::new(&failing, vec![])).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Remote);
    assert!(e.to_string().contains("no such customer"), "{e}");
    let e = a.ask(Ask::new(&panicking, vec![])).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Remote, "{e}");

    // Nobody serves it (any more): no reply within the timeout.
    b.stop_serving(&echo).await.unwrap();
    let started = Instant::now();
    let e = a
        .ask(Ask::new(&echo, b"hi".to_vec()).timeout(Duration::from_millis(300)))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Timeout, "{e}");
    assert!(started.elapsed() >= Duration::from_millis(300));
}

async fn a_reconnect_is_announced_and_subscriptions_survive_it(h: impl Harness) {
    let (a, b) = h.processes();
    let channel = unique_name("resync");
    let mut states = a.conn_states().await.unwrap();
    let mut events = a.subscribe(&channel).await.unwrap();

    h.reconnect().await;
    let reconnected = async {
        while let Some(state) = states.next().await {
            if state == ConnState::Reconnected {
                return;
            }
        }
    };
    (tokio::time::timeout(Duration::from_secs(10), reconnected).await).expect("Reconnected");
    // The subscription marks the gap, then goes on.
    let gap = tokio::time::timeout(Duration::from_secs(5), events.next()).await;
    assert!(
        matches!(gap, Ok(Some(Heard::Gap(ConnState::Reconnected)))),
        "{gap:?}"
    );
    b.publish(Publish::new(&channel, b"after".to_vec()))
        .await
        .unwrap();
    let got = tokio::time::timeout(Duration::from_secs(5), events.next()).await;
    match got {
        Ok(Some(Heard::Signal(signal))) => assert_eq!(&signal.payload[..], b"after"),
        other => panic!("{other:?}"),
    }
}

async fn bad_input_is_refused(h: impl Harness) {
    let (a, _) = h.processes();
    let e = a.acquire(Acquire::new("")).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidName);
    let e = a.acquire(Acquire::new("x".repeat(256))).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidName);
    let bad_channel = "c".repeat(64);
    let e = a
        .publish(Publish::new(&bad_channel, vec![]))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidIdentifier);
    let e = a.subscribe(&bad_channel).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidIdentifier);
}

async fn a_dropped_lease_is_released_and_a_cancelled_wait_leaves_nothing_behind(h: impl Harness) {
    let (a, b) = h.processes();
    let name = unique_name("dropped");
    let lease = a.acquire(Acquire::new(&name)).await.unwrap();
    // A wait given up (its future dropped) before the lease was free.
    let gave_up =
        tokio::time::timeout(Duration::from_millis(200), b.acquire(Acquire::new(&name))).await;
    assert!(gave_up.is_err(), "still held");
    drop(lease);
    // Released in the background; whoever asks next gets it, and the cancelled wait got
    // nothing that nobody holds.
    let next = b
        .acquire(Acquire::new(&name).timeout(Duration::from_secs(5)))
        .await
        .unwrap();
    next.release().await.unwrap();
    let info = a.get(&name).await;
    assert!(
        matches!(&info, Err(e) if e.kind() == ErrorKind::NotFound),
        "nothing left behind: {info:?}"
    );
}
