//! Leases under contention: no overlap and no starvation, no stealing back from a waiter,
//! releases that never miss, and wake-ups through the one LISTEN connection.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use pgcoord::ErrorKind;
use pgcoord_actors::*;

use super::Setup;

#[actix_rt::test]
async fn sixteen_contenders_never_overlap_and_all_are_served() {
    let (setup, _) = Setup::new(Duration::from_secs(5), Duration::from_secs(1)).await;
    const CONTENDERS: usize = 16;
    const ROUNDS: u32 = 6;
    let inside = Arc::new(AtomicBool::new(false));
    let total = Arc::new(AtomicU32::new(0));
    let mut tasks = Vec::new();
    for i in 0..CONTENDERS {
        let manager = setup.manager(&format!("c{i}"));
        let (inside, total) = (inside.clone(), total.clone());
        tasks.push(actix_rt::spawn(async move {
            for _ in 0..ROUNDS {
                let lease = manager
                    .send(Acquire::new("counter"))
                    .await
                    .unwrap()
                    .unwrap();
                assert!(!inside.swap(true, Ordering::SeqCst), "two holders at once");
                total.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(2)).await;
                inside.store(false, Ordering::SeqCst);
                lease.release().await.unwrap();
            }
        }));
    }
    let started = Instant::now();
    for task in tasks {
        tokio::time::timeout(Duration::from_secs(60), task)
            .await
            .expect("every contender is served")
            .unwrap();
    }
    assert_eq!(total.load(Ordering::SeqCst), CONTENDERS as u32 * ROUNDS);
    eprintln!(
        "{} handoffs in {:?}",
        CONTENDERS as u32 * ROUNDS,
        started.elapsed()
    );
}

#[actix_rt::test]
async fn a_coordinator_wakes_waiters_through_its_one_listen_connection() {
    let (setup, admin) = Setup::new(Duration::from_secs(30), Duration::from_secs(5)).await;
    let app = pgcoord_testkit::unique_name("app");
    let start = |owner: &str| {
        Coordinator::start(setup.builder(owner).application_name(&app).build().unwrap())
    };
    let (a, b) = (start("a"), start("b"));
    let held = a
        .locks()
        .unwrap()
        .send(Acquire::new("job"))
        .await
        .unwrap()
        .unwrap();
    let waiting = b
        .locks()
        .unwrap()
        .send(Acquire::new("job").timeout(Duration::from_secs(10)));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let released = Instant::now();
    held.release().await.unwrap();
    let lease = waiting.await.unwrap().unwrap();
    // The polling fallback is a quarter lease (7.5 s): this fast, it was the NOTIFY.
    assert!(
        released.elapsed() < Duration::from_secs(2),
        "{:?}",
        released.elapsed()
    );
    lease.release().await.unwrap();
    let names: Vec<String> = admin
        .query("SELECT application_name FROM pg_stat_activity WHERE application_name LIKE $1 || ' %' ORDER BY 1", &[&app])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(
        names,
        [format!("{app} listener"), format!("{app} listener")],
        "one LISTEN connection per coordinator, no lease waker"
    );
}

#[actix_rt::test]
async fn a_releaser_cannot_take_the_lock_straight_back_from_a_waiter() {
    let (setup, admin) = Setup::new(Duration::from_secs(30), Duration::from_secs(5)).await;
    let (a, b) = (setup.manager("a"), setup.manager("b"));
    for round in 0..3 {
        let held = a.send(Acquire::new("job")).await.unwrap().unwrap();
        let waiting = actix_rt::spawn(b.send(Acquire::new("job").timeout(Duration::from_secs(10))));
        // b has reserved the next grant: it is in line.
        super::in_line(&setup, &admin, "job", 1).await;
        held.release().await.unwrap();
        let again = a.send(Acquire::new("job").fail_if_locked()).await.unwrap();
        assert_eq!(
            again.unwrap_err().kind(),
            ErrorKind::NotAcquired,
            "round {round}"
        );
        waiting
            .await
            .unwrap()
            .unwrap()
            .unwrap()
            .release()
            .await
            .unwrap();
    }
    // Nobody waits any more: the released lock's row is gone.
    let err = setup.table().get("job").await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound);
}

