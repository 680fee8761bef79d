//! Signals under faults: a terminated or black-holed listener connection, garbage on a channel,
//! a slow subscriber, a panicking handler.

use std::time::{Duration, Instant};

use actix::prelude::*;
use pgcoord::ErrorKind;
use pgcoord_actors::Ask;
use pgcoord_actors::*;
use pgcoord_testkit::{Proxy, unique_name};

use super::signals::{FAST, listener, listener_on, setup, subscribe};
use super::{Collector, Slow};

/// A started listener whose sessions carry an application name of their own, and that name.
fn named_listener(setup: &super::Setup) -> (Addr<ListenerActor>, String) {
    let app = unique_name("app");
    let builder = setup.builder("signals").application_name(&app);
    let listener = ListenerActor::new(builder.build().unwrap(), None).start_supervised();
    (listener, app)
}

/// Terminates the listener session of the application `app`; how many were.
async fn kill_listener(admin: &tokio_postgres::Client, app: &str) -> usize {
    let name = format!("{app} listener");
    pgcoord_testkit::terminate_backends(admin, &name)
        .await
        .unwrap()
}

async fn conn_states(listener: &Addr<ListenerActor>) -> Collector<ConnState> {
    let (collector, recipient) = Collector::start_new();
    listener.send(SubscribeConnState(recipient)).await.unwrap();
    collector
}

#[actix_rt::test]
async fn a_terminated_listener_reconnects_relistens_and_delivers_again() {
    let (setup, admin) = setup().await;
    let app = unique_name("app");
    let config = setup
        .builder("signals")
        .application_name(&app)
        .ping_interval(FAST)
        .ping_timeout(FAST)
        .build()
        .unwrap();
    let states_listener = ListenerActor::new(config, None).start_supervised();
    let states = conn_states(&states_listener).await;
    let (a, b) = (unique_name("a"), unique_name("b"));
    let (on_a, on_b) = (
        subscribe(&states_listener, &a).await,
        subscribe(&states_listener, &b).await,
    );
    assert_eq!(
        states.wait_for(1, Duration::from_secs(5)).await[0],
        ConnState::Connected
    );
    let before = states_listener
        .send(ListeningChannels)
        .await
        .unwrap()
        .unwrap();
    assert!(before.contains(&a) && before.contains(&b));

    assert_eq!(kill_listener(&admin, &app).await, 1);
    let seen = states.wait_for(3, Duration::from_secs(10)).await;
    // Carrying the server's own words, not a bare "db error" — or, when a ping written as the
    // server closed drew a reset (which discards the server's last message unread), the
    // operating system's.
    assert!(
        matches!(&seen[1], ConnState::Disconnected { error }
            if error.contains("terminating connection") || error.contains("os error")),
        "{seen:?}"
    );
    assert_eq!(seen[2], ConnState::Reconnected);
    let after = states_listener
        .send(ListeningChannels)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        after, before,
        "every channel listened on again, on the new session"
    );
    states_listener
        .send(Publish::new(&a, b"again".to_vec()))
        .await
        .unwrap()
        .unwrap();
    states_listener
        .send(Publish::new(&b, b"again".to_vec()))
        .await
        .unwrap()
        .unwrap();
    on_a.wait_for(1, Duration::from_secs(5)).await;
    on_b.wait_for(1, Duration::from_secs(5)).await;
}

#[actix_rt::test]
async fn a_black_holed_listener_is_stalled_then_reconnected() {
    let (setup, _) = setup().await;
    let proxy = Proxy::start(&setup.pg).await.unwrap();
    let listener = listener_on(&setup, &proxy.pg_config(&setup.pg), 4096);
    let states = conn_states(&listener).await;
    let channel = unique_name("holed");
    let collector = subscribe(&listener, &channel).await;
    states.wait_for(1, Duration::from_secs(5)).await;
    proxy.cut();
    let cut = Instant::now();
    let seen = states.wait_for(3, Duration::from_secs(10)).await;
    assert_eq!(seen[1], ConnState::Stalled, "{seen:?}");
    assert!(cut.elapsed() < Duration::from_secs(5));
    assert_eq!(seen[2], ConnState::Reconnected);
    listener
        .send(Publish::new(&channel, b"through".to_vec()))
        .await
        .unwrap()
        .unwrap();
    collector.wait_for(1, Duration::from_secs(5)).await;
}

