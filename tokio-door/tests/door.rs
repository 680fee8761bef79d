//! Every capability through the tokio door: a plain tokio runtime, `Runtime`, its `Coordinator`
//! handle and the streams they hand out — no actix type named, no actix dependency.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt;
use pgcoord::schedule::Timing;
use pgcoord::{Config, ConfigBuilder, ErrorKind};
use pgcoord_actors::{
    Acquire, AcquirePermit, Ask, ConnState, Consume, Coordinator, Delivery, Heard, LockKey,
    LossReason, Publish, Runtime, Schedule, Serve, TaskPool,
};
use pgcoord_testkit::{eventually, test_pg_config, unique_name};
use tokio_postgres::Client;

/// A fresh lock table (and its payload, topic and schedule tables) for one test.
struct Tables {
    pg: tokio_postgres::Config,
    table: String,
}

impl Tables {
    async fn new() -> (Tables, Client) {
        let tables = Tables {
            pg: test_pg_config().expect("test database"),
            table: unique_name("door"),
        };
        let config = tables.builder("admin").build().unwrap();
        let client = pgcoord::db::connect_spawned(&config).await.unwrap();
        pgcoord::schema::migrate(&client, &config).await.unwrap();
        (tables, client)
    }

    fn builder(&self, owner: &str) -> ConfigBuilder {
        Config::builder()
            .pg_config(&self.pg)
            .lock_table(&self.table)
            .payload_table(format!("{}_p", self.table))
            .topic_table(format!("{}_t", self.table))
            .schedule_table(format!("{}_s", self.table))
            .owner(owner)
            .lease(Duration::from_secs(2))
            .heartbeat(Duration::from_millis(200))
    }

    async fn runtime(&self, owner: &str) -> Runtime {
        Runtime::connect(self.builder(owner).build().unwrap())
            .await
            .unwrap()
    }
}

/// The next item of `stream` within 10 s.
async fn next<S: futures_util::Stream + Unpin>(stream: &mut S) -> S::Item {
    tokio::time::timeout(Duration::from_secs(10), stream.next())
        .await
        .expect("an item within 10 s")
        .expect("the stream goes on")
}

