//! What only the in-memory backend promises, beyond the suite both backends pass
//! (`backends.rs`): strict arrival order, and a fencing guard that checks the token.

use std::time::Duration;

use pgcoord::ErrorKind;
use pgcoord_actors::backend::memory::MemoryBackend;
use pgcoord_actors::*;
use pgcoord_testkit::unique_name;

use super::Collector;

/// Which waiter was served, in the order they were.
#[derive(Debug, Clone, actix::Message)]
#[rtype(result = "()")]
struct Served(u8);

/// In memory, waiters are served in strict arrival order (on PostgreSQL fairness is measured,
/// not strict: see the README's known limits).
#[actix_rt::test]
async fn in_memory_waiters_are_served_in_arrival_order() {
    let backend = MemoryBackend::new();
    let holder = backend.coordinator("holder");
    let name = unique_name("fifo");
    let mut lease = holder.acquire(Acquire::new(&name)).await.unwrap();
    let (order, recipient) = Collector::<Served>::start_new();
    let mut waiters = Vec::new();
    for i in 0..5u8 {
        let (process, name, recipient) = (
            backend.coordinator(format!("w{i}")),
            name.clone(),
            recipient.clone(),
        );
        waiters.push(actix_rt::spawn(async move {
            let lease = process.acquire(Acquire::new(&name)).await.unwrap();
            recipient.do_send(Served(i));
            tokio::time::sleep(Duration::from_millis(10)).await;
            lease.release().await.unwrap();
        }));
        // Each is queued before the next arrives.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    lease.release().await.unwrap();
    for waiter in waiters {
        waiter.await.unwrap();
    }
    let served: Vec<u8> = order.received().iter().map(|s| s.0).collect();
    assert_eq!(served, vec![0, 1, 2, 3, 4]);
    lease = holder
        .acquire(Acquire::new(&name).fail_if_locked())
        .await
        .unwrap();
    lease.release().await.unwrap();
}

/// In memory as on PostgreSQL, a waiter with a higher priority is served first, whenever it
/// came; equals in arrival order.
#[actix_rt::test]
async fn in_memory_a_higher_priority_is_served_first() {
    let backend = MemoryBackend::new();
    let holder = backend.coordinator("holder");
    let name = unique_name("priority");
    let lease = holder.acquire(Acquire::new(&name)).await.unwrap();
    let (order, recipient) = Collector::<Served>::start_new();
    let mut waiters = Vec::new();
    for (i, priority) in [(0u8, 0), (1, 0), (2, 5)] {
        let (process, name, recipient) = (
            backend.coordinator(format!("w{i}")),
            name.clone(),
            recipient.clone(),
        );
        waiters.push(actix_rt::spawn(async move {
            let acquire = Acquire::new(&name).priority(priority);
            let lease = process.acquire(acquire).await.unwrap();
            recipient.do_send(Served(i));
            tokio::time::sleep(Duration::from_millis(10)).await;
            lease.release().await.unwrap();
        }));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    lease.release().await.unwrap();
    for waiter in waiters {
        waiter.await.unwrap();
    }
    let served: Vec<u8> = order.received().iter().map(|s| s.0).collect();
    assert_eq!(served, vec![2, 0, 1]);
}

/// In memory, the fencing guard checks the token (there is no transaction to guard).
#[actix_rt::test]
async fn in_memory_the_fencing_guard_checks_the_token() {
    let backend = MemoryBackend::new();
    let process = backend.coordinator("a");
    let lease = process.acquire(Acquire::new("fenced")).await.unwrap();
    lease.fence(&backend).await.unwrap();
    assert!(backend.force_loss("fenced"));
    let e = lease.fence(&backend).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::LockLost);
}

/// In memory, `Delivery::ack` takes the backend itself: it checks the lease's token, moves the
/// cursor forward once, and is refused for an event acked already or after the lease was lost.
#[actix_rt::test]
async fn in_memory_a_delivery_ack_is_fenced_and_forward_only() {
    let backend = MemoryBackend::new();
    let process = backend.coordinator("p");
    let topic = unique_name("topic");
    for i in 0..3u8 {
        process.append(&topic, &[i]).await.unwrap();
    }
    let (tx, mut outcomes) = tokio::sync::mpsc::unbounded_channel();
    let database = backend.clone();
    let consuming = process
        .consume(Consume::new(&topic, "c", move |delivery: Delivery| {
            let (tx, database) = (tx.clone(), database.clone());
            async move {
                let first = delivery.ack(&database).await.map_err(|e| e.kind());
                let second = delivery.ack(&database).await.map_err(|e| e.kind());
                let _ = tx.send((delivery.event().body[0], first, second, delivery));
                Ok(())
            }
        }))
        .unwrap();
    let mut kept = Vec::new();
    for i in 0..3u8 {
        let (body, first, second, delivery) = outcomes.recv().await.unwrap();
        assert_eq!(
            (body, first, second),
            (i, Ok(()), Err(ErrorKind::AlreadyAcknowledged))
        );
        kept.push(delivery);
    }
    let stats = consuming.stats().await.unwrap();
    assert_eq!((stats.delivered, stats.handler_errors), (3, 0));
    // Once the lease is lost, a late ack of an event handed over under it is refused.
    assert!(backend.force_loss(&format!("{topic}/consumers/c")));
    let err = kept[2].ack(&backend).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::LockLost);
    consuming.stop().await;
}

