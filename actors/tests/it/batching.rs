//! Group commit: a burst of acquires or releases from one manager shares statements, each caller
//! still gets its own answer; callers in a closed loop move in batches. Failing connections are
//! in `batch_faults`.

use std::time::{Duration, Instant};

use pgcoord_actors::*;

use super::Setup;

/// A burst of acquires from one manager goes to the server in a few statements (group commit),
/// and each caller still gets its own lease, token and data; names another process holds are
/// not granted by the batch but waited for as before.
#[actix_rt::test]
async fn a_burst_of_acquires_is_batched_and_each_caller_gets_its_own_lease() {
    let (setup, admin) = Setup::new(Duration::from_secs(20), Duration::from_secs(5)).await;
    let other = setup.manager("other");
    let taken = other.call(Acquire::new("burst-7")).await.unwrap();
    let taken_token = taken.token();
    let manager = setup.manager("burst");
    let before = manager.send(GetStats::new()).await.unwrap();
    let requests: Vec<_> = (0..2_000)
        .map(|i| manager.send(Acquire::new(format!("burst-{i}")).data(format!("d{i}"))))
        .collect();
    // The name the other manager holds is released a moment later: its caller waits, then gets it.
    let release = async {
        tokio::time::sleep(Duration::from_millis(200)).await;
        taken.release().await.unwrap();
    };
    let (results, ()) =
        futures_util::future::join(futures_util::future::join_all(requests), release).await;
    let leases: Vec<Lease> = results.into_iter().map(|r| r.unwrap().unwrap()).collect();
    let stats = manager.send(GetStats::new()).await.unwrap();
    let statements = stats.acquire_statements - before.acquire_statements;
    assert!(
        statements < 100,
        "{statements} statements for 2,000 acquires"
    );
    let mut tokens: Vec<i64> = leases.iter().map(|l| l.token()).collect();
    tokens.sort();
    tokens.dedup();
    assert_eq!(tokens.len(), 2_000, "a token per lease");
    for (i, lease) in leases.iter().enumerate() {
        assert_eq!(lease.name(), format!("burst-{i}"));
        assert_eq!(lease.data(), Some(format!("d{i}").as_bytes()));
    }
    let sql = format!(
        "SELECT count(*) FROM {} WHERE owner = 'burst' AND name LIKE 'burst-%'",
        setup.quoted_table()
    );
    let owned: i64 = admin.query_one(&sql, &[]).await.unwrap().get(0);
    assert_eq!(owned, 2_000);
    assert!(
        leases[7].token() > taken_token,
        "burst-7 granted after the other's tenure"
    );
}

/// A burst of releases goes out in a few statements, each caller still learns its own outcome: a
/// lease taken over meanwhile is reported lost (to its caller and to loss subscribers), a row a
/// fencing guard holds is released once the guard ends, a waiter elsewhere gets its lease.
#[actix_rt::test]
async fn a_burst_of_releases_is_batched_and_each_caller_learns_its_own_outcome() {
    let (setup, admin) = Setup::new(Duration::from_secs(20), Duration::from_secs(5)).await;
    let manager = setup.manager("burst");
    let losses = super::Collector::subscribe(&manager).await;
    let requests: Vec<_> = (0..1_000)
        .map(|i| manager.send(Acquire::new(format!("r-{i}"))))
        .collect();
    let mut leases: Vec<Lease> = futures_util::future::join_all(requests)
        .await
        .into_iter()
        .map(|r| r.unwrap().unwrap())
        .collect();
    // r-1 is taken over on the server (another token); r-2 is under a fencing guard; r-3 has a
    // waiter in another manager.
    let table = setup.quoted_table();
    admin
        .execute(
            &format!("UPDATE {table} SET token = token + 1000000 WHERE name = 'r-1'"),
            &[],
        )
        .await
        .unwrap();
    let mut guard = pgcoord::db::connect_spawned(&setup.builder("guard").build().unwrap())
        .await
        .unwrap();
    let fenced = guard.transaction().await.unwrap();
    leases[2].fence(&fenced).await.unwrap();
    let other = setup.manager("other");
    let waiter = other.send(Acquire::new("r-3").timeout(Duration::from_secs(10)));
    let waiting = actix_rt::spawn(waiter);
    tokio::time::sleep(Duration::from_millis(200)).await;

    let before = manager.send(GetStats::new()).await.unwrap();
    let fenced_lease = leases.remove(2);
    let fenced_release = actix_rt::spawn(fenced_lease.release());
    let results = futures_util::future::join_all(leases.into_iter().map(|l| l.release())).await;
    let stats = manager.send(GetStats::new()).await.unwrap();
    let statements = stats.release_statements - before.release_statements;
    // Batched, and no statement carries more than `MAX_NAMES_PER_STATEMENT` names (the join of
    // a larger one grows with the square of its names).
    let fewest = 999_usize.div_ceil(pgcoord::lease::MAX_NAMES_PER_STATEMENT);
    assert!(
        (fewest as u64..100).contains(&statements),
        "{statements} statements for 1,000 releases"
    );
    for (i, result) in results.iter().enumerate() {
        let name = if i < 2 { i } else { i + 1 };
        if name == 1 {
            assert_eq!(
                result.as_ref().unwrap_err().kind(),
                pgcoord::ErrorKind::LockLost
            );
        } else {
            assert!(result.is_ok(), "r-{name}: {result:?}");
        }
    }
    let lost = losses.wait_for(1, Duration::from_secs(5)).await;
    assert_eq!(lost[0].key, LockKey::Lease("r-1".into()));
    assert_eq!(lost[0].reason, LossReason::TakenOver);
    // The waiter elsewhere was woken by the batch's announcement.
    let granted = waiting.await.unwrap().unwrap().unwrap();
    assert_eq!(granted.name(), "r-3");
    // The guarded row waits for its guard, then goes.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!fenced_release.is_finished(), "waits for the guard");
    fenced.commit().await.unwrap();
    fenced_release.await.unwrap().unwrap();
    let left: i64 = admin
        .query_one(
            &format!("SELECT count(*) FROM {table} WHERE owner = 'burst'"),
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        left, 1,
        "only the lease taken over (now someone else's) is left"
    );
}