#[actix_rt::test]
async fn releases_under_contention_never_miss_their_own_lease() {
    // Waiters reserve the next grant while the holder releases: the release must still find
    // its lease, every time.
    let (setup, _) = Setup::new(Duration::from_secs(10), Duration::from_secs(2)).await;
    let stop = Instant::now() + Duration::from_secs(3);
    let tasks: Vec<_> = (0..6)
        .map(|i| {
            let manager = setup.manager(&format!("c{i}"));
            actix_rt::spawn(async move {
                let mut handoffs = 0;
                while Instant::now() < stop {
                    let lease = manager.send(Acquire::new("hot")).await.unwrap().unwrap();
                    lease.release().await.expect("a held lease releases");
                    handoffs += 1;
                }
                handoffs
            })
        })
        .collect();
    let mut total = 0;
    for task in tasks {
        total += task.await.unwrap();
    }
    eprintln!("{total} handoffs");
    assert!(total > 100, "{total}");
}

/// A release whose next grant is reserved wakes only the reserved waiter's process: the others
/// would only be refused (and on a hot lock their attempts would hold up the waiter's). When the
/// waiter's tenure ends, the next release wakes the rest.
#[actix_rt::test]
async fn a_reserved_release_wakes_only_the_reserved_waiter() {
    let (setup, _) = Setup::new(Duration::from_secs(20), Duration::from_secs(5)).await;
    let (holder, first, second) = (
        setup.manager("holder"),
        setup.manager("first"),
        setup.manager("second"),
    );
    let held = holder.send(Acquire::new("job")).await.unwrap().unwrap();
    let first_waits =
        actix_rt::spawn(first.send(Acquire::new("job").timeout(Duration::from_secs(10))));
    tokio::time::sleep(Duration::from_millis(200)).await; // first has reserved the next grant
    let second_waits =
        actix_rt::spawn(second.send(Acquire::new("job").timeout(Duration::from_secs(10))));
    tokio::time::sleep(Duration::from_millis(200)).await; // second was refused and sleeps
    let attempts = |m: &actix::Addr<LockManager>| m.send(GetStats::new());
    let before = attempts(&second).await.unwrap().acquire_statements;
    held.release().await.unwrap();
    let lease = first_waits.await.unwrap().unwrap().unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let after = attempts(&second).await.unwrap().acquire_statements;
    assert_eq!(
        after, before,
        "the second waiter was not woken for a grant it cannot get"
    );
    // Its poll is a quarter of the lease (5 s) away: the release of an unreserved grant wakes it.
    let released = Instant::now();
    lease.release().await.unwrap();
    let lease = second_waits.await.unwrap().unwrap().unwrap();
    assert!(
        released.elapsed() < Duration::from_secs(1),
        "{:?}",
        released.elapsed()
    );
    lease.release().await.unwrap();
}

/// Waiters in different processes (managers) are served in the order they arrived: each puts
/// itself in line when its first attempt is refused, and only the first in line may take the
/// lease, even after its row was deleted by the release.
#[actix_rt::test]
async fn waiters_across_processes_are_served_in_arrival_order() {
    let (setup, admin) = Setup::new(Duration::from_secs(30), Duration::from_secs(5)).await;
    let holder = setup.manager("holder");
    let held = holder.send(Acquire::new("line")).await.unwrap().unwrap();
    let order = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    for i in 0..5 {
        let (manager, order) = (setup.manager(&format!("w{i}")), order.clone());
        waiters.push(actix_rt::spawn(async move {
            let lease = manager.send(Acquire::new("line")).await.unwrap().unwrap();
            order.lock().unwrap().push(i);
            tokio::time::sleep(Duration::from_millis(20)).await;
            lease.release().await.unwrap();
        }));
        // In line before the next one asks.
        super::in_line(&setup, &admin, "line", i as i64 + 1).await;
    }
    held.release().await.unwrap();
    // The releaser asks again at once: it is behind all five.
    let again = holder
        .send(Acquire::new("line").timeout(Duration::from_secs(20)))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(*order.lock().unwrap(), vec![0, 1, 2, 3, 4]);
    for waiter in waiters {
        waiter.await.unwrap();
    }
    again.release().await.unwrap();
}

