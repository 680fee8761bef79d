//! Connections left idle across a partition are dead though their sockets look open (the proxy
//! black-holes them for good, as a firewall that forgot them does). Once the network heals, a
//! call with time left gets its answer from a healthy connection: a dead idle one costs a check,
//! not the caller's deadline. Pooled statements (an acquire, a publish, a routed ask) and the
//! heartbeat's renewal alike.

use std::time::{Duration, Instant};

use actix::prelude::*;
use pgcoord_actors::*;
use pgcoord_testkit::{Proxy, eventually, unique_name};

use super::{Collector, Setup};

/// Longer than a connection may stay idle unchecked (a second): a partition that kills TCP
/// connections lasts longer than that.
const PARTITION: Duration = Duration::from_millis(2000);

/// A partition as a client sees it, for [`PARTITION`]: every connection open through `proxy`
/// black-holed for good, and new ones hang. Then new connections pass again.
async fn partition_then_heal(proxy: &Proxy) {
    partition_then_heal_after(proxy, async {}).await;
}

/// Like [`partition_then_heal`], with `during` run once the connections have been idle for over
/// a second: a call that fails, leaving connects hung behind it (they end at the connect
/// timeout, after the partition has healed).
async fn partition_then_heal_after(proxy: &Proxy, during: impl Future<Output = ()>) {
    proxy.cut();
    proxy.black_hole_new(true);
    let started = Instant::now();
    tokio::time::sleep(Duration::from_millis(1100)).await;
    during.await;
    tokio::time::sleep_until((started + PARTITION).into()).await;
    proxy.black_hole_new(false);
}

/// A config whose pooled connections go through `proxy`, sessions (LISTEN, heartbeat) direct, and
/// whose statement bound is longer than any call's timeout here: a statement sent on a dead
/// connection would wait for the call's whole deadline.
fn pooled_through(setup: &Setup, proxy: &Proxy, owner: &str) -> pgcoord::Config {
    setup
        .builder(owner)
        .pg_config(&proxy.pg_config(&setup.pg))
        .session_pg_config(&setup.pg)
        .statement_timeout(Duration::from_secs(10))
        .build()
        .unwrap()
}

/// A manager whose pooled connections go through `proxy`, with one connection in its pool.
async fn warm_manager(setup: &Setup, proxy: &Proxy) -> Addr<LockManager> {
    let manager = LockManager::new(pooled_through(setup, proxy, "holder")).start();
    let warm = manager.send(Acquire::new("warm")).await.unwrap().unwrap();
    warm.release().await.unwrap();
    manager
}

/// Acquires a free lease with a 3 s timeout: granted within it.
async fn granted_within_its_timeout(manager: &Addr<LockManager>) {
    let timeout = Duration::from_secs(3);
    let started = Instant::now();
    let lease = manager
        .send(Acquire::new("free").timeout(timeout))
        .await
        .unwrap();
    let took = started.elapsed();
    let lease = lease.unwrap_or_else(|e| panic!("a free lease after {took:?}: {e}"));
    assert!(took < timeout, "{took:?}");
    lease.release().await.unwrap();
}

#[actix_rt::test]
async fn after_a_partition_heals_an_acquire_is_granted_within_its_timeout() {
    let (setup, _admin) = Setup::new(Duration::from_secs(10), Duration::from_secs(2)).await;
    let proxy = Proxy::start(&setup.pg).await.unwrap();
    let manager = warm_manager(&setup, &proxy).await;
    partition_then_heal(&proxy).await;
    granted_within_its_timeout(&manager).await;
}

/// A call during the partition finds the idle connection dead and connects, and that connect
/// hangs until the connect timeout (5 s), past the partition's end: the acquire after it is not
/// held behind it.
#[actix_rt::test]
async fn connects_hung_since_a_partition_hold_no_acquire_after_it() {
    let (setup, _admin) = Setup::new(Duration::from_secs(10), Duration::from_secs(2)).await;
    let proxy = Proxy::start(&setup.pg).await.unwrap();
    let manager = warm_manager(&setup, &proxy).await;
    partition_then_heal_after(&proxy, async {
        let during = Acquire::new("during").timeout(Duration::from_millis(300));
        let e = manager.send(during).await.unwrap().unwrap_err();
        assert_eq!(e.kind(), pgcoord::ErrorKind::Unavailable, "{e}");
    })
    .await;
    granted_within_its_timeout(&manager).await;
}

