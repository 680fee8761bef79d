//! Group commit: a burst of acquires or releases from one manager shares statements, each caller
//! still gets its own answer, and a batch whose connection fails leaves nothing behind.

use std::time::{Duration, Instant};

use actix::prelude::*;
use pgcoord::embedded::Proxy;
use pgcoord_actors::*;

use super::Setup;
use super::connection_faults::own_cluster;

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

/// A burst whose batch goes to a black-holed pooled connection: the batch is cut off at the
/// statement timeout, its outcome unknown; every caller frees what it may have been granted and
/// asks again on a fresh connection, and gets its lease within its deadline, exactly once.
#[actix_rt::test]
async fn a_batch_on_a_black_holed_connection_is_retried_and_leaves_nothing_behind() {
    let (_server, setup, admin) = own_cluster().await;
    let proxy = Proxy::start(&setup.pg).await.unwrap();
    let config = setup
        .builder("burst")
        .pg_config(&proxy.pg_config(&setup.pg))
        .statement_timeout(Duration::from_millis(300))
        .pool_size(4)
        .build()
        .unwrap();
    let manager = LockManager::new(config).start();
    // Open the pool's connections, then black-hole them (new connections pass).
    let warm: Vec<_> = (0..8)
        .map(|i| manager.send(Acquire::new(format!("warm-{i}"))))
        .collect();
    for lease in futures_util::future::join_all(warm).await {
        lease.unwrap().unwrap().release().await.unwrap();
    }
    proxy.cut();
    let started = Instant::now();
    let requests: Vec<_> = (0..40)
        .map(|i| manager.send(Acquire::new(format!("cut-{i}")).timeout(Duration::from_secs(10))))
        .collect();
    let leases: Vec<Lease> = futures_util::future::join_all(requests)
        .await
        .into_iter()
        .map(|r| r.unwrap().unwrap())
        .collect();
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    let sql = format!(
        "SELECT name, token FROM {} WHERE owner = 'burst' AND name LIKE 'cut-%' ORDER BY token",
        setup.quoted_table()
    );
    let rows = admin.query(&sql, &[]).await.unwrap();
    assert_eq!(rows.len(), 40, "one row per caller, no orphan grant left");
    for lease in &leases {
        let on_server = rows
            .iter()
            .find(|r| r.get::<_, String>(0) == lease.name())
            .map(|r| r.get::<_, i64>(1));
        assert_eq!(on_server, Some(lease.token()), "{}", lease.name());
    }
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
    assert!(
        statements < 100,
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
    let (setup, admin) = Setup::new(Duration::from_secs(20), Duration::from_secs(5)).await;
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
    // Statistics lag: read them after a pause. Every session of the database counts, so the
    // bound is loose; one statement per lease would be 2,000.
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
    let channel = pgcoord::embedded::unique_name("burst");
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

/// A burst of publishes whose batch goes to a black-holed connection: each publisher gets an
/// error at the statement deadline (the outcome is unknown: at most once), none waits longer,
/// and the next burst, on fresh connections, is delivered.
#[actix_rt::test]
async fn a_publish_batch_on_a_black_holed_connection_fails_each_publisher_in_time() {
    let (setup, _admin) = super::signals::setup().await;
    let proxy = Proxy::start(&setup.pg).await.unwrap();
    let config = setup
        .builder("cut")
        .pg_config(&proxy.pg_config(&setup.pg))
        .statement_timeout(Duration::from_millis(300))
        .pool_size(2)
        .build()
        .unwrap();
    let publisher = ListenerActor::new(config, None).start_supervised();
    let receiver = super::signals::listener(&setup);
    let channel = pgcoord::embedded::unique_name("cut");
    let received = super::signals::subscribe(&receiver, &channel).await;
    let burst = |from: u32| {
        let publisher = publisher.clone();
        let channel = channel.clone();
        futures_util::future::join_all(
            (from..from + 50)
                .map(move |i| publisher.send(Publish::new(&channel, i.to_be_bytes().to_vec()))),
        )
    };
    // Open the pool's connections, then black-hole them (new connections pass).
    for result in burst(0).await {
        result.unwrap().unwrap();
    }
    received.wait_for(50, Duration::from_secs(5)).await;
    proxy.cut();
    let started = Instant::now();
    let results = burst(1_000).await;
    let elapsed = started.elapsed();
    assert!(elapsed < Duration::from_secs(3), "{elapsed:?}");
    let failed = results
        .iter()
        .filter(|r| matches!(r, Ok(Err(e)) if e.is_unavailable()))
        .count();
    assert!(
        failed > 0,
        "the black-holed batch is reported to its publishers"
    );
    assert!(
        results.iter().all(|r| matches!(r, Ok(Ok(())) | Ok(Err(_)))),
        "an answer for everyone"
    );
    // Fresh connections deliver the next burst.
    for result in burst(2_000).await {
        result.unwrap().unwrap();
    }
    // The black-holed burst never reached the server here; the first and the last did.
    let messages = received.wait_for(50 + 50, Duration::from_secs(5)).await;
    let ids: std::collections::HashSet<u32> = messages
        .iter()
        .map(|m| u32::from_be_bytes(m.payload[..4].try_into().unwrap()))
        .collect();
    assert!((2_000..2_050).all(|i| ids.contains(&i)));
}

/// Releases batched onto black-holed connections: every caller is answered — released, or
/// `Unavailable` at the statement deadline (a release that may have run is not repeated) —
/// and none waits longer. A claim on such connections is answered in time too.
#[actix_rt::test]
async fn releases_and_a_claim_on_black_holed_connections_are_answered_in_time() {
    let (_server, setup, admin) = own_cluster().await;
    let proxy = Proxy::start(&setup.pg).await.unwrap();
    let config = setup
        .builder("cut")
        .pg_config(&proxy.pg_config(&setup.pg))
        .statement_timeout(Duration::from_millis(300))
        .pool_size(4)
        .build()
        .unwrap();
    let manager = LockManager::new(config).start();
    let acquires = (0..40).map(|i| manager.send(Acquire::new(format!("r-{i}"))));
    let leases: Vec<Lease> = futures_util::future::join_all(acquires)
        .await
        .into_iter()
        .map(|r| r.unwrap().unwrap())
        .collect();
    proxy.cut();
    let started = Instant::now();
    let results = futures_util::future::join_all(leases.into_iter().map(|l| l.release())).await;
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    let failed = results
        .iter()
        .filter(|r| r.as_ref().is_err_and(|e| e.is_unavailable()))
        .count();
    assert!(failed > 0, "the black-holed releases are reported");
    assert!(
        results
            .iter()
            .all(|r| r.as_ref().is_ok() || r.as_ref().is_err_and(|e| e.is_unavailable())),
        "{results:?}"
    );
    // What a caller was told released is gone on the server.
    let held: i64 = admin
        .query_one(
            &format!(
                "SELECT count(*) FROM {} WHERE owner = 'cut'",
                setup.quoted_table()
            ),
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(
        held as usize <= failed,
        "{held} rows left, {failed} releases failed"
    );

    // A claim once the pool's connections are black-holed again: answered by its deadline —
    // `Unavailable`, or granted on a connection opened after the cut — never left waiting.
    let warm = (0..4).map(|_| manager.send(List));
    futures_util::future::join_all(warm).await;
    proxy.cut();
    let started = Instant::now();
    let names = (0..10).map(|i| format!("claim-{i}")).collect();
    let claimed = manager.send(Claim { names }).await.unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    assert!(
        claimed.as_ref().is_ok_and(|l| l.len() == 10)
            || claimed.as_ref().is_err_and(|e| e.is_unavailable()),
        "{claimed:?}"
    );
}