#[actix_rt::test]
async fn garbage_is_skipped_and_the_next_message_delivered() {
    let (setup, admin) = setup().await;
    let listener = listener(&setup);
    let channel = unique_name("noisy");
    let collector = subscribe(&listener, &channel).await;
    for garbage in ["hello", "{\"v\":1}", "✓"] {
        admin
            .execute("SELECT pg_notify($1, $2)", &[&channel, &garbage])
            .await
            .unwrap();
    }
    listener
        .send(Publish::new(&channel, b"valid".to_vec()))
        .await
        .unwrap()
        .unwrap();
    let received = collector.wait_for(1, Duration::from_secs(5)).await;
    assert_eq!(received[0].payload[..], *b"valid");
    assert_eq!(listener.send(GetStats::new()).await.unwrap().garbage, 3);
}

#[actix_rt::test]
async fn a_slow_subscriber_does_not_hold_up_the_others() {
    let (setup, _) = setup().await;
    let listener = listener(&setup);
    let channel = unique_name("fanout");
    let slow = Slow::start_in_arbiter(&Arbiter::new().handle(), |_| {
        Slow(Duration::from_millis(50))
    });
    listener
        .send(Subscribe::new(channel.clone(), slow.recipient()))
        .await
        .unwrap()
        .unwrap();
    let fast = subscribe(&listener, &channel).await;
    let started = Instant::now();
    for i in 0..200u32 {
        listener
            .send(Publish::new(&channel, i.to_be_bytes().to_vec()))
            .await
            .unwrap()
            .unwrap();
    }
    let received = fast.wait_for(200, Duration::from_secs(10)).await;
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "not paced by the slow one"
    );
    let order: Vec<u32> = received
        .iter()
        .map(|s| u32::from_be_bytes(s.payload[..4].try_into().unwrap()))
        .collect();
    assert_eq!(order, (0..200).collect::<Vec<_>>(), "in order, none lost");
    assert!(
        listener.send(GetStats::new()).await.unwrap().overflowed > 0,
        "the slow one's overflow is counted"
    );
}

#[actix_rt::test]
async fn a_panicking_handler_gives_an_error_reply_and_serving_goes_on() {
    let (setup, _) = setup().await;
    let (server, client) = (listener(&setup), listener(&setup));
    let channel = unique_name("fragile");
    server
        .send(Serve::new(&channel, |p: Vec<u8>| async move {
            if p == b"boom" {
                panic!("handler exploded");
            }
            Ok(p)
        }))
        .await
        .unwrap()
        .unwrap();
    let err = client
        .send(Ask::new(&channel, b"boom".to_vec()))
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Remote);
    assert!(err.to_string().contains("panicked"));
    let ok = client
        .send(Ask::new(&channel, b"fine".to_vec()))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(ok, b"fine");
}

/// Answers after 300 ms, so requests are in flight when the listener's connection is killed.
fn slow_echo(channel: &str) -> Serve {
    Serve::new(channel, |payload: Vec<u8>| async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        Ok(payload)
    })
}

#[actix_rt::test]
async fn callers_in_flight_complete_across_a_killed_listener_connection() {
    let (setup, admin) = setup().await;
    let (listener, app) = named_listener(&setup);
    let states = conn_states(&listener).await;
    let (echo, quiet) = (unique_name("echo"), unique_name("quiet"));
    listener.send(slow_echo(&echo)).await.unwrap().unwrap();
    let requests: Vec<_> = (0..4u8)
        .map(|i| {
            let request = Ask::new(&echo, vec![i]).timeout(Duration::from_secs(3));
            tokio::spawn(listener.send(request))
        })
        .collect();
    // A subscription made before the kill is served by the next connection too.
    let (early, recipient) = Collector::<Signal>::start_new();
    let subscribed = listener.send(Subscribe::new(quiet.clone(), recipient));
    subscribed.await.unwrap().unwrap();

    assert_eq!(kill_listener(&admin, &app).await, 1);
    // Subscribing while the connection is down is accepted and served by the next one.
    let (late, recipient) = Collector::<Signal>::start_new();
    let subscribed = listener.send(Subscribe::new(quiet.clone(), recipient));
    subscribed.await.unwrap().unwrap();
    states.wait_for(3, Duration::from_secs(5)).await;
    assert_eq!(states.received().last(), Some(&ConnState::Reconnected));
    listener
        .send(Publish::new(&quiet, b"after".to_vec()))
        .await
        .unwrap()
        .unwrap();

    // Every caller ends with the reply or its own deadline: never a closed mailbox.
    for (i, request) in requests.into_iter().enumerate() {
        match request.await.unwrap().expect("no MailboxError") {
            Ok(reply) => assert_eq!(reply, vec![i as u8]),
            Err(e) => assert_eq!(e.kind(), ErrorKind::Timeout, "{e}"),
        }
    }
    assert_eq!(
        early.wait_for(1, Duration::from_secs(5)).await[0].payload[..],
        *b"after"
    );
    assert_eq!(
        late.wait_for(1, Duration::from_secs(5)).await[0].payload[..],
        *b"after"
    );
    assert_eq!(
        listener
            .send(GetStats::new())
            .await
            .unwrap()
            .pending_requests,
        0,
        "no pending entry leaks"
    );
}