/// In memory, rate limiters made on one backend take from the same buckets, as a fleet's do
/// from one table: the burst, then the rate, for all of them together.
#[actix_rt::test]
async fn in_memory_rate_limiters_share_the_backends_buckets() {
    use pgcoord::rate::RateLimit;
    use std::time::Instant;
    let backend = MemoryBackend::new();
    let rate = RateLimit::per_second(50).unwrap().burst(5).unwrap();
    let (one, two) = (
        backend.coordinator("one").rate_limiter(rate),
        backend.coordinator("two").rate_limiter(rate),
    );
    assert_eq!(one.try_take("hot", 3).await.unwrap().granted, 3);
    assert_eq!(two.try_take("hot", 2).await.unwrap().granted, 2);
    let refused = one.try_take("hot", 1).await.unwrap();
    assert_eq!(refused.granted, 0);
    assert!(
        refused.retry_after <= Duration::from_millis(20),
        "{refused:?}"
    );
    // Another backend's buckets are its own.
    let other = MemoryBackend::new().coordinator("other").rate_limiter(rate);
    assert_eq!(other.try_take("hot", 5).await.unwrap().granted, 5);

    // Waiting takes from both limiters: 40 more at 50/s take about 0.8 s, not less.
    let started = Instant::now();
    let mut takers = Vec::new();
    for limiter in [one.clone(), two.clone()] {
        takers.push(tokio::spawn(async move {
            for _ in 0..20 {
                limiter
                    .take("hot", 1, Duration::from_secs(5))
                    .await
                    .unwrap();
            }
        }));
    }
    for taker in takers {
        taker.await.unwrap();
    }
    let took = started.elapsed();
    assert!(took >= Duration::from_millis(760), "{took:?}");
    assert!(took < Duration::from_secs(3), "{took:?}");
    let err = one.try_take("hot", 6).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidConfig);
    let err = one.try_take("", 1).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidName);
}

/// In memory, what needs the actors answers `Unsupported`, naming what needed them, and nothing
/// starts: their addresses, elections, schedules, task pools, retention, a graceful shutdown.
#[actix_rt::test]
async fn in_memory_what_needs_the_actors_is_unsupported() {
    let coordinator = MemoryBackend::new().coordinator("p");
    let unsupported = |e: pgcoord::Error, what: &str| {
        assert_eq!(e.kind(), ErrorKind::Unsupported, "{e}");
        assert!(e.to_string().contains(what), "{e}");
    };
    unsupported(coordinator.locks().unwrap_err(), "lock manager");
    unsupported(coordinator.signals().unwrap_err(), "listener");
    unsupported(coordinator.advisory().unwrap_err(), "advisory");
    unsupported(coordinator.config().unwrap_err(), "configuration");
    unsupported(coordinator.election("e").unwrap_err(), "elections");
    let every = pgcoord::schedule::Timing::every(Duration::from_secs(1)).unwrap();
    let schedule = Schedule::new("s", every, |_| async { Ok(()) });
    unsupported(coordinator.schedule(schedule).unwrap_err(), "schedules");
    let pool = TaskPool::new("p", vec!["k".into()], |_| async {});
    unsupported(coordinator.run_tasks(pool).unwrap_err(), "task pools");
    let shutdown = coordinator.shutdown(Duration::from_secs(1)).await;
    unsupported(shutdown.unwrap_err(), "shutdown");
    // What both backends answer still does.
    let lease = coordinator.acquire(Acquire::new("job")).await.unwrap();
    assert_eq!(
        coordinator.get("job").await.unwrap().token,
        Some(lease.token())
    );
    assert_eq!(coordinator.owner(), "p");
    assert!(coordinator.health(Duration::from_secs(1)).await.is_ready());
}
