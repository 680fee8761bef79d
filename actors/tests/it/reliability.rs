//! Fault scenarios of docs/RELIABILITY.md that need no holder process: connections reset or
//! closed under held locks (scenario 5), a frozen advisory backend (7), a responder that dies
//! or answers late (13), a slow subscriber under 10,000 notifications (14). The others are in
//! the `pgcoord-faults` crate and beside the features they exercise.

use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use pgcoord::ErrorKind;
use pgcoord_actors::Ask;
use pgcoord_actors::*;
use pgcoord_testkit::{Proxy, TempPostgres, unique_name};

use super::signals::{listener, setup, subscribe};
use super::{Collector, Setup, Slow};

const FAST: Duration = Duration::from_millis(200);

async fn reset_or_close_while_holding(close: bool) {
    let (setup, admin) = Setup::new(Duration::from_secs(2), Duration::from_millis(400)).await;
    let proxy = Proxy::start(&setup.pg).await.unwrap();
    let config = setup
        .builder("holder")
        .pg_config(&proxy.pg_config(&setup.pg))
        .ping_interval(FAST)
        .ping_timeout(FAST)
        .build()
        .unwrap();
    let holder = LockManager::new(config.clone()).start();
    let advisory = AdvisoryLocks::new(config).start();
    let (lost, recipient) = Collector::<LockLost>::start_new();
    holder
        .send(SubscribeLockLost(recipient.clone()))
        .await
        .unwrap();
    advisory.send(SubscribeLockLost(recipient)).await.unwrap();
    let lease = holder.send(Acquire::new("job")).await.unwrap().unwrap();
    let key = pgcoord::advisory::key_for_name(&setup.table);
    let guard = advisory
        .send(AdvisoryLock::new(key))
        .await
        .unwrap()
        .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;

    let cut = Instant::now();
    if close {
        proxy.close();
    } else {
        proxy.reset();
    }
    // The advisory lock's session ended, so the server released the lock: reported at once.
    let reported = lost.wait_for(1, Duration::from_secs(2)).await;
    assert_eq!(reported[0].key, LockKey::Advisory(key));
    assert_eq!(reported[0].reason, LossReason::ConnectionLost);
    assert_eq!(guard.loss(), Some(LossReason::ConnectionLost));
    assert!(
        cut.elapsed() < Duration::from_secs(1),
        "{:?}",
        cut.elapsed()
    );
    let other = AdvisoryLocks::new(setup.builder("other").build().unwrap()).start();
    let _taken = other.send(AdvisoryLock::new(key)).await.unwrap().unwrap();

    // The lease is not tied to a session: the heartbeat reconnects and keeps it.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(lost.received().len(), 1, "{:?}", lost.received());
    assert_eq!(lease.loss(), None);
    let info = setup.table().get("job").await.unwrap();
    assert!(
        info.remaining.unwrap() > Duration::from_secs(1),
        "renewed: {info:?}"
    );
    drop(admin);
}

#[actix_rt::test]
async fn a_reset_connection_loses_advisory_locks_and_keeps_leases() {
    reset_or_close_while_holding(false).await;
}

#[actix_rt::test]
async fn a_closed_connection_loses_advisory_locks_and_keeps_leases() {
    reset_or_close_while_holding(true).await;
}