#[tokio::test]
async fn coordinator_connect_outside_an_actix_system_names_runtime() {
    let (tables, _admin) = Tables::new().await;
    let e = Coordinator::connect(tables.builder("plain").build().unwrap())
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unsupported);
    assert!(e.to_string().contains("Runtime"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_and_permits_with_their_losses_as_a_stream() {
    let (tables, admin) = Tables::new().await;
    let runtime = tables.runtime("holder").await;
    let coordinator = runtime.coordinator();
    let mut losses = coordinator.lock_losses().await.unwrap();

    let name = unique_name("job");
    let lease = coordinator.acquire(Acquire::new(&name)).await.unwrap();
    let permits = unique_name("exports");
    let first = (coordinator.acquire_permit(AcquirePermit::new(&permits, 2)))
        .await
        .unwrap();
    let second = (coordinator.acquire_permit(AcquirePermit::new(&permits, 2)))
        .await
        .unwrap();
    assert_ne!(first.token(), second.token());
    let third = AcquirePermit::new(&permits, 2).timeout(Duration::from_millis(300));
    let refused = coordinator.acquire_permit(third).await.unwrap_err();
    assert_eq!(refused.kind(), ErrorKind::NotAcquired, "{refused}");

    // The lease's row deleted behind the holder's back: its next renewal finds it gone.
    let deleted = admin
        .execute(
            &format!("DELETE FROM \"{}\" WHERE name = $1", tables.table),
            &[&name],
        )
        .await
        .unwrap();
    assert_eq!(deleted, 1);
    let lost = next(&mut losses).await;
    assert_eq!(lost.key, LockKey::Lease(name.clone()));
    assert_eq!(lost.token, Some(lease.token()));
    assert_eq!(lost.reason, LossReason::TakenOver);
    assert_eq!(lease.lost().await, Some(LossReason::TakenOver));

    // A release is not a loss; the shutdown's release of the permits is.
    first.release().await.unwrap();
    drop(lease);
    let released = runtime.shutdown(Duration::from_secs(5)).await.unwrap();
    assert_eq!(released, 1, "the second permit");
    let lost = next(&mut losses).await;
    assert_eq!(lost.token, Some(second.token()));
    assert_eq!(lost.reason, LossReason::Shutdown);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_election_and_its_observer_as_a_stream() {
    let (tables, _admin) = Tables::new().await;
    let runtime = tables.runtime("candidate").await;
    let election = runtime.coordinator().election(unique_name("lead")).unwrap();
    let mut changes = election.changes();
    let first = next(&mut changes).await;
    assert!(first.resync, "the first report is the state now");
    assert_eq!(first.leader, None);

    let term = election.campaign(b"addr-1".to_vec(), None).await.unwrap();
    let change = next(&mut changes).await;
    let leader = change.leader.expect("a leader");
    assert_eq!(
        (leader.owner.as_str(), leader.token),
        ("candidate", term.token())
    );
    assert_eq!(leader.value, b"addr-1");

    term.resign().await.unwrap();
    assert_eq!(next(&mut changes).await.leader, None);
    runtime.shutdown(Duration::from_secs(5)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscription_marks_the_gap_of_a_killed_listener_session() {
    let (tables, admin) = Tables::new().await;
    let app = unique_name("door");
    let config = tables.builder("listener").application_name(&app).build();
    let runtime = Runtime::connect(config.unwrap()).await.unwrap();
    let coordinator = runtime.coordinator();
    let channel = unique_name("orders");
    let mut orders = runtime.subscribe(&channel).await.unwrap();
    let mut states = coordinator.conn_states().await.unwrap();
    assert!(matches!(next(&mut states).await, ConnState::Connected));

    let publish = |n: u32| coordinator.publish(Publish::value(&channel, &n).unwrap());
    publish(1).await.unwrap();
    match next(&mut orders).await {
        Heard::Signal(signal) => assert_eq!(signal.value::<u32>().unwrap(), 1),
        other => panic!("a message, not {other:?}"),
    }

    // The listener's session ends: whatever was published meanwhile is lost, and the stream says
    // so once the listener is back, before any later message.
    let killed = pgcoord_testkit::terminate_backends(&admin, &format!("{app} listener"))
        .await
        .unwrap();
    assert_eq!(killed, 1);
    match next(&mut orders).await {
        Heard::Gap(ConnState::Reconnected) => {}
        other => panic!("a gap, not {other:?}"),
    }
    assert!(matches!(
        next(&mut states).await,
        ConnState::Disconnected { .. }
    ));
    assert!(matches!(next(&mut states).await, ConnState::Reconnected));
    publish(2).await.unwrap();
    match next(&mut orders).await {
        Heard::Signal(signal) => assert_eq!(signal.value::<u32>().unwrap(), 2),
        other => panic!("a message, not {other:?}"),
    }
    drop(orders);
    runtime.shutdown(Duration::from_secs(5)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_reply_a_topic_consumer_a_schedule_and_a_rate_limit() {
    let (tables, _admin) = Tables::new().await;
    let runtime = tables.runtime("services").await;
    let coordinator = runtime.coordinator();

    // Request/reply.
    let channel = unique_name("double");
    let double = Serve::typed(&channel, |n: i64| async move { Ok::<_, String>(n * 2) });
    coordinator.serve(double).await.unwrap();
    let ask = Ask::value(&channel, &21)
        .unwrap()
        .timeout(Duration::from_secs(5));
    let reply: i64 = coordinator.ask_returning(ask).await.unwrap();
    assert_eq!(reply, 42);

    // A durable topic's consumer, handed every event in order.
    let topic = unique_name("orders");
    let (seen, mut handed) = tokio::sync::mpsc::unbounded_channel();
    let consume = Consume::new(&topic, "billing", move |delivery: Delivery| {
        let _ = seen.send(delivery.value::<u32>().unwrap());
        async { Ok(()) }
    })
    .poll(Duration::from_millis(200));
    let _consumer = coordinator.consume(consume).unwrap();
    for n in 0..5u32 {
        coordinator.append_value(&topic, &n).await.unwrap();
    }
    for n in 0..5u32 {
        let handed = tokio::time::timeout(Duration::from_secs(30), handed.recv());
        assert_eq!(handed.await.expect("within 30 s"), Some(n));
    }

    // A schedule's ticks.
    let (ticked, mut ticks) = tokio::sync::mpsc::unbounded_channel();
    let every = Timing::every(Duration::from_millis(200)).unwrap();
    let schedule = Schedule::new(unique_name("rollup"), every, move |tick| {
        let _ = ticked.send(tick.at());
        async { Ok(()) }
    });
    let _runner = coordinator.schedule(schedule).unwrap();
    let (a, b) = (next_tick(&mut ticks).await, next_tick(&mut ticks).await);
    assert!(b > a, "ticks in order: {a:?} then {b:?}");

    // A rate limit: two a minute.
    let rate = pgcoord::rate::RateLimit::new(2, Duration::from_secs(60)).unwrap();
    let limiter = coordinator.rate_limiter(rate);
    let key = unique_name("tenant");
    assert_eq!(limiter.try_take(&key, 1).await.unwrap().granted, 1);
    assert_eq!(limiter.try_take(&key, 1).await.unwrap().granted, 1);
    let refused = limiter.try_take(&key, 1).await.unwrap();
    assert_eq!(refused.granted, 0);
    assert!(refused.retry_after > Duration::ZERO);

    runtime.shutdown(Duration::from_secs(5)).await.unwrap();
}

async fn next_tick(
    ticks: &mut tokio::sync::mpsc::UnboundedReceiver<std::time::SystemTime>,
) -> std::time::SystemTime {
    let tick = tokio::time::timeout(Duration::from_secs(30), ticks.recv());
    tick.await
        .expect("a tick within 30 s")
        .expect("the runner runs")
}

/// Which process runs each key's closure now.
type Running = Arc<Mutex<HashMap<String, String>>>;

/// A pool of six keys whose worker records where it runs until its future is dropped.
fn pool(name: &str, owner: &str, running: &Running) -> TaskPool {
    let keys = (0..6).map(|k| format!("k{k}")).collect();
    let (owner, running) = (owner.to_owned(), running.clone());
    TaskPool::new(name, keys, move |key| {
        let (owner, running) = (owner.clone(), running.clone());
        async move {
            running.lock().unwrap().insert(key.key.clone(), owner);
            // Dropped when the key moves: the guard forgets it.
            let _gone = Forget(running, key.key.clone());
            std::future::pending::<()>().await;
        }
    })
}

struct Forget(Running, String);

impl Drop for Forget {
    fn drop(&mut self) {
        self.0.lock().unwrap().remove(&self.1);
    }
}

fn runs_in(running: &Running, owner: &str) -> usize {
    running
        .lock()
        .unwrap()
        .values()
        .filter(|o| *o == owner)
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closure_workers_share_keys_across_runtimes_and_move_when_one_stops() {
    let (tables, _admin) = Tables::new().await;
    let a = tables.runtime("a").await;
    let (b, c) = (tables.runtime("b").await, tables.runtime("c").await);
    let (name, running) = (unique_name("pool"), Running::default());
    let in_a = a
        .coordinator()
        .run_tasks(pool(&name, "a", &running))
        .unwrap();
    let in_b = b
        .coordinator()
        .run_tasks(pool(&name, "b", &running))
        .unwrap();
    let in_c = c
        .coordinator()
        .run_tasks(pool(&name, "c", &running))
        .unwrap();
    let mut members = in_b.members().await.unwrap();
    let shares = |a, b, c| {
        runs_in(&running, "a") == a && runs_in(&running, "b") == b && runs_in(&running, "c") == c
    };

    eventually(Duration::from_secs(20), "two keys each", async || {
        shares(2, 2, 2)
    })
    .await;
    // A stream's first report lists every member it tells of as joined.
    let mut seen = next(&mut members).await;
    assert!(!seen.members.is_empty());
    assert_eq!((&seen.joined, &seen.left), (&seen.members, &vec![]));
    while seen.members != ["a", "b", "c"] {
        seen = next(&mut members).await;
    }
    assert_eq!(in_a.assignment().await.unwrap().keys.len(), 2);

    // c's handle dropped: its pool stops there, its keys go to a and b.
    drop(in_c);
    eventually(
        Duration::from_secs(20),
        "three keys each in a and b",
        async || shares(3, 3, 0),
    )
    .await;
    // a's runtime stops gracefully, draining its pool first: b runs all six.
    a.shutdown(Duration::from_secs(5)).await.unwrap();
    eventually(Duration::from_secs(20), "six keys in b", async || {
        shares(0, 6, 0)
    })
    .await;
    eventually(Duration::from_secs(10), "b alone", async || {
        next(&mut members).await.members == ["b"]
    })
    .await;
    assert_eq!(in_b.assignment().await.unwrap().keys.len(), 6);

    // Keys taken away: their futures dropped, their leases released.
    let kept: Vec<String> = (0..3).map(|k| format!("k{k}")).collect();
    in_b.set_keys(kept.clone()).await.unwrap();
    eventually(Duration::from_secs(10), "three keys in b", async || {
        shares(0, 3, 0)
    })
    .await;
    let held = in_b.assignment().await.unwrap().keys;
    assert_eq!(held.into_keys().collect::<Vec<_>>(), kept);

    // A drain hands every key over and drops every future.
    in_b.drain(Duration::from_secs(5)).await.unwrap();
    assert_eq!(runs_in(&running, "b"), 0, "every future dropped");
    drop(in_a);
    b.shutdown(Duration::from_secs(5)).await.unwrap();
    c.shutdown(Duration::from_secs(5)).await.unwrap();
}

#[tokio::test]
async fn a_bad_pool_name_is_refused_before_anything_starts() {
    let (tables, _admin) = Tables::new().await;
    let runtime = tables.runtime("bad").await;
    let pool = TaskPool::new("", vec!["k".into()], |_| async {});
    let e = runtime.coordinator().run_tasks(pool).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidName, "{e}");
    runtime.shutdown(Duration::from_secs(5)).await.unwrap();
}

/// A closure that panics takes only its key's worker down: the pool starts it again at its next
/// tick, with the same key and lease (the token does not change), and the runtime goes on.
#[tokio::test]
async fn a_closure_that_panics_runs_again_with_its_key() {
    let (tables, _admin) = Tables::new().await;
    let runtime = tables.runtime("panics").await;
    let runs: Arc<Mutex<Vec<i64>>> = Arc::default();
    let pool = {
        let runs = runs.clone();
        TaskPool::new(unique_name("pool"), vec!["k".into()], move |key| {
            let runs = runs.clone();
            async move {
                let first = {
                    let mut runs = runs.lock().unwrap();
                    runs.push(key.token);
                    runs.len() == 1
                };
                if first {
                    panic!("the first run of a key's closure fails");
                }
                std::future::pending::<()>().await;
            }
        })
    };
    let workers = runtime.coordinator().run_tasks(pool).unwrap();
    eventually(
        Duration::from_secs(20),
        "run again after the panic",
        async || runs.lock().unwrap().len() >= 2,
    )
    .await;
    let runs = runs.lock().unwrap().clone();
    assert_eq!(runs[0], runs[1], "the same lease: {runs:?}");
    let assignment = workers.assignment().await.unwrap();
    assert_eq!(assignment.keys.len(), 1);
    assert!(assignment.restarts >= 1, "{assignment:?}");
    drop(workers);
    runtime.shutdown(Duration::from_secs(5)).await.unwrap();
}

/// A runtime shut down while a topic consumer runs stops it without a panic on the runtime's
/// thread (the consumer's stop used to spawn its wind-down on a tokio runtime already gone).
#[tokio::test]
async fn a_runtime_shut_down_with_a_consumer_running_stops_without_a_panic() {
    let panics = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let seen = panics.clone();
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if std::thread::current().name() == Some("pgcoord-actix") {
            seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
        previous(info);
    }));
    let (tables, _admin) = Tables::new().await;
    let runtime = tables.runtime("consumer").await;
    let coordinator = runtime.coordinator();
    let topic = unique_name("orders");
    let (seen, mut handed) = tokio::sync::mpsc::unbounded_channel();
    let consume = Consume::new(&topic, "billing", move |_: Delivery| {
        let _ = seen.send(());
        async { Ok(()) }
    })
    .poll(Duration::from_millis(200));
    let _consumer = coordinator.consume(consume).unwrap();
    coordinator.append_value(&topic, &1u32).await.unwrap();
    let handed = tokio::time::timeout(Duration::from_secs(30), handed.recv());
    assert!(handed.await.expect("within 30 s").is_some());
    runtime.shutdown(Duration::from_secs(5)).await.unwrap();
    // The runtime's thread has ended (its shutdown waits for it).
    assert_eq!(panics.load(std::sync::atomic::Ordering::SeqCst), 0);
}
