//! A graceful stop: `Coordinator::shutdown` releases every lease and advisory lock of the
//! process at once, tells each holder, and stops the consumers of durable topics.

use std::time::{Duration, Instant};

use actix::Actor;
use pgcoord_actors::*;
use pgcoord_testkit::unique_name;

use super::Setup;

#[actix_rt::test]
async fn a_graceful_shutdown_releases_every_lease_and_advisory_lock_at_once() {
    // A long lease: nothing here can be explained by an expiry.
    let (setup, admin) = Setup::new(Duration::from_secs(60), Duration::from_secs(10)).await;
    let one = Coordinator::connect(setup.builder("one").build().unwrap())
        .await
        .unwrap();
    let names: Vec<String> = (0..3).map(|_| unique_name("graceful")).collect();
    let mut leases = Vec::new();
    for name in &names {
        leases.push(one.acquire(Acquire::new(name)).await.unwrap());
    }
    let key = i64::from(std::process::id()) * 1000 + 7;
    let guard = one
        .advisory()
        .unwrap()
        .call(AdvisoryLock::new(key))
        .await
        .unwrap();
    let consumer = one
        .consume(Consume::new("t", "c", |_| async { Ok(()) }).poll(Duration::from_millis(50)))
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !consumer.stats().await.unwrap().active {
        assert!(
            Instant::now() < deadline,
            "the consumer never took its lease"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    let released = one.shutdown(Duration::from_secs(5)).await.unwrap();
    assert_eq!(released, 4, "three leases and the consumer's");
    // At once: nothing of this owner is left in the lock table...
    let rows: i64 = admin
        .query_one(
            &format!(
                "SELECT count(*) FROM {} WHERE owner = 'one'",
                setup.quoted_table()
            ),
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(rows, 0);
    // ...every holder was told, and another process takes each lease and the advisory lock
    // without waiting.
    for lease in &leases {
        assert_eq!(lease.loss(), Some(LossReason::Shutdown));
    }
    let two = Coordinator::connect(setup.builder("two").build().unwrap())
        .await
        .unwrap();
    let mut taken = Vec::new();
    for name in &names {
        taken.push(
            two.locks()
                .unwrap()
                .call(Acquire::new(name).fail_if_locked())
                .await
                .unwrap(),
        );
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match two.advisory().unwrap().call(AdvisoryLock::new(key)).await {
            Ok(_) => break,
            Err(e) if e.kind() == pgcoord::ErrorKind::NotAcquired => {
                assert!(Instant::now() < deadline, "the advisory lock stayed held");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Err(e) => panic!("{e}"),
        }
    }
    drop(guard);
    // The consumer stopped instead of waiting for a lease from a stopped manager.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let stats = consumer.stats().await.unwrap();
    assert_eq!((stats.active, stats.tenures), (false, 1), "{stats:?}");
}

/// What a pool's worker saw when it was told to stop: whether its key's lease was still held.
type Stops = std::sync::Arc<std::sync::Mutex<Vec<(String, Option<LossReason>)>>>;

struct Stopping {
    key: WorkerKey,
    stops: Stops,
}

impl actix::Actor for Stopping {
    type Context = actix::Context<Self>;
}

impl actix::Handler<Shutdown> for Stopping {
    type Result = ();
    fn handle(&mut self, _: Shutdown, ctx: &mut actix::Context<Self>) {
        let seen = (self.key.key.clone(), self.key.loss());
        self.stops.lock().unwrap().push(seen);
        actix::ActorContext::stop(ctx);
    }
}

/// A shutdown drains the worker pools it was given first: each worker is told to stop while
/// its key's lease is still held (released only after it stopped), then the rest goes.
#[actix_rt::test]
async fn a_shutdown_drains_its_worker_pools_before_it_releases_their_keys() {
    use actix::Actor as _;
    let (setup, admin) = Setup::new(Duration::from_secs(4), Duration::from_secs(1)).await;
    let config = setup.builder("one").build().unwrap();
    let one = Coordinator::connect(config.clone()).await.unwrap();
    let stops = Stops::default();
    let keys: Vec<String> = (0..5).map(|i| format!("k{i}")).collect();
    let factory = {
        let stops = stops.clone();
        move |key: WorkerKey| Stopping {
            key,
            stops: stops.clone(),
        }
    };
    let pool = WorkerPool::new(
        &config,
        one.locks().unwrap().clone(),
        "drained",
        keys,
        factory,
    )
    .start();
    one.drain_on_shutdown(pool.clone().recipient()).unwrap();
    pgcoord_testkit::eventually(Duration::from_secs(10), "every key held", async || {
        pool.send(GetStats::new()).await.unwrap().keys.len() == 5
    })
    .await;

    let started = Instant::now();
    one.shutdown(Duration::from_secs(3)).await.unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    let stops = stops.lock().unwrap().clone();
    assert_eq!(stops.len(), 5, "{stops:?}");
    assert!(
        stops.iter().all(|(_, loss)| loss.is_none()),
        "told to stop after its key was released: {stops:?}"
    );
    // Released, not expired (the lease is 4 s): nothing of this owner is held.
    let held: i64 = admin
        .query_one(
            &format!(
                "SELECT count(*) FROM {} WHERE owner = 'one' AND expires_at > clock_timestamp()",
                setup.quoted_table()
            ),
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(held, 0);
}

/// A shutdown waits for what is under way when it begins: the release of a handle dropped just
/// before (here held up by a transaction that locks its row), and a wait in line, which ends
/// with `Unavailable` instead of winning a lease nobody would release. When it returns, the
/// process holds nothing, and asks made after it are refused.
#[actix_rt::test]
async fn a_shutdown_waits_for_releases_under_way_and_ends_waits_without_a_grant() {
    let (setup, mut admin) = Setup::new(Duration::from_secs(60), Duration::from_secs(10)).await;
    let one = Coordinator::connect(setup.builder("one").build().unwrap())
        .await
        .unwrap();
    let two = Coordinator::connect(setup.builder("two").build().unwrap())
        .await
        .unwrap();
    let (dropped, contended) = (unique_name("dropped"), unique_name("contended"));
    let lease = one.acquire(Acquire::new(&dropped)).await.unwrap();
    // Another transaction locks the row: the dropped handle's release waits for it.
    let table = setup.quoted_table();
    let locker = admin.transaction().await.unwrap();
    locker
        .execute(
            &format!("SELECT 1 FROM {table} WHERE name = $1 FOR UPDATE"),
            &[&dropped],
        )
        .await
        .unwrap();
    drop(lease);
    // A wait in line behind another process's lease, which is freed during the shutdown.
    let theirs = two.acquire(Acquire::new(&contended)).await.unwrap();
    let waiter = {
        let locks = one.locks().unwrap().clone();
        let name = contended.clone();
        actix_rt::spawn(async move { locks.call(Acquire::new(name)).await })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;

    let shutdown = {
        let one = one.clone();
        actix_rt::spawn(async move { one.shutdown(Duration::from_secs(10)).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    theirs.release().await.unwrap();
    assert!(
        !shutdown.is_finished(),
        "the shutdown waits for the release"
    );
    locker.commit().await.unwrap();
    shutdown.await.unwrap().unwrap();

    let waited = waiter.await.unwrap().unwrap_err();
    assert_eq!(waited.kind(), pgcoord::ErrorKind::Unavailable, "{waited}");
    let rows: i64 = admin
        .query_one(
            &format!("SELECT count(*) FROM {table} WHERE owner = 'one'"),
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(rows, 0, "nothing of the stopped process is held");
    two.shutdown(Duration::from_secs(5)).await.unwrap();
}

/// A place in line a dead process left behind is deleted by any running manager within about a
/// lease of lapsing: the line's table keeps nothing nobody would prune.
#[actix_rt::test]
async fn a_place_in_line_left_by_a_dead_process_is_reaped_within_a_lease() {
    let lease = Duration::from_secs(1);
    let (setup, admin) = Setup::new(lease, Duration::from_millis(300)).await;
    let config = setup.builder("alive").build().unwrap();
    let table = pgcoord::LeaseTable::new(&config);
    let name = unique_name("line");
    let request = pgcoord::lease::AcquireRequest::new(&name);
    let holder = table.owner("holder").unwrap();
    assert!(matches!(
        holder
            .try_acquire(&admin, &request, Duration::from_secs(60))
            .await
            .unwrap(),
        pgcoord::lease::Attempt::Granted(_)
    ));
    // The dead process: in line for 100 ms, then never heard of again.
    let dead = table.owner("dead").unwrap();
    let queued = dead.try_acquire_or_queue(&admin, &request, lease, Duration::from_millis(100));
    assert!(matches!(
        queued.await.unwrap(),
        pgcoord::lease::Attempt::Held(_)
    ));
    let places = async || -> i64 {
        let sql = format!("SELECT count(*) FROM {}", config.lock_queue().quoted());
        admin.query_one(&sql, &[]).await.unwrap().get(0)
    };
    assert_eq!(places().await, 1);
    let _alive = LockManager::new(config.clone()).start();
    pgcoord_testkit::eventually(Duration::from_secs(5), "the place reaped", async || {
        places().await == 0
    })
    .await;
}

/// A claim whose grants arrive after the shutdown began frees them as it was asked to release
/// them: a name claimed `keep_on_release` keeps its row and the row's data, free.
#[actix_rt::test]
async fn a_claim_ended_by_a_shutdown_keeps_the_rows_it_was_asked_to_keep() {
    let (setup, admin) = Setup::new(Duration::from_secs(60), Duration::from_secs(10)).await;
    let name = unique_name("kept");
    let seed = Coordinator::connect(setup.builder("seed").build().unwrap())
        .await
        .unwrap();
    let lease = (seed.acquire(Acquire::new(&name).data(b"kept data").keep_on_release()))
        .await
        .unwrap();
    lease.release().await.unwrap();
    seed.shutdown(Duration::from_secs(5)).await.unwrap();
    // The row's version: a grant and its release make new ones.
    let sql = format!(
        "SELECT owner, data, xmin::text FROM {} WHERE name = $1",
        setup.quoted_table()
    );
    let row = async || admin.query_opt(&sql, &[&name]).await.unwrap();
    let seeded: String = row().await.unwrap().get(2);

    // Every round trip of the claiming manager takes 600 ms more: its claim is in flight when
    // the shutdown (sent after it, so handled after it) begins.
    let proxy = pgcoord_testkit::Proxy::start(&setup.pg).await.unwrap();
    let config = (setup.builder("claimer"))
        .pg_config(&proxy.pg_config(&setup.pg))
        .build()
        .unwrap();
    let manager = LockManager::new(config).start();
    // Its pool connected first, so that the claim's statement is what is slow.
    let warm = manager
        .send(Acquire::new(unique_name("warm")))
        .await
        .unwrap();
    warm.unwrap().release().await.unwrap();
    proxy.delay(Duration::from_millis(300));
    let claim = manager.send(Claim::new(vec![name.clone()]).keep_on_release());
    let shutdown = manager.send(Shutdown);
    // The claim fails: refused as the manager closes, or never answered as it stops.
    let claimed = claim.await;
    assert!(
        !matches!(claimed, Ok(Ok(_))),
        "granted during a shutdown: {claimed:?}"
    );
    shutdown.await.unwrap();

    // Its grant, recorded by nobody, is freed in the background.
    pgcoord_testkit::eventually(Duration::from_secs(10), "the grant freed", async || {
        row().await.is_none_or(|r| {
            r.get::<_, Option<String>>(0).is_none() && r.get::<_, String>(2) != seeded
        })
    })
    .await;
    let row = row().await.expect("the kept row is still there");
    assert_eq!(
        row.get::<_, Option<Vec<u8>>>(1).as_deref(),
        Some(&b"kept data"[..])
    );
}