#[actix_rt::test]
async fn a_frozen_advisory_backend_is_reported_and_its_lock_stays_out_of_reach() {
    let server = Arc::new(
        tokio::task::spawn_blocking(TempPostgres::start)
            .await
            .unwrap()
            .unwrap(),
    );
    let config = |owner: &str| {
        pgcoord::Config::builder()
            .pg_config(&server.pg_config())
            .owner(owner)
            .ping_interval(FAST)
            .ping_timeout(FAST)
            .build()
            .unwrap()
    };
    let admin = pgcoord::db::connect_spawned(&config("admin"))
        .await
        .unwrap();
    pgcoord::schema::migrate(&admin, &config("admin"))
        .await
        .unwrap();
    let holder = AdvisoryLocks::new(config("holder")).start();
    let (lost, recipient) = Collector::<LockLost>::start_new();
    holder.send(SubscribeLockLost(recipient)).await.unwrap();
    let _guard3 = holder.send(AdvisoryLock::new(7)).await.unwrap().unwrap();
    let pid: i32 = admin
        .query_one(
            "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND objid = 7 AND granted",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    server.freeze_backend(pid as u32).unwrap();
    let frozen = Instant::now();
    let reported = lost.wait_for(1, Duration::from_secs(3)).await;
    assert_eq!(reported[0].reason, LossReason::Stalled);
    assert!(frozen.elapsed() < FAST * 3, "{:?}", frozen.elapsed());

    // The server still holds the lock for the frozen session: nobody else gets it...
    let other = AdvisoryLocks::new(config("other")).start();
    let err = other.send(AdvisoryLock::new(7)).await.unwrap().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotAcquired);
    // ...until the session ends (its client closed it when it gave the lock up).
    server.thaw_backend(pid as u32).unwrap();
    let _guard4 = other
        .send(AdvisoryLock::new(7).timeout(Duration::from_secs(5)))
        .await
        .unwrap()
        .unwrap();
}

#[actix_rt::test]
async fn a_late_reply_is_dropped_and_a_dead_responder_ends_in_the_callers_deadline() {
    let (setup, _) = setup().await;
    let client = listener(&setup);
    let (slow, dying) = (unique_name("slow"), unique_name("dying"));

    // A responder that answers after the caller's deadline.
    let responder = listener(&setup);
    responder
        .send(Serve::new(&slow, |payload: Vec<u8>| async move {
            tokio::time::sleep(Duration::from_millis(500)).await;
            Ok(payload)
        }))
        .await
        .unwrap()
        .unwrap();
    let started = Instant::now();
    let err = client
        .send(Ask::new(&slow, b"x".to_vec()).timeout(FAST))
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Timeout);
    assert!(started.elapsed() < FAST * 2);
    // The late reply arrives (the handler's time and two hops later) and matches nothing.
    pgcoord_testkit::eventually(Duration::from_secs(10), "the late reply", async || {
        client
            .send(GetStats::new())
            .await
            .unwrap()
            .unmatched_replies
            == 1
    })
    .await;
    let stats = client.send(GetStats::new()).await.unwrap();
    assert_eq!((stats.unmatched_replies, stats.pending_requests), (1, 0));

    // A responder whose process dies mid-handler: its own System, stopped while it works.
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let (setup2, channel) = (setup.clone(), dying.clone());
    let responder = std::thread::spawn(move || {
        let system = actix::System::new();
        system.block_on(async move {
            let listener = super::signals::listener(&setup2);
            listener
                .send(Serve::new(&channel, |_| async move {
                    // Stops the whole System, as a crash would, before answering.
                    actix::System::current().stop();
                    std::future::pending::<()>().await;
                    Ok(Vec::new())
                }))
                .await
                .unwrap()
                .unwrap();
            ready_tx.send(()).unwrap();
        });
        system.run().unwrap();
    });
    ready_rx.recv().unwrap();
    let started = Instant::now();
    let err = client
        .send(Ask::new(&dying, b"x".to_vec()).timeout(Duration::from_secs(1)))
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Timeout);
    assert!(started.elapsed() >= Duration::from_secs(1));
    responder.join().unwrap();
    assert_eq!(
        client.send(GetStats::new()).await.unwrap().pending_requests,
        0
    );
}

