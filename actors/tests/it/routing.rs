//! Routed worker pools: a message reaches its key's worker in whichever process holds the key,
//! follows the key when it moves, and every call answers within its timeout; a worker fences
//! its writes with its key's lease.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use actix::prelude::*;
use pgcoord::ErrorKind;
use pgcoord_actors::*;

use super::Setup;

/// What each key's worker received, in order: (the process, the token, the message).
type Received = Arc<Mutex<HashMap<String, Vec<(String, i64, u64)>>>>;

/// Answers `(process, token, message)` and records it; the message 999 is an error.
struct Echo {
    key: WorkerKey,
    process: String,
    received: Received,
}

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
        assert_eq!(
            routed.key(),
            self.key.key,
            "delivered to the key's own worker"
        );
        let n: u64 = routed.value().map_err(|e| e.to_string())?;
        if n == 999 {
            return Err("999 is refused".into());
        }
        let entry = (self.process.clone(), self.key.token, n);
        (self.received.lock().unwrap())
            .entry(self.key.key.clone())
            .or_default()
            .push(entry.clone());
        pgcoord::signal::to_payload(&entry).map_err(|e| e.to_string())
    }
}

struct Process {
    pool: Addr<WorkerPool<Echo>>,
    _locks: Addr<LockManager>,
}

fn start(
    setup: &Setup,
    process: &str,
    keys: &[String],
    received: &Received,
    routed: bool,
) -> Process {
    start_with(setup, process, keys, received, routed, |pool| pool)
}

fn start_with(
    setup: &Setup,
    process: &str,
    keys: &[String],
    received: &Received,
    routed: bool,
    with: impl FnOnce(WorkerPool<Echo>) -> WorkerPool<Echo>,
) -> Process {
    let config = setup.builder(process).build().unwrap();
    let locks = LockManager::new(config.clone()).start();
    let (name, received) = (process.to_owned(), received.clone());
    let factory = move |key: WorkerKey| Echo {
        key,
        process: name.clone(),
        received: received.clone(),
    };
    let pool = WorkerPool::new(&config, locks.clone(), "routed", keys.to_vec(), factory);
    let pool = if routed {
        pool.routed(ListenerActor::new(config, None).start_supervised())
    } else {
        pool
    };
    Process {
        pool: with(pool).start(),
        _locks: locks,
    }
}

fn router(setup: &Setup, process: &str) -> KeyRouter {
    let config = setup.builder(process).build().unwrap();
    let locks = LockManager::new(config.clone()).start();
    KeyRouter::new(
        "routed",
        locks,
        ListenerActor::new(config, None).start_supervised(),
    )
}

async fn held(process: &Process) -> HashMap<String, i64> {
    let assignment = process.pool.send(GetStats::new()).await.unwrap();
    assignment.keys.into_iter().collect()
}