#[actix_rt::test]
async fn a_garbage_flood_is_counted_and_served_traffic_goes_on() {
    let (log, _capture) = super::capture_warnings();
    let (setup, admin) = setup().await;
    let listener = listener(&setup);
    let channel = unique_name("flooded");
    let collector = subscribe(&listener, &channel).await;
    admin
        .execute(
            "SELECT count(pg_notify($1, 'garbage ' || i)) FROM generate_series(1, 2000) AS i",
            &[&channel],
        )
        .await
        .unwrap();
    listener
        .send(Publish::new(&channel, b"valid".to_vec()))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        collector.wait_for(1, Duration::from_secs(10)).await[0].payload[..],
        *b"valid"
    );
    assert_eq!(listener.send(GetStats::new()).await.unwrap().garbage, 2000);
    // Warned about at the first and at every power of two: 11 lines for 2,000.
    assert_eq!(log.lines_containing("not pgcoord messages"), 11);
}

#[actix_rt::test]
async fn a_stored_payload_that_cannot_be_fetched_is_reported_to_the_application() {
    let (setup, admin) = setup().await;
    let listener = listener(&setup);
    let states = conn_states(&listener).await;
    let channel = unique_name("stored");
    let collector = subscribe(&listener, &channel).await;
    // An envelope whose payload is "in the store" under a key that has no row.
    let mut envelope = pgcoord::signal::Envelope::new(pgcoord::signal::Kind::Event, Vec::new());
    envelope.body = pgcoord::signal::Body::Stored("00000000-0000-0000-0000-000000000000".into());
    admin
        .execute(
            "SELECT pg_notify($1, $2)",
            &[&channel, &envelope.encode().unwrap()],
        )
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    let lost = loop {
        let lost = states
            .received()
            .into_iter()
            .find(|s| matches!(s, ConnState::MessageLost { .. }));
        if let Some(lost) = lost {
            break lost;
        }
        assert!(
            Instant::now() < deadline,
            "no MessageLost: {:?}",
            states.received()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let ConnState::MessageLost { channel: on, error } = lost else {
        unreachable!()
    };
    assert_eq!(on, channel);
    assert!(error.contains("not in the store"), "{error}");
    assert_eq!(
        listener.send(GetStats::new()).await.unwrap().undeliverable,
        1
    );
    assert!(collector.received().is_empty());
}

#[actix_rt::test]
async fn a_subscribe_that_fails_registers_nothing() {
    let (setup, _) = setup().await;
    let listener = listener(&setup);
    let good = unique_name("good");
    subscribe(&listener, &good).await;
    for bad in ["bad\0channel", "", &"c".repeat(64)] {
        let (_, recipient) = Collector::<Signal>::start_new();
        let err = listener
            .send(Subscribe::new(bad, recipient))
            .await
            .unwrap()
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidIdentifier, "{bad:?}");
    }
    let listening = listener.send(ListeningChannels).await.unwrap().unwrap();
    assert_eq!(
        listening.len(),
        2,
        "the reply channel and {good}: {listening:?}"
    );
}

/// A `SubscribeConnState` subscriber that subscribes after the listener connected is told the
/// current state at once (`Connected`), instead of hearing nothing until the next change; one
/// that subscribes after a reconnect is told `Connected` too (it missed nothing of its own).
#[actix_rt::test]
async fn a_late_conn_state_subscriber_learns_the_current_state_at_once() {
    let (setup, admin) = setup().await;
    let (listener, app) = named_listener(&setup);
    let early = conn_states(&listener).await;
    assert_eq!(
        early.wait_for(1, Duration::from_secs(5)).await,
        [ConnState::Connected]
    );
    let late = conn_states(&listener).await;
    assert_eq!(
        late.wait_for(1, Duration::from_secs(1)).await,
        [ConnState::Connected]
    );
    kill_listener(&admin, &app).await;
    let seen = early.wait_for(3, Duration::from_secs(10)).await;
    assert_eq!(seen[2], ConnState::Reconnected, "{seen:?}");
    let later = conn_states(&listener).await;
    assert_eq!(
        later.wait_for(1, Duration::from_secs(1)).await,
        [ConnState::Connected]
    );
    assert_eq!(early.received().len(), 3, "nothing twice for the early one");
}
