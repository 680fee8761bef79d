//! Worker pools on both backends: the same test on PostgreSQL (two `Coordinator`s, as two
//! processes) and in memory (two coordinators of one `MemoryBackend`) — keys shared, messages
//! routed to each key's worker (asked and told), a lost key's worker stopped and the key served
//! again with a greater token, and a member's keys taken by the other when it stops.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use actix::prelude::*;
use pgcoord_actors::*;

use super::backends::{Harness, Memory, Postgres};

/// What each key's worker handled, in order: (the process, the token, the message).
type Handled = Arc<Mutex<HashMap<String, Vec<(String, i64, u64)>>>>;

/// Answers `(process, token)` to each routed message and records it.
struct Counter {
    key: WorkerKey,
    process: String,
    handled: Handled,
}

impl Actor for Counter {
    type Context = Context<Self>;
}

impl Handler<Shutdown> for Counter {
    type Result = ();
    fn handle(&mut self, _: Shutdown, ctx: &mut Context<Self>) {
        ctx.stop();
    }
}

impl Handler<Routed> for Counter {
    type Result = Result<Vec<u8>, String>;
    fn handle(&mut self, routed: Routed, _: &mut Context<Self>) -> Self::Result {
        let n: u64 = routed.value().map_err(|e| e.to_string())?;
        let entry = (self.process.clone(), self.key.token, n);
        (self.handled.lock().unwrap())
            .entry(self.key.key.clone())
            .or_default()
            .push(entry);
        pgcoord::signal::to_payload(&(self.process.as_str(), self.key.token))
            .map_err(|e| e.to_string())
    }
}

/// The factory of process `name`'s counters, recording into `handled`.
fn counters(name: &'static str, handled: &Handled) -> impl Fn(WorkerKey) -> Counter + 'static {
    let handled = handled.clone();
    move |key: WorkerKey| Counter {
        key,
        process: name.to_owned(),
        handled: handled.clone(),
    }
}

async fn until(what: &str, within: Duration, mut done: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !done().await {
        assert!(Instant::now() < deadline, "{what}: not within {within:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn held(pool: &Addr<WorkerPool<Counter>>) -> HashMap<String, i64> {
    let assignment = pool.send(GetStats::new()).await.unwrap();
    assignment.keys.into_iter().collect()
}

async fn a_pool_shares_routes_and_serves_a_lost_key_again<H: Harness>(h: H) {
    let (a, b) = h.processes();
    let keys: Vec<String> = (0..6).map(|i| format!("k{i}")).collect();
    let handled = Handled::default();
    let member = |process: &Coordinator, name: &'static str| {
        let factory = counters(name, &handled);
        process
            .worker_pool("pool", keys.clone(), factory)
            .routed_by(process)
            .start()
    };
    let (on_a, on_b) = (member(&a, "a"), member(&b, "b"));
    until("three keys each", Duration::from_secs(10), async || {
        held(&on_a).await.len() == 3 && held(&on_b).await.len() == 3
    })
    .await;
    let router = a.key_router("pool");
    let (held_a, held_b) = (held(&on_a).await, held(&on_b).await);
    for (n, key) in keys.iter().enumerate() {
        let (process, token): (String, i64) = router
            .ask_value(key, &(n as u64), Duration::from_secs(5))
            .await
            .unwrap();
        let expected = match held_a.get(key) {
            Some(token) => ("a", *token),
            None => ("b", held_b[key]),
        };
        assert_eq!((process.as_str(), token), expected, "{key}");
        router
            .tell_value(key, &(100 + n as u64), Duration::from_secs(5))
            .await
            .unwrap();
    }
    until("every tell handled", Duration::from_secs(5), async || {
        let handled = handled.lock().unwrap();
        keys.iter()
            .all(|k| handled.get(k).is_some_and(|got| got.len() == 2))
    })
    .await;

    // A key of `a` lost: its worker stops, and the key is served again, with a greater token.
    let (lost, token) = held_a.iter().next().map(|(k, t)| (k.clone(), *t)).unwrap();
    h.force_loss(&format!("pool/keys/{lost}")).await;
    until(
        "the key served again",
        Duration::from_secs(10),
        async || {
            let again = held(&on_a)
                .await
                .get(&lost)
                .copied()
                .or(held(&on_b).await.get(&lost).copied());
            again.is_some_and(|t| t > token)
        },
    )
    .await;
    let (_, again): (String, i64) = router
        .ask_value(&lost, &7u64, Duration::from_secs(5))
        .await
        .unwrap();
    assert!(again > token);

    // `b` stops: `a` takes every key, and messages follow.
    on_b.send(Shutdown).await.unwrap();
    until("a holds every key", Duration::from_secs(10), async || {
        held(&on_a).await.len() == 6
    })
    .await;
    for key in &keys {
        let (process, _): (String, i64) = router
            .ask_value(key, &9u64, Duration::from_secs(5))
            .await
            .unwrap();
        assert_eq!(process, "a", "{key}");
    }
}

/// Keys come to life: pools with no keys of their own, and a message to a new key starts its
/// worker at one of them, which answers.
async fn a_message_brings_its_key_to_life<H: Harness>(h: H) {
    let (a, b) = h.processes();
    let handled = Handled::default();
    let member = |process: &Coordinator, name: &'static str| {
        let factory = counters(name, &handled);
        process
            .worker_pool("lazy", Vec::new(), factory)
            .routed_by(process)
            .activate_keys()
            .start()
    };
    let (on_a, on_b) = (member(&a, "a"), member(&b, "b"));
    let router = b.key_router("lazy").activate_keys();
    for n in 0..4u64 {
        let key = format!("new-{n}");
        let answer = router.ask_value::<_, (String, i64)>(&key, &n, Duration::from_secs(10));
        answer.await.unwrap();
    }
    until("two new keys each", Duration::from_secs(10), async || {
        held(&on_a).await.len() == 2 && held(&on_b).await.len() == 2
    })
    .await;
    // Without `activate_keys`, a router does not bring keys to life.
    let plain = a.key_router("lazy");
    let e = plain.ask("never", b"x".to_vec(), Duration::from_millis(300));
    let e = e.await.unwrap_err();
    assert!(e.to_string().contains("was not delivered"), "{e}");
}

mod a_message_brings_its_key_to_life {
    #[actix_rt::test]
    async fn postgres() {
        super::a_message_brings_its_key_to_life(super::Postgres::new().await).await
    }
    #[actix_rt::test]
    async fn memory() {
        super::a_message_brings_its_key_to_life(super::Memory::new().await).await
    }
}

mod a_pool_shares_routes_and_serves_a_lost_key_again {
    #[actix_rt::test]
    async fn postgres() {
        super::a_pool_shares_routes_and_serves_a_lost_key_again(super::Postgres::new().await).await
    }
    #[actix_rt::test]
    async fn memory() {
        super::a_pool_shares_routes_and_serves_a_lost_key_again(super::Memory::new().await).await
    }
}