/// Eight processes started at once take turns on one lease for two seconds: every release
/// reaches the waiter first in line, so the lease never sits free while its waiters sleep (their
/// polling fallback is a quarter lease, 5 s here: a missed turn would show as a gap that long).
#[actix_rt::test]
async fn a_contended_lease_keeps_changing_hands_from_the_start() {
    let (setup, _) = Setup::new(Duration::from_secs(20), Duration::from_secs(5)).await;
    let grants = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let stop = Instant::now() + Duration::from_secs(2);
    let tasks: Vec<_> = (0..8)
        .map(|i| {
            let (manager, grants) = (setup.manager(&format!("p{i}")), grants.clone());
            actix_rt::spawn(async move {
                while Instant::now() < stop {
                    let lease = manager.send(Acquire::new("turns")).await.unwrap().unwrap();
                    grants.lock().unwrap().push(Instant::now());
                    lease.release().await.unwrap();
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    let grants = grants.lock().unwrap();
    let longest = grants
        .windows(2)
        .map(|w| w[1] - w[0])
        .max()
        .unwrap_or_default();
    eprintln!("{} grants, longest gap {longest:?}", grants.len());
    assert!(grants.len() > 100, "{} grants", grants.len());
    assert!(
        longest < Duration::from_secs(1),
        "the lease sat free for {longest:?}"
    );
}

/// A manager whose last wait for a name was refused waits for it in line from its next wait's
/// first attempt: two statements for a contended acquisition (its place in line, then the
/// grant after the doorbell) where the first took three (a plain attempt refused first). The
/// lease and heartbeat are long, so no renewal meets an attempt, and no poll comes first; the
/// listeners connected before, so no connection wakes anyone.
#[actix_rt::test]
async fn a_name_contended_lately_is_waited_for_in_line_from_the_first_attempt() {
    let (setup, admin) = Setup::new(Duration::from_secs(60), Duration::from_secs(20)).await;
    let (a, b) = (setup.manager("a"), setup.manager("b"));
    // Connected first: a connection's wake-up would be one more attempt.
    super::listening(&a).await;
    super::listening(&b).await;
    let in_line = format!(
        "SELECT count(*) FROM \"{}_wq\" WHERE name = 'job' AND waiter = $1",
        setup.table
    );
    // `waiter` waits for the lease `holder` holds; the attempts it took to get it.
    let handed = |holder: Lease, waiter: actix::Addr<LockManager>, owner: &'static str| {
        let (admin, in_line) = (&admin, &in_line);
        async move {
            let before = waiter
                .send(GetStats::new())
                .await
                .unwrap()
                .acquire_statements;
            let waiting =
                tokio::spawn(waiter.send(Acquire::new("job").timeout(Duration::from_secs(20))));
            let placed = Instant::now();
            while admin
                .query_one(in_line, &[&owner])
                .await
                .unwrap()
                .get::<_, i64>(0)
                == 0
            {
                assert!(placed.elapsed() < Duration::from_secs(20), "never in line");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            holder.release().await.unwrap();
            let lease = waiting.await.unwrap().unwrap().unwrap();
            let after = waiter
                .send(GetStats::new())
                .await
                .unwrap()
                .acquire_statements;
            (lease, after - before)
        }
    };
    let first = a.send(Acquire::new("job")).await.unwrap().unwrap();
    let (second, b_first) = handed(first, b.clone(), "b").await;
    let (third, a_first) = handed(second, a.clone(), "a").await;
    let (fourth, b_again) = handed(third, b.clone(), "b").await;
    assert_eq!((b_first, a_first, b_again), (3, 3, 2));
    fourth.release().await.unwrap();
}
