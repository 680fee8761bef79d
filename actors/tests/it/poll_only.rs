//! Poll-only mode: no LISTEN, no NOTIFY. Leases, permits, elections and durable topics go on
//! by polling; what needs LISTEN is refused; and no statement sends a notification.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pgcoord::ErrorKind;
use pgcoord_actors::*;

use super::Setup;

#[actix_rt::test]
async fn leases_permits_elections_and_topics_go_on_by_polling_and_nothing_notifies() {
    // A 2 s lease: waiters look again every 500 ms.
    let (setup, _admin) = Setup::new(Duration::from_secs(2), Duration::from_millis(400)).await;
    let config = |owner: &str| setup.builder(owner).poll_only(true).build().unwrap();
    // A LISTEN on every channel pgcoord would notify for these tables.
    let ears = config("ears");
    let topics = pgcoord::TopicTable::new(&ears);
    let topic_channel = pgcoord::ident::Ident::channel(topics.channel()).unwrap();
    let channels = [
        ears.lease_channel(),
        ears.election_channel(),
        &topic_channel,
    ];
    let (listening, mut heard) = super::listen_on(&ears, &channels).await;
    let (a, b) = (
        Coordinator::start(config("a")),
        Coordinator::start(config("b")),
    );

    // A lease handed over: the waiter finds it free at its next look.
    let held = a.acquire(Acquire::new("job")).await.unwrap();
    let waiting = actix_rt::spawn(
        b.locks()
            .unwrap()
            .call(Acquire::new("job").timeout(Duration::from_secs(5))),
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    let released = Instant::now();
    held.release().await.unwrap();
    let taken = waiting.await.unwrap().unwrap();
    let handoff = released.elapsed();
    assert!(handoff < Duration::from_millis(1500), "{handoff:?}");
    taken.release().await.unwrap();

    // A stored limit raised: the waiter gets in at its next look.
    a.set_limit(SetLimit::new("jobs", 1)).await.unwrap();
    let first = a
        .acquire_permit(AcquirePermit::limited("jobs"))
        .await
        .unwrap();
    let waiting = actix_rt::spawn(
        b.locks()
            .unwrap()
            .call(AcquirePermit::limited("jobs").timeout(Duration::from_secs(5))),
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    b.set_limit(SetLimit::new("jobs", 2)).await.unwrap();
    let second = waiting.await.unwrap().unwrap();
    assert_ne!(first.name(), second.name());

    // An election: the next candidate is elected once the leader resigns.
    let leader = a
        .election("primary")
        .unwrap()
        .campaign("a", None)
        .await
        .unwrap();
    let next = actix_rt::spawn({
        let election = b.election("primary").unwrap();
        async move { election.campaign("b", Some(Duration::from_secs(5))).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let resigned = Instant::now();
    leader.resign().await.unwrap();
    let elected = next.await.unwrap().unwrap();
    assert!(resigned.elapsed() < Duration::from_millis(1500));
    assert_eq!(elected.value(), b"b");

    // A durable topic: appended, consumed at the consumer's poll.
    let seen = Arc::new(Mutex::new(Vec::new()));
    let consumer = {
        let seen = seen.clone();
        b.consume(
            Consume::new("orders", "billing", move |delivery: Delivery| {
                seen.lock().unwrap().push(delivery.event().body.clone());
                async { Ok(()) }
            })
            .poll(Duration::from_millis(100)),
        )
        .unwrap()
    };
    for i in 0..5u8 {
        a.append("orders", &[i]).await.unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while seen.lock().unwrap().len() < 5 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let bodies: Vec<Vec<u8>> = seen.lock().unwrap().clone();
    assert_eq!(bodies, (0..5u8).map(|i| vec![i]).collect::<Vec<_>>());
    consumer.stop().await;

    // What needs LISTEN is refused, saying so.
    let refused = [
        a.publish(Publish::new("events", b"x".to_vec())).await,
        a.signals()
            .unwrap()
            .call(Ask::new("rpc", b"x".to_vec()).timeout(Duration::from_secs(1)))
            .await
            .map(|_| ()),
    ];
    for result in refused {
        let err = result.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Unsupported, "{err}");
        assert!(err.to_string().contains("poll-only"), "{err}");
    }
    let router = KeyRouter::new(
        "counters",
        a.locks().unwrap().clone(),
        a.signals().unwrap().clone(),
    );
    let err = (router.ask("k", b"x".to_vec(), Duration::from_secs(2)))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unsupported, "routing by key: {err}");
    let (_, recipient) = super::Collector::<Signal>::start_new();
    let err = (a
        .signals()
        .unwrap()
        .call(Subscribe::new("events", recipient)))
    .await
    .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unsupported);
    assert!(a.health(Duration::from_secs(2)).await.is_ready());

    // Nothing above notified: a marker sent now is the first thing heard.
    let channel = config("ears").lease_channel().as_str().to_owned();
    (listening.execute("SELECT pg_notify($1, 'marker')", &[&channel]))
        .await
        .unwrap();
    let heard_first = tokio::time::timeout(Duration::from_secs(5), heard.recv()).await;
    assert_eq!(heard_first.unwrap(), Some(format!("{channel}: marker")));
    eprintln!("lease handoff by polling: {handoff:?}");
    drop((first, second, elected));
    a.shutdown(Duration::from_secs(5)).await.unwrap();
    b.shutdown(Duration::from_secs(5)).await.unwrap();
}

/// A worker that does nothing but stop when told.
struct Idle;
impl actix::Actor for Idle {
    type Context = actix::Context<Self>;
}
impl actix::Handler<Shutdown> for Idle {
    type Result = ();
    fn handle(&mut self, _: Shutdown, ctx: &mut actix::Context<Self>) {
        actix::ActorContext::stop(ctx);
    }
}

#[actix_rt::test]
async fn a_worker_pool_moves_keys_at_a_tick_of_at_most_a_second() {
    // A 20 s lease: a pool's tick would be 5 s; polling only, it is 1 s.
    let (setup, _admin) = Setup::new(Duration::from_secs(20), Duration::from_secs(4)).await;
    let pool = |owner: &str| {
        let config = setup.builder(owner).poll_only(true).build().unwrap();
        let locks = actix::Actor::start(LockManager::new(config.clone()));
        let keys = vec!["k1".to_owned(), "k2".to_owned()];
        actix::Actor::start(WorkerPool::new(&config, locks, "polled", keys, |_| Idle))
    };
    let served = async |pool: &actix::Addr<WorkerPool<Idle>>| {
        pool.send(GetStats::new()).await.unwrap().keys.len()
    };
    let a = pool("a");
    pgcoord_testkit::eventually(Duration::from_secs(4), "a serves both", async || {
        served(&a).await == 2
    })
    .await;
    // b joins and a drains: b serves both keys within a few of its ticks — before a single
    // tick of a quarter lease (5 s) has passed.
    let joined = Instant::now();
    let b = pool("b");
    a.send(Drain).await.unwrap();
    pgcoord_testkit::eventually(Duration::from_secs(4), "b serves both", async || {
        served(&b).await == 2
    })
    .await;
    eprintln!("keys moved by polling in {:?}", joined.elapsed());
    assert!(joined.elapsed() < Duration::from_secs(5));
}

#[actix_rt::test]
async fn a_waiter_across_a_server_restart_gets_the_lease_once_it_is_released() {
    let (server, setup, admin) = super::own_cluster::own_cluster().await;
    let config = |owner: &str| setup.builder(owner).poll_only(true).build().unwrap();
    let (a, b) = (
        Coordinator::start(config("a")),
        Coordinator::start(config("b")),
    );
    let held = a.acquire(Acquire::new("job")).await.unwrap();
    let waiting = actix_rt::spawn(
        b.locks()
            .unwrap()
            .call(Acquire::new("job").timeout(Duration::from_secs(20))),
    );
    // The waiter has looked and lined up; the grant is on disk.
    tokio::time::sleep(Duration::from_secs(1)).await;
    drop(admin);
    super::own_cluster::on_server(&server, pgcoord_testkit::TempPostgres::restart_immediate).await;
    // Nothing to hear and nothing missed: the waiter's next looks find the lease free.
    let (released, held_token) = (Instant::now(), held.token());
    held.release().await.unwrap();
    let taken = waiting.await.unwrap().unwrap();
    assert!(taken.token() > held_token);
    // At most a poll (a quarter of the 2 s lease) and the reconnects after the restart.
    assert!(
        released.elapsed() < Duration::from_secs(10),
        "{:?}",
        released.elapsed()
    );
    taken.release().await.unwrap();
    a.shutdown(Duration::from_secs(5)).await.unwrap();
    b.shutdown(Duration::from_secs(5)).await.unwrap();
}
