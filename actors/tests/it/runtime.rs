//! The runtime's shape: one pool for a coordinator's actors, and subscriptions that end.

use std::time::{Duration, Instant};

use actix::prelude::*;
use pgcoord_actors::*;
use pgcoord_testkit::{backend_pids, unique_name};

use super::signals::{listener, setup};
use super::{Collector, Setup};

async fn listening(listener: &Addr<ListenerActor>) -> Vec<String> {
    listener.send(ListeningChannels).await.unwrap().unwrap()
}

/// Waits until `channel` is, or is not, listened on.
async fn until_listening(listener: &Addr<ListenerActor>, channel: &str, expected: bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while listening(listener).await.iter().any(|c| c == channel) != expected {
        assert!(
            Instant::now() < deadline,
            "{channel} listened on: {}",
            !expected
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[actix_rt::test]
async fn the_last_unsubscribe_unlistens_the_channel() {
    let (setup, _) = setup().await;
    let listener = listener(&setup);
    let channel = unique_name("events");
    let (first, first_recipient) = Collector::<Signal>::start_new();
    listener
        .send(Subscribe::new(channel.clone(), first_recipient.clone()))
        .await
        .unwrap()
        .unwrap();
    let (second, second_recipient) = Collector::<Signal>::start_new();
    listener
        .send(Subscribe::new(channel.clone(), second_recipient.clone()))
        .await
        .unwrap()
        .unwrap();
    until_listening(&listener, &channel, true).await;

    listener
        .send(Unsubscribe::new(channel.clone(), first_recipient))
        .await
        .unwrap();
    listener
        .send(Publish::new(&channel, b"one".to_vec()))
        .await
        .unwrap()
        .unwrap();
    second.wait_for(1, Duration::from_secs(5)).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(first.received().is_empty(), "unsubscribed");
    assert!(
        listening(&listener).await.contains(&channel),
        "one subscriber is left"
    );

    listener
        .send(Unsubscribe::new(channel.clone(), second_recipient))
        .await
        .unwrap();
    until_listening(&listener, &channel, false).await;
}

/// Stops when told to.
struct Quitter;
impl Actor for Quitter {
    type Context = Context<Self>;
}
impl Handler<Signal> for Quitter {
    type Result = ();
    fn handle(&mut self, _: Signal, _: &mut Context<Self>) {}
}
#[derive(Message)]
#[rtype(result = "()")]
struct Quit;
impl Handler<Quit> for Quitter {
    type Result = ();
    fn handle(&mut self, _: Quit, ctx: &mut Context<Self>) {
        ctx.stop();
    }
}

#[actix_rt::test]
async fn a_subscriber_that_is_gone_is_forgotten_and_its_channel_unlistened() {
    let (setup, _) = setup().await;
    let listener = listener(&setup);
    let channel = unique_name("events");
    let quitter = Quitter.start();
    listener
        .send(Subscribe::new(channel.clone(), quitter.clone().recipient()))
        .await
        .unwrap()
        .unwrap();
    until_listening(&listener, &channel, true).await;
    quitter.send(Quit).await.unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    listener
        .send(Publish::new(&channel, b"anyone?".to_vec()))
        .await
        .unwrap()
        .unwrap();
    until_listening(&listener, &channel, false).await;

    // Serving ends the same way.
    let served = unique_name("served");
    listener
        .send(Serve::new(&served, |p: Vec<u8>| async move { Ok(p) }))
        .await
        .unwrap()
        .unwrap();
    until_listening(&listener, &served, true).await;
    listener.send(Unsubscribe::serving(&served)).await.unwrap();
    until_listening(&listener, &served, false).await;
}

#[actix_rt::test]
async fn a_coordinator_opens_one_pool_one_listener_and_a_session_per_advisory_lock() {
    let (setup, admin) = Setup::new(Duration::from_secs(10), Duration::from_secs(2)).await;
    let app = unique_name("app");
    let config = setup
        .builder("shared")
        .application_name(&app)
        .pool_size(3)
        .build()
        .unwrap();
    let coordinator = Coordinator::connect(config).await.unwrap();
    // Work for every actor at once, more than the pool's size.
    let mut leases = Vec::new();
    for i in 0..6 {
        leases.push(
            coordinator
                .locks()
                .unwrap()
                .send(Acquire::new(format!("l{i}"))),
        );
    }
    let leases: Vec<_> = futures_util::future::join_all(leases)
        .await
        .into_iter()
        .map(|r| r.unwrap().unwrap())
        .collect();
    let publishes: Vec<_> = (0..6)
        .map(|i| {
            coordinator
                .signals()
                .unwrap()
                .send(Publish::new("nobody", vec![i]))
        })
        .collect();
    for p in futures_util::future::join_all(publishes).await {
        p.unwrap().unwrap();
    }
    let guards = [
        coordinator
            .advisory()
            .unwrap()
            .send(AdvisoryLock::new(1))
            .await
            .unwrap()
            .unwrap(),
        coordinator
            .advisory()
            .unwrap()
            .send(AdvisoryLock::new(2))
            .await
            .unwrap()
            .unwrap(),
    ];
    tokio::time::sleep(Duration::from_millis(600)).await; // a heartbeat or two
    let count = |name: String| {
        let admin = &admin;
        async move { backend_pids(admin, &name).await.unwrap().len() }
    };
    let pooled = count(app.clone()).await;
    assert!((1..=3).contains(&pooled), "{pooled} pooled sessions");
    assert_eq!(
        count(format!("{app} listener")).await,
        1,
        "one LISTEN connection"
    );
    assert!(count(format!("{app} heartbeat")).await <= 1);
    assert_eq!(count(format!("{app} advisory")).await, guards.len());
    drop(leases);
}

#[actix_rt::test]
async fn a_coordinator_at_rest_closes_its_pooled_connections() {
    let (setup, admin) = Setup::new(Duration::from_secs(20), Duration::from_secs(5)).await;
    let app = unique_name("at-rest");
    let config = (setup.builder("rest").application_name(&app))
        .pool_idle_timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let coordinator = Coordinator::connect(config).await.unwrap();
    // A burst opens pooled connections: eight waits at once, for leases another holds.
    let other = setup.manager("other");
    let mut held = Vec::new();
    for i in 0..8 {
        held.push(
            other
                .call(Acquire::new(format!("burst-{i}")))
                .await
                .unwrap(),
        );
    }
    let burst: Vec<_> = (0..8)
        .map(|i| {
            let acquire = Acquire::new(format!("burst-{i}")).timeout(Duration::from_millis(300));
            coordinator.locks().unwrap().call(acquire)
        })
        .collect();
    for refused in futures_util::future::join_all(burst).await {
        assert!(refused.is_err(), "held by the other");
    }
    for lease in held {
        lease.release().await.unwrap();
    }
    let count = async || {
        let like = |role: &str| format!("{app} {role}");
        let mut pids = backend_pids(&admin, &app).await.unwrap();
        for role in ["listener", "heartbeat"] {
            pids.extend(backend_pids(&admin, &like(role)).await.unwrap());
        }
        pids.len()
    };
    let during = count().await;
    // Idle pooled connections are closed past the idle timeout: the listener and the
    // heartbeat's stay.
    let deadline = Instant::now() + Duration::from_secs(10);
    while count().await > 2 {
        assert!(
            Instant::now() < deadline,
            "still {} connections",
            count().await
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(during > 2, "the burst opened pooled connections: {during}");
}