#[actix_rt::test]
async fn ten_thousand_notifications_and_a_slow_subscriber() {
    let (setup, admin) = setup().await;
    let listener = listener(&setup);
    let channel = unique_name("burst");
    let slow = Slow::start_in_arbiter(&Arbiter::new().handle(), |_| Slow(Duration::from_millis(1)));
    listener
        .send(Subscribe::new(channel.clone(), slow.recipient()))
        .await
        .unwrap()
        .unwrap();
    let fast = subscribe(&listener, &channel).await;
    let (states, recipient) = Collector::<ConnState>::start_new();
    listener.send(SubscribeConnState(recipient)).await.unwrap();
    burst(&admin, &channel, 10_000).await;
    let received = fast.wait_for(10_000, Duration::from_secs(30)).await;
    let order: Vec<u32> = received
        .iter()
        .map(|s| u32::from_be_bytes(s.payload[..4].try_into().unwrap()))
        .collect();
    assert_eq!(
        order,
        (0..10_000).collect::<Vec<_>>(),
        "in order, none lost"
    );
    let stats = listener.send(GetStats::new()).await.unwrap();
    assert!(stats.overflowed > 0, "the slow one's overflow is counted");
    assert_eq!(stats.delivered + stats.overflowed, 20_000, "{stats:?}");
    // And announced, never a silent loss: the channel's subscribers are told to resync.
    let lost =
        |s: &ConnState| matches!(s, ConnState::MessageLost { channel: c, .. } if *c == channel);
    let deadline = Instant::now() + Duration::from_secs(5);
    while !states.received().iter().any(lost) {
        assert!(
            Instant::now() < deadline,
            "no loss announced: {:?}",
            states.received()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A listener busy reading a burst answers its ping only after the notifications queued before
/// the ping's answer: with a ping timeout (50 ms) far shorter than reading 50,000 notifications
/// takes, the connection must still not be declared stalled — what it reads proves it alive —
/// and so no notification is thrown away with it.
#[actix_rt::test]
async fn a_listener_busy_with_a_burst_is_not_stalled_and_loses_nothing() {
    let (setup, admin) = setup().await;
    let config = (setup.builder("busy"))
        .ping_interval(Duration::from_millis(20))
        .ping_timeout(Duration::from_millis(50))
        .build()
        .unwrap();
    let listener = ListenerActor::new(config, None).start_supervised();
    let channel = unique_name("burst");
    let fast = subscribe(&listener, &channel).await;
    burst(&admin, &channel, 50_000).await;
    let received = fast.wait_for(50_000, Duration::from_secs(60)).await;
    let order: Vec<u32> = received
        .iter()
        .map(|s| u32::from_be_bytes(s.payload[..4].try_into().unwrap()))
        .collect();
    assert!(
        order == (0..50_000).collect::<Vec<_>>(),
        "{} of 50,000 received, in order: {}",
        order.len(),
        order.windows(2).all(|w| w[0] < w[1])
    );
}

/// `n` envelopes (their bodies 0, 1, …, big-endian) notified on `channel` by one statement, as a
/// burst from elsewhere looks.
async fn burst(admin: &tokio_postgres::Client, channel: &str, n: u32) {
    let texts: Vec<String> = (0..n)
        .map(|i| {
            pgcoord::signal::Envelope::new(pgcoord::signal::Kind::Event, i.to_be_bytes().to_vec())
                .encode()
                .unwrap()
        })
        .collect();
    admin
        .execute(
            "SELECT count(pg_notify($1, t)) FROM unnest($2::text[]) WITH ORDINALITY AS m(t, n)",
            &[&channel, &texts],
        )
        .await
        .unwrap();
}

/// The tokio door's subscription under a burst: every message of 10,000 notified by one
/// statement arrives, in order — the stream's forwarder is not a subscriber whose mailbox fills
/// and drops what it is sent.
#[actix_rt::test]
async fn a_subscription_stream_loses_nothing_of_a_burst() {
    let (setup, admin) = setup().await;
    let coordinator = Coordinator::connect(setup.builder("stream").build().unwrap())
        .await
        .unwrap();
    let channel = unique_name("burst");
    let mut subscription = coordinator.subscribe(&channel).await.unwrap();
    burst(&admin, &channel, 10_000).await;
    // A reader that is slow to start: the burst waits for it, none of it is dropped.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut order = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while order.len() < 10_000 {
        match tokio::time::timeout_at(deadline, subscription.next()).await {
            Ok(Some(Heard::Signal(signal))) => {
                order.push(u32::from_be_bytes(signal.payload[..4].try_into().unwrap()))
            }
            Ok(other) => panic!("{other:?} after {} messages", order.len()),
            Err(_) => panic!("{} of 10,000 received", order.len()),
        }
    }
    assert_eq!(
        order,
        (0..10_000).collect::<Vec<_>>(),
        "in order, none lost"
    );
    let stats = coordinator
        .signals()
        .unwrap()
        .send(GetStats::new())
        .await
        .unwrap();
    assert_eq!(stats.overflowed, 0, "{stats:?}");
    coordinator.shutdown(Duration::from_secs(5)).await.unwrap();
}