/// A manager stopping with thousands of leases lets them go in a few statements, and tells
/// every holder.
#[actix_rt::test]
async fn a_manager_stopping_with_thousands_of_leases_releases_them_in_a_few_statements() {
    // A cluster of its own: the count of commits below is the whole cluster's.
    let (_server, setup, admin) = super::own_cluster::own_cluster().await;
    let manager = setup.manager("stopping");
    let requests: Vec<_> = (0..2_000)
        .map(|i| manager.send(Acquire::new(format!("s-{i}"))))
        .collect();
    let leases: Vec<Lease> = futures_util::future::join_all(requests)
        .await
        .into_iter()
        .map(|r| r.unwrap().unwrap())
        .collect();
    let commits = "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()";
    let commits_before: i64 = admin.query_one(commits, &[]).await.unwrap().get(0);
    manager.send(Shutdown).await.unwrap();
    let count = format!(
        "SELECT count(*) FROM {} WHERE owner = 'stopping'",
        setup.quoted_table()
    );
    let started = Instant::now();
    while admin.query_one(&count, &[]).await.unwrap().get::<_, i64>(0) > 0 {
        assert!(started.elapsed() < Duration::from_secs(10), "rows left");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Statistics lag: read them after a pause. Every session of the cluster counts (the
    // admin's polling above, renewals), so the bound is loose; one statement per lease would be
    // 2,000.
    tokio::time::sleep(Duration::from_millis(700)).await;
    let commits_after: i64 = admin.query_one(commits, &[]).await.unwrap().get(0);
    assert!(
        commits_after - commits_before < 300,
        "{} transactions for 2,000 releases",
        commits_after - commits_before
    );
    for lease in &leases {
        assert_eq!(lease.loss(), Some(LossReason::Shutdown));
    }
}

/// A burst of publishes from one listener goes out in a few NOTIFY statements, and every message
/// arrives once; stored (large) and inline messages mix.
#[actix_rt::test]
async fn a_burst_of_publishes_is_batched_and_every_message_arrives_once() {
    let (setup, _admin) = super::signals::setup().await;
    let (publisher, receiver) = (
        super::signals::listener(&setup),
        super::signals::listener(&setup),
    );
    let channel = pgcoord_testkit::unique_name("burst");
    let received = super::signals::subscribe(&receiver, &channel).await;
    let before = publisher.send(GetStats::new()).await.unwrap();
    let publishes = (0..1_000u32).map(|i| {
        // Every 100th is larger than the inline limit and goes through the store.
        let size = if i % 100 == 0 { 10_000 } else { 4 };
        let mut payload = vec![0u8; size];
        payload[..4].copy_from_slice(&i.to_be_bytes());
        publisher.send(Publish::new(&channel, payload))
    });
    for result in futures_util::future::join_all(publishes).await {
        result.unwrap().unwrap();
    }
    let stats = publisher.send(GetStats::new()).await.unwrap();
    let statements = stats.notify_statements - before.notify_statements;
    assert!(
        statements < 100,
        "{statements} statements for 1,000 publishes"
    );
    let messages = received.wait_for(1_000, Duration::from_secs(10)).await;
    let mut seen: Vec<u32> = messages
        .iter()
        .map(|m| u32::from_be_bytes(m.payload[..4].try_into().unwrap()))
        .collect();
    seen.sort();
    assert_eq!(seen, (0..1_000).collect::<Vec<_>>(), "each message once");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(received.received().len(), 1_000, "no duplicates");
}

/// Callers in a closed loop (acquire, release, again) are woken together by the answer to one
/// batch, and queue together for the next: eight of them move in batches, not in single
/// statements. When a request went alone whenever nothing else was under way, eight such callers
/// sent 0.45 acquire statements per acquisition; in batches of eight it is 0.125.
#[actix_rt::test]
async fn callers_in_a_closed_loop_move_in_batches() {
    let (setup, _admin) = Setup::new(Duration::from_secs(20), Duration::from_secs(5)).await;
    let manager = setup.manager("loop");
    let before = manager.send(GetStats::new()).await.unwrap();
    let (callers, rounds) = (8, 50);
    let loops = (0..callers).map(|c| {
        let manager = manager.clone();
        async move {
            for i in 0..rounds {
                let lease = manager
                    .send(Acquire::new(format!("loop-{c}-{i}")))
                    .await
                    .unwrap()
                    .unwrap();
                lease.release().await.unwrap();
            }
        }
    });
    futures_util::future::join_all(loops).await;
    let stats = manager.send(GetStats::new()).await.unwrap();
    let per_acquisition =
        (stats.acquire_statements - before.acquire_statements) as f64 / f64::from(callers * rounds);
    let releases =
        (stats.release_statements - before.release_statements) as f64 / f64::from(callers * rounds);
    assert!(
        per_acquisition <= 0.25 && releases <= 0.25,
        "acquire statements per acquisition {per_acquisition:.3}, release statements per release {releases:.3}"
    );
}
