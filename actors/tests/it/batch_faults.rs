//! Group commit when connections fail: a batch whose connection is black-holed is cut off at
//! the statement deadline, every caller is answered in time, and nothing is left behind.

use std::time::{Duration, Instant};

use actix::prelude::*;
use pgcoord_actors::*;
use pgcoord_testkit::Proxy;

use super::own_cluster::own_cluster;

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
    let channel = pgcoord_testkit::unique_name("cut");
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
    // What the pool sent on fresh connections meanwhile (answered Ok) reached the server, and
    // so does the last burst. (A publish answered with an error may have reached it too: its
    // outcome is unknown, so it is not counted either way.)
    let ids = || -> std::collections::HashSet<u32> {
        (received.received().iter())
            .map(|m| u32::from_be_bytes(m.payload[..4].try_into().unwrap()))
            .collect()
    };
    pgcoord_testkit::eventually(
        Duration::from_secs(5),
        "the last burst delivered",
        async || {
            let ids = ids();
            (2_000..2_050).all(|i| ids.contains(&i))
        },
    )
    .await;
    let ids = ids();
    let passed = (1_000..1_050u32).zip(&results);
    for (i, _) in passed.filter(|(_, r)| matches!(r, Ok(Ok(())))) {
        assert!(ids.contains(&i), "{i} was answered Ok, so it was delivered");
    }
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
    let (manager, table) = super::manager_on_pool(config);
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
    let warm = (0..4).map(|_| table.list_prefix(""));
    futures_util::future::join_all(warm).await;
    proxy.cut();
    let started = Instant::now();
    let names = (0..10).map(|i| format!("claim-{i}")).collect();
    let claimed = manager.send(Claim::new(names)).await.unwrap();
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