#[actix_rt::test]
async fn a_message_reaches_its_keys_worker_wherever_it_runs_and_follows_a_move() {
    let (setup, _admin) = Setup::new(Duration::from_secs(2), Duration::from_millis(400)).await;
    let keys: Vec<String> = (0..10).map(|i| format!("k{i}")).collect();
    let received = Received::default();
    let a = start(&setup, "a", &keys, &received, true);
    let b = start(&setup, "b", &keys, &received, true);
    pgcoord_testkit::eventually(Duration::from_secs(6), "keys shared 5/5", async || {
        held(&a).await.len() == 5 && held(&b).await.len() == 5
    })
    .await;
    // A third process, no member, sends.
    let router = router(&setup, "sender");
    let (on_a, on_b) = (held(&a).await, held(&b).await);
    for (i, key) in keys.iter().enumerate() {
        let (process, token, n): (String, i64, u64) = router
            .ask_value(key, &(i as u64), Duration::from_secs(5))
            .await
            .unwrap();
        assert_eq!(n, i as u64);
        let holder = if on_a.contains_key(key) {
            ("a", &on_a)
        } else {
            ("b", &on_b)
        };
        assert_eq!(
            (process.as_str(), token),
            (holder.0, holder.1[key]),
            "{key}"
        );
    }
    // The worker's error is the caller's, typed.
    let refused = router
        .ask_value::<_, (String, i64, u64)>("k0", &999u64, Duration::from_secs(5))
        .await
        .unwrap_err();
    assert_eq!(refused.kind(), ErrorKind::Remote, "{refused}");
    assert!(refused.to_string().contains("999 is refused"), "{refused}");

    // While `a` leaves, one sender per key goes on asking: every message is answered (the
    // router follows each key to `b`), in the order sent.
    let senders: Vec<_> = keys
        .iter()
        .map(|key| {
            let (router, key) = (router.clone(), key.clone());
            actix::spawn(async move {
                for n in 100..160u64 {
                    let _: (String, i64, u64) = router
                        .ask_value(&key, &n, Duration::from_secs(10))
                        .await
                        .unwrap_or_else(|e| panic!("{key} message {n}: {e}"));
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    a.pool.send(Shutdown).await.unwrap();
    for sender in senders {
        sender.await.unwrap();
    }
    assert_eq!(held(&b).await.len(), 10, "b took every key");
    let received = received.lock().unwrap().clone();
    for key in &on_a.keys().cloned().collect::<Vec<_>>() {
        let after: Vec<&(String, i64, u64)> =
            received[key].iter().filter(|(_, _, n)| *n >= 100).collect();
        let ns: Vec<u64> = after.iter().map(|(_, _, n)| *n).collect();
        assert_eq!(
            ns,
            (100..160).collect::<Vec<_>>(),
            "{key}: each once, in order"
        );
        assert!(
            after.iter().any(|(p, _, _)| p == "a"),
            "{key} served by a first"
        );
        assert_eq!(after.last().unwrap().0, "b", "{key} served by b at the end");
    }
}

#[actix_rt::test]
async fn a_routed_call_answers_within_its_timeout_and_says_what_it_knows() {
    let (setup, _admin) = Setup::new(Duration::from_secs(2), Duration::from_millis(400)).await;
    let received = Received::default();
    // A member that holds its key but does not serve routed messages: what a sender sees of a
    // holder whose listener is gone.
    let deaf = start(&setup, "deaf", &["held".to_owned()], &received, false);
    pgcoord_testkit::eventually(Duration::from_secs(4), "the key held", async || {
        held(&deaf).await.len() == 1
    })
    .await;
    let router = router(&setup, "sender");
    let timeout = Duration::from_millis(800);
    for tell in [false, true] {
        for (key, says) in [
            ("held", "may or may not have been handled"),
            ("nobody's", "was not delivered"),
        ] {
            let started = Instant::now();
            let e = if tell {
                router.tell(key, b"x".to_vec(), timeout).await.unwrap_err()
            } else {
                router.ask(key, b"x".to_vec(), timeout).await.unwrap_err()
            };
            let took = started.elapsed();
            assert_eq!(e.kind(), ErrorKind::Timeout, "{e}");
            assert!(e.to_string().contains(says), "{key} (tell {tell}): {e}");
            assert!(
                took >= timeout && took < timeout + Duration::from_millis(500),
                "{key} (tell {tell}): {took:?}"
            );
        }
    }
    assert!(received.lock().unwrap().is_empty());
}

/// `tell` is answered once the message is in the key's worker's mailbox: every message told
/// is handled once, in the order told, also while the keys move from a process that leaves.
#[actix_rt::test]
async fn a_tell_is_handled_once_in_order_and_follows_a_move() {
    let (setup, _admin) = Setup::new(Duration::from_secs(2), Duration::from_millis(400)).await;
    let keys: Vec<String> = (0..6).map(|i| format!("k{i}")).collect();
    let received = Received::default();
    let a = start(&setup, "a", &keys, &received, true);
    let b = start(&setup, "b", &keys, &received, true);
    pgcoord_testkit::eventually(Duration::from_secs(6), "keys shared 3/3", async || {
        held(&a).await.len() == 3 && held(&b).await.len() == 3
    })
    .await;
    let on_a = held(&a).await;
    let router = router(&setup, "sender");
    // The worker's error goes nowhere: told is told.
    router
        .tell_value("k0", &999u64, Duration::from_secs(5))
        .await
        .unwrap();
    let senders: Vec<_> = keys
        .iter()
        .map(|key| {
            let (router, key) = (router.clone(), key.clone());
            actix::spawn(async move {
                for n in 0..80u64 {
                    router
                        .tell_value(&key, &n, Duration::from_secs(10))
                        .await
                        .unwrap_or_else(|e| panic!("{key} message {n}: {e}"));
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    a.pool.send(Shutdown).await.unwrap();
    for sender in senders {
        sender.await.unwrap();
    }
    // Told, so in a mailbox: handled soon, whoever holds the key.
    pgcoord_testkit::eventually(
        Duration::from_secs(5),
        "every message handled",
        async || {
            let received = received.lock().unwrap();
            keys.iter()
                .all(|key| received.get(key).is_some_and(|got| got.len() == 80))
        },
    )
    .await;
    let received = received.lock().unwrap().clone();
    for key in &keys {
        let ns: Vec<u64> = received[key].iter().map(|(_, _, n)| *n).collect();
        assert_eq!(
            ns,
            (0..80).collect::<Vec<_>>(),
            "{key}: each once, in order"
        );
        if on_a.contains_key(key) {
            assert_eq!(received[key][0].0, "a", "{key} served by a first");
        }
        assert_eq!(
            received[key].last().unwrap().0,
            "b",
            "{key} served by b at the end"
        );
    }
}

/// The sender's pooled connections stop forwarding (black-holed, new ones refused) and its
/// statement timeout is longer than the call's: an ask and a tell still answer within their
/// timeout, saying the message may have been handled (the statement went out); once the
/// connections are reset, calls go through again.
#[actix_rt::test]
async fn a_routed_call_answers_within_its_timeout_while_the_senders_connections_hang() {
    let (setup, _admin) = Setup::new(Duration::from_secs(2), Duration::from_millis(400)).await;
    let received = Received::default();
    let member = start(&setup, "member", &["k".to_owned()], &received, true);
    pgcoord_testkit::eventually(Duration::from_secs(4), "the key held", async || {
        held(&member).await.len() == 1
    })
    .await;
    let proxy = pgcoord_testkit::Proxy::start(&setup.pg).await.unwrap();
    let config = setup
        .builder("sender")
        .pg_config(&proxy.pg_config(&setup.pg))
        .session_pg_config(&setup.pg)
        .statement_timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let locks = LockManager::new(config.clone()).start();
    let router = KeyRouter::new(
        "routed",
        locks,
        ListenerActor::new(config, None).start_supervised(),
    );
    let ask = async |n: u64, timeout: Duration| {
        router
            .ask_value::<_, (String, i64, u64)>("k", &n, timeout)
            .await
    };
    ask(1, Duration::from_secs(5)).await.unwrap();
    proxy.cut();
    proxy.refuse(true);
    let timeout = Duration::from_secs(1);
    for tell in [false, true] {
        let started = Instant::now();
        let e = if tell {
            router.tell_value("k", &2u64, timeout).await.unwrap_err()
        } else {
            ask(2, timeout).await.unwrap_err()
        };
        let took = started.elapsed();
        assert_eq!(e.kind(), ErrorKind::Timeout, "{e}");
        assert!(e.to_string().contains("may or may not"), "tell {tell}: {e}");
        assert!(
            took < timeout + Duration::from_millis(500),
            "tell {tell}: {took:?}"
        );
    }
    proxy.refuse(false);
    proxy.reset();
    pgcoord_testkit::eventually(
        Duration::from_secs(10),
        "asks go through again",
        async || ask(3, Duration::from_secs(1)).await.is_ok(),
    )
    .await;
}

/// Handles a routed message in 20 ms, one at a time (its mailbox waits meanwhile), and records
/// it.
struct Slow(Arc<Mutex<Vec<u64>>>);

impl Actor for Slow {
    type Context = Context<Self>;
}

impl Handler<Shutdown> for Slow {
    type Result = ();
    fn handle(&mut self, _: Shutdown, ctx: &mut Context<Self>) {
        ctx.stop();
    }
}

impl Handler<Routed> for Slow {
    type Result = AtomicResponse<Self, Result<Vec<u8>, String>>;
    fn handle(&mut self, routed: Routed, _: &mut Context<Self>) -> Self::Result {
        let n: u64 = routed.value().unwrap();
        AtomicResponse::new(Box::pin(
            tokio::time::sleep(Duration::from_millis(20))
                .into_actor(self)
                .map(move |_, act, _| {
                    act.0.lock().unwrap().push(n);
                    Ok(Vec::new())
                }),
        ))
    }
}

/// Tells to a worker slower than its sender fill its mailbox, then wait for room (the sender
/// sends again) rather than pile up: all handled, in order, and the sender held back.
#[actix_rt::test]
async fn tells_to_a_busy_worker_wait_for_room_in_its_mailbox() {
    let (setup, _admin) = Setup::new(Duration::from_secs(2), Duration::from_millis(400)).await;
    let config = setup.builder("busy").build().unwrap();
    let locks = LockManager::new(config.clone()).start();
    let listener = ListenerActor::new(config.clone(), None).start_supervised();
    let handled = Arc::new(Mutex::new(Vec::new()));
    let given = handled.clone();
    let pool = WorkerPool::new(&config, locks, "routed", vec!["k".into()], move |_| {
        Slow(given.clone())
    })
    .routed(listener)
    .start();
    pgcoord_testkit::eventually(Duration::from_secs(4), "the key held", async || {
        pool.send(GetStats::new()).await.unwrap().keys.len() == 1
    })
    .await;
    let router = router(&setup, "sender");
    let started = Instant::now();
    for n in 0..60u64 {
        router
            .tell_value("k", &n, Duration::from_secs(10))
            .await
            .unwrap_or_else(|e| panic!("message {n}: {e}"));
    }
    // A mailbox holds 16: the last tells waited for the worker to make room, 20 ms a message.
    let told = started.elapsed();
    assert!(told >= Duration::from_millis(20 * 30), "{told:?}");
    pgcoord_testkit::eventually(Duration::from_secs(5), "all handled", async || {
        handled.lock().unwrap().len() == 60
    })
    .await;
    assert_eq!(*handled.lock().unwrap(), (0..60).collect::<Vec<_>>());
}

/// Keys come to life on a message: a routed message to a key no member has records it, and a
/// member takes it at once (the doorbell; the ticks are 5 s apart) and answers. Recorded keys
/// are shared fairly and stay known when their member leaves: the other takes them, and their
/// messages follow. A router that does not activate keys records none.
#[actix_rt::test]
async fn a_message_brings_its_key_to_life_and_the_key_stays_known_across_a_move() {
    let (setup, admin) = Setup::new(Duration::from_secs(20), Duration::from_secs(2)).await;
    let received = Received::default();
    let member = |name: &str| {
        start_with(&setup, name, &[], &received, true, |pool| {
            pool.activate_keys()
        })
    };
    let (a, b) = (member("a"), member("b"));
    // Both registered (their first tick claims nothing).
    let observer = router(&setup, "observer");
    pgcoord_testkit::eventually(Duration::from_secs(4), "two members", async || {
        observer.members().await.unwrap().len() == 2
    })
    .await;
    let router = router(&setup, "sender").activate_keys();
    let started = Instant::now();
    let first: (String, i64, u64) = router
        .ask_value("new-0", &0u64, Duration::from_secs(15))
        .await
        .unwrap();
    assert_eq!(first.2, 0);
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "started by the doorbell, not a tick: {:?}",
        started.elapsed()
    );
    let keys: Vec<String> = (0..10).map(|i| format!("new-{i}")).collect();
    for (n, key) in keys.iter().enumerate() {
        let n = n as u64;
        let answer = router.ask_value::<_, (String, i64, u64)>(key, &n, Duration::from_secs(15));
        assert_eq!(answer.await.unwrap().2, n, "{key}");
    }
    // Shared fairly once a tick has passed: five each.
    pgcoord_testkit::eventually(Duration::from_secs(15), "five keys each", async || {
        held(&a).await.len() == 5 && held(&b).await.len() == 5
    })
    .await;
    // `a` leaves: its keys stay recorded, and their next messages bring them up at `b`.
    let on_a = held(&a).await;
    a.pool.send(Shutdown).await.unwrap();
    for (n, key) in keys.iter().enumerate() {
        let (process, _, _): (String, i64, u64) = router
            .ask_value(key, &(100 + n as u64), Duration::from_secs(15))
            .await
            .unwrap();
        assert_eq!(process, "b", "{key}");
    }
    assert_eq!(held(&b).await.len(), 10);
    assert!(
        on_a.keys()
            .all(|k| received.lock().unwrap()[k].iter().any(|(p, _, _)| p == "a"))
    );
    // A router that does not activate keys records none: not delivered.
    let e = observer
        .ask("never-seen", b"x".to_vec(), Duration::from_millis(500))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("was not delivered"), "{e}");
    let sql = format!(
        "SELECT count(*) FROM {} WHERE name = 'routed/keys/never-seen'",
        setup.quoted_table()
    );
    let rows: i64 = admin.query_one(&sql, &[]).await.unwrap().get(0);
    assert_eq!(rows, 0);
}

/// The slot a worker leaves its key in, for the test to fence with.
type Slot = Arc<Mutex<Option<WorkerKey>>>;

struct Keeper;

impl Actor for Keeper {
    type Context = Context<Self>;
}

impl Handler<Shutdown> for Keeper {
    type Result = ();
    fn handle(&mut self, _: Shutdown, ctx: &mut Context<Self>) {
        ctx.stop();
    }
}

#[actix_rt::test]
async fn a_worker_fences_its_writes_with_its_keys_lease() {
    let (setup, mut admin) = Setup::new(Duration::from_secs(2), Duration::from_millis(400)).await;
    let config = setup.builder("fencer").build().unwrap();
    let locks = LockManager::new(config.clone()).start();
    let slot = Slot::default();
    let given = slot.clone();
    let factory = move |key: WorkerKey| {
        *given.lock().unwrap() = Some(key);
        Keeper
    };
    // The keys follow a stream of sets, so that the test can take the key away later.
    let (keys, sets) = tokio::sync::mpsc::unbounded_channel::<Vec<String>>();
    let sets = futures_util::stream::unfold(sets, async |mut sets| {
        sets.recv().await.map(|set| (set, sets))
    });
    let pool = WorkerPool::new(&config, locks.clone(), "fenced", vec!["k".into()], factory)
        .follow(sets)
        .start();
    pgcoord_testkit::eventually(Duration::from_secs(4), "a worker", async || {
        slot.lock().unwrap().is_some()
    })
    .await;
    let first = slot.lock().unwrap().clone().unwrap();
    assert_eq!(first.lease().name(), "fenced/keys/k");
    assert_eq!(first.lease().token(), first.token);
    let tx = admin.transaction().await.unwrap();
    first.fence(&tx).await.unwrap();
    tx.commit().await.unwrap();

    // The key's lease lost on the server: the old key's fence fails, typed; the next worker's
    // holds.
    admin
        .execute(
            &format!(
                "DELETE FROM {} WHERE name = 'fenced/keys/k'",
                setup.quoted_table()
            ),
            &[],
        )
        .await
        .unwrap();
    locks.send(RunNow).await.unwrap().unwrap();
    pgcoord_testkit::eventually(Duration::from_secs(2), "the loss seen", async || {
        first.loss().is_some()
    })
    .await;
    let tx = admin.transaction().await.unwrap();
    let e = first.fence(&tx).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::LockLost, "{e}");
    drop(tx);
    pgcoord_testkit::eventually(Duration::from_secs(4), "a new worker", async || {
        slot.lock()
            .unwrap()
            .as_ref()
            .is_some_and(|k| k.token > first.token)
    })
    .await;
    let second = slot.lock().unwrap().clone().unwrap();
    let tx = admin.transaction().await.unwrap();
    second.fence(&tx).await.unwrap();
    tx.commit().await.unwrap();

    // The test's copy of the key keeps its lease held after the pool stopped the worker: a
    // key's lease goes only when nobody has its WorkerKey any more.
    slot.lock().unwrap().take();
    keys.send(Vec::new()).unwrap();
    pgcoord_testkit::eventually(Duration::from_secs(2), "the key let go", async || {
        let assignment: Assignment = pool.send(GetStats::new()).await.unwrap();
        assignment.keys.is_empty()
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let count = async |admin: &tokio_postgres::Client| -> i64 {
        let sql = format!(
            "SELECT count(*) FROM {} WHERE name = 'fenced/keys/k' AND owner IS NOT NULL",
            setup.quoted_table()
        );
        admin.query_one(&sql, &[]).await.unwrap().get(0)
    };
    assert_eq!(count(&admin).await, 1, "held while the test keeps the key");
    drop(second);
    pgcoord_testkit::eventually(Duration::from_secs(2), "released", async || {
        count(&admin).await == 0
    })
    .await;
}

#[actix_rt::test]
async fn a_pools_members_are_listed_and_their_changes_told() {
    let (setup, _admin) = Setup::new(Duration::from_secs(2), Duration::from_millis(400)).await;
    let (keys, received) = (vec!["k".to_owned()], Received::default());
    let (changes, watcher) = super::Collector::<MembersChanged>::start_new();
    let _a = start_with(&setup, "a", &keys, &received, false, |pool| {
        pool.members_to(watcher)
    });
    let names = |names: &[&str]| names.iter().map(|n| n.to_string()).collect::<Vec<_>>();
    let first = changes.wait_for(1, Duration::from_secs(4)).await[0].clone();
    assert_eq!(
        (first.members, first.joined),
        (names(&["a"]), names(&["a"]))
    );

    let b = start(&setup, "b", &keys, &received, false);
    let joined = changes.wait_for(2, Duration::from_secs(4)).await[1].clone();
    assert_eq!(
        (joined.members, joined.joined, joined.left),
        (names(&["a", "b"]), names(&["b"]), vec![])
    );
    // Any process can read them.
    assert_eq!(
        router(&setup, "observer").members().await.unwrap(),
        names(&["a", "b"])
    );

    b.pool.send(Shutdown).await.unwrap();
    let left = changes.wait_for(3, Duration::from_secs(4)).await[2].clone();
    assert_eq!((left.members, left.left), (names(&["a"]), names(&["b"])));
    assert_eq!(changes.received().len(), 3, "one message per change");
}

/// Starts and stops of a counting worker, in order.
type Lives = Arc<Mutex<Vec<&'static str>>>;

struct Counted(Lives);

impl Actor for Counted {
    type Context = Context<Self>;
    fn started(&mut self, _: &mut Context<Self>) {
        self.0.lock().unwrap().push("started");
    }
    fn stopped(&mut self, _: &mut Context<Self>) {
        self.0.lock().unwrap().push("stopped");
    }
}

impl Handler<Shutdown> for Counted {
    type Result = ();
    fn handle(&mut self, _: Shutdown, ctx: &mut Context<Self>) {
        ctx.stop();
    }
}

impl Handler<Routed> for Counted {
    type Result = Result<Vec<u8>, String>;
    fn handle(&mut self, routed: Routed, _: &mut Context<Self>) -> Self::Result {
        Ok(routed.payload().to_vec())
    }
}

/// An idle worker stops after `passivate_after`, its key still held here with the same token;
/// the next routed message starts one again and is answered.
#[actix_rt::test]
async fn an_idle_worker_passivates_and_the_next_message_wakes_it() {
    let (setup, _admin) = Setup::new(Duration::from_secs(2), Duration::from_millis(400)).await;
    let config = setup.builder("sleepy").build().unwrap();
    let locks = LockManager::new(config.clone()).start();
    let listener = ListenerActor::new(config.clone(), None).start_supervised();
    let lives = Lives::default();
    let given = lives.clone();
    let pool = WorkerPool::new(&config, locks, "routed", vec!["k".into()], move |_| {
        Counted(given.clone())
    })
    .routed(listener)
    .passivate_after(Duration::from_millis(300))
    .start();
    let router = router(&setup, "sender");
    let ask = async || {
        router
            .ask("k", b"hi".to_vec(), Duration::from_secs(5))
            .await
            .unwrap()
    };
    assert_eq!(ask().await, b"hi");
    let token = *pool
        .send(GetStats::new())
        .await
        .unwrap()
        .keys
        .values()
        .next()
        .unwrap();
    pgcoord_testkit::eventually(Duration::from_secs(4), "passivated", async || {
        pool.send(GetStats::new()).await.unwrap().passive == 1
    })
    .await;
    pgcoord_testkit::eventually(Duration::from_secs(2), "the worker stopped", async || {
        lives.lock().unwrap().last() == Some(&"stopped")
    })
    .await;
    let before = lives.lock().unwrap().len();
    let idle = pool.send(GetStats::new()).await.unwrap();
    assert_eq!(
        (idle.keys.len(), idle.keys.values().next()),
        (1, Some(&token)),
        "the key stays held"
    );
    // The next message wakes it: a worker again, the same tenure.
    assert_eq!(ask().await, b"hi");
    assert_eq!(lives.lock().unwrap()[before..], ["started"]);
    let awake = pool.send(GetStats::new()).await.unwrap();
    assert_eq!(
        (awake.passive, awake.keys.values().next()),
        (0, Some(&token))
    );
}

/// Two deployments share a database, each with its own lock table, and name their pools and
/// members alike: a router reaches only its own deployment's workers (a route channel is
/// scoped to the lock table, not only to the pool's and owner's names).
#[actix_rt::test]
async fn deployments_on_one_database_never_answer_each_others_routed_messages() {
    let (one, _) = Setup::new(Duration::from_secs(2), Duration::from_millis(400)).await;
    let (two, _) = Setup::new(Duration::from_secs(2), Duration::from_millis(400)).await;
    let keys: Vec<String> = (0..4).map(|i| format!("k{i}")).collect();
    let (got_one, got_two) = (Received::default(), Received::default());
    let a_one = start(&one, "a", &keys, &got_one, true);
    let a_two = start(&two, "a", &keys, &got_two, true);
    for process in [&a_one, &a_two] {
        pgcoord_testkit::eventually(Duration::from_secs(6), "every key held", async || {
            held(process).await.len() == 4
        })
        .await;
    }
    let router = router(&one, "sender");
    for n in 0..20u64 {
        let key = &keys[n as usize % 4];
        let answer = router.ask_value::<_, (String, i64, u64)>(key, &n, Duration::from_secs(5));
        assert_eq!(answer.await.unwrap().2, n);
    }
    let handled: usize = got_one.lock().unwrap().values().map(Vec::len).sum();
    assert_eq!(
        handled, 20,
        "every message handled by its own deployment's worker"
    );
    assert!(
        got_two.lock().unwrap().is_empty(),
        "the other deployment's workers got none"
    );
}

/// The pool's doorbell (rung when a router records a key that came to life) is a NOTIFY anyone
/// can send: a flood of it costs a member a look per doorbell gap (50 ms), not one each.
#[actix_rt::test]
async fn a_flood_of_pool_doorbells_costs_a_look_per_gap() {
    let (setup, admin) = Setup::new(Duration::from_secs(20), Duration::from_secs(2)).await;
    let received = Received::default();
    let member = start_with(&setup, "a", &[], &received, true, |pool| {
        pool.activate_keys()
    });
    pgcoord_testkit::eventually(Duration::from_secs(4), "a first tick", async || {
        member.pool.send(GetStats::new()).await.unwrap().ticks > 0
    })
    .await;
    // The pool's doorbell: the holder channel of an empty owner in the pool's scope.
    let config = setup.builder("a").build().unwrap();
    let (table, pool) = (config.lock_table().quoted(), "routed");
    let scope = format!("route {}:{table} {}:{pool} ", table.len(), pool.len());
    let channel = pgcoord::lease::holder_channel(&scope, "");
    let looks = async || member.pool.send(GetStats::new()).await.unwrap().ticks;
    let (sent, looked, most) = super::flood(&admin, &channel, "x", looks).await;
    assert!(looked <= most, "{looked} looks for {sent} doorbells");
    assert!(looked >= 2, "the doorbell is heard: {looked} looks");
}