#[actix_rt::test]
async fn after_a_partition_heals_a_publish_goes_out() {
    let (setup, _admin) = super::signals::setup().await;
    let proxy = Proxy::start(&setup.pg).await.unwrap();
    let channel = unique_name("healed");
    let hearing = super::signals::listener(&setup);
    let heard = super::signals::subscribe(&hearing, &channel).await;
    let config = pooled_through(&setup, &proxy, "publisher");
    let publisher = ListenerActor::new(config, None).start_supervised();
    publisher
        .send(Publish::value(&channel, "before").unwrap())
        .await
        .unwrap()
        .unwrap();
    heard.wait_for(1, Duration::from_secs(5)).await;

    partition_then_heal(&proxy).await;
    let started = Instant::now();
    let sent = publisher
        .send(Publish::value(&channel, "after").unwrap())
        .await
        .unwrap();
    let took = started.elapsed();
    sent.unwrap_or_else(|e| panic!("published after {took:?}: {e}"));
    assert!(took < Duration::from_secs(3), "{took:?}");
    let received = heard.wait_for(2, Duration::from_secs(5)).await;
    assert_eq!(received[1].value::<String>().unwrap(), "after");
}

/// Answers the number it is asked.
struct Echo;

impl Actor for Echo {
    type Context = Context<Self>;
}

impl Handler<Shutdown> for Echo {
    type Result = ();
    fn handle(&mut self, _: Shutdown, ctx: &mut Context<Self>) {
        ctx.stop();
    }
}

impl Handler<Routed> for Echo {
    type Result = Result<Vec<u8>, String>;
    fn handle(&mut self, routed: Routed, _: &mut Context<Self>) -> Self::Result {
        Ok(routed.payload().to_vec())
    }
}

#[actix_rt::test]
async fn after_a_partition_heals_a_routed_ask_is_answered_within_its_timeout() {
    let (setup, _admin) = Setup::new(Duration::from_secs(2), Duration::from_millis(400)).await;
    let config = setup.builder("member").build().unwrap();
    let locks = LockManager::new(config.clone()).start();
    let member = WorkerPool::new(&config, locks, "healed", vec!["k".to_owned()], |_| Echo)
        .routed(ListenerActor::new(config, None).start_supervised())
        .start();
    eventually(Duration::from_secs(4), "the key held", async || {
        member.send(GetStats::new()).await.unwrap().keys.len() == 1
    })
    .await;
    let proxy = Proxy::start(&setup.pg).await.unwrap();
    let config = pooled_through(&setup, &proxy, "sender");
    let router = KeyRouter::new(
        "healed",
        LockManager::new(config.clone()).start(),
        ListenerActor::new(config, None).start_supervised(),
    );
    let timeout = Duration::from_secs(3);
    router.ask("k", b"before".to_vec(), timeout).await.unwrap();

    partition_then_heal_after(&proxy, async {
        let during = router.ask("k", b"during".to_vec(), Duration::from_millis(300));
        assert!(during.await.is_err());
    })
    .await;
    let started = Instant::now();
    let answer = router.ask("k", b"after".to_vec(), timeout).await;
    let took = started.elapsed();
    let answer = answer.unwrap_or_else(|e| panic!("answered after {took:?}: {e}"));
    assert_eq!(answer, b"after");
    assert!(took < timeout, "{took:?}");
}

/// Every connection of the holder goes through the proxy, its heartbeat's included. The
/// renewal after the partition finds the heartbeat's connection dead by a check and renews on a
/// new one: no renewal fails, although one would have waited a quarter lease for nothing.
#[actix_rt::test]
async fn after_a_partition_heals_the_next_renewal_succeeds() {
    let lease = Duration::from_secs(9);
    let heartbeat = Duration::from_secs(3);
    let (setup, admin) = Setup::new(lease, heartbeat).await;
    let proxy = Proxy::start(&setup.pg).await.unwrap();
    let config = setup
        .builder("holder")
        .pg_config(&proxy.pg_config(&setup.pg))
        .build()
        .unwrap();
    let manager = LockManager::new(config).start();
    let lost = Collector::subscribe(&manager).await;
    let held = manager.send(Acquire::new("kept")).await.unwrap().unwrap();
    let stats = async || manager.send(GetStats::new()).await.unwrap();
    let expires = async || -> f64 {
        let sql = format!(
            "SELECT extract(epoch FROM expires_at)::float8 FROM \"{}\" WHERE name = 'kept'",
            setup.table
        );
        admin.query_one(&sql, &[]).await.unwrap().get(0)
    };
    // Right after a renewal, so the partition ends before the next one is due. Its answer is
    // on the way when the row has moved: given a moment, well within the heartbeat, to arrive.
    let acquired = expires().await;
    eventually(heartbeat * 2, "a renewal", async || {
        expires().await > acquired
    })
    .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let renewed = expires().await;

    partition_then_heal(&proxy).await;
    eventually(heartbeat * 2, "a renewal after the partition", async || {
        expires().await > renewed
    })
    .await;
    let after = stats().await;
    assert_eq!(after.renew_failures, 0, "{after:?}");
    assert!(lost.received().is_empty(), "lost: {:?}", lost.received());
    assert!(held.loss().is_none());
}
