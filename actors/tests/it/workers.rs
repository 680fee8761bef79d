//! Worker pools: every key served by exactly one worker at any moment (recorded and checked),
//! keys shared on join and taken over on leave within about a lease, a panicking worker started
//! again, a lost lease's worker stopped before the key is served again.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use actix::prelude::*;
use pgcoord_actors::*;

use super::Setup;

#[derive(Debug, Clone)]
enum Event {
    Started {
        key: String,
        token: i64,
        pool: String,
    },
    Stopped {
        key: String,
        token: i64,
    },
    Panicked {
        key: String,
        token: i64,
    },
}

type History = Arc<Mutex<Vec<Event>>>;
type Workers = Arc<Mutex<HashMap<String, Addr<Recorder>>>>;

/// A worker that records its start and stop, and panics when asked.
struct Recorder {
    key: WorkerKey,
    pool: String,
    history: History,
    workers: Workers,
}

impl Actor for Recorder {
    type Context = Context<Self>;
    fn started(&mut self, ctx: &mut Context<Self>) {
        self.history.lock().unwrap().push(Event::Started {
            key: self.key.key.clone(),
            token: self.key.token,
            pool: self.pool.clone(),
        });
        self.workers
            .lock()
            .unwrap()
            .insert(self.key.key.clone(), ctx.address());
    }
    fn stopped(&mut self, _: &mut Context<Self>) {
        self.history.lock().unwrap().push(Event::Stopped {
            key: self.key.key.clone(),
            token: self.key.token,
        });
    }
}

impl Handler<Shutdown> for Recorder {
    type Result = ();
    fn handle(&mut self, _: Shutdown, ctx: &mut Context<Self>) {
        ctx.stop();
    }
}

#[derive(Message)]
#[rtype(result = "()")]
struct Panic;

impl Handler<Panic> for Recorder {
    type Result = ();
    fn handle(&mut self, _: Panic, _: &mut Context<Self>) {
        self.history.lock().unwrap().push(Event::Panicked {
            key: self.key.key.clone(),
            token: self.key.token,
        });
        panic!("a worker's bug");
    }
}

/// Checks that no key ever had two workers: per key, a start only when none runs (or, with the
/// same token, after the one running panicked).
fn check(history: &[Event]) -> usize {
    let mut running: HashMap<&str, i64> = HashMap::new();
    for event in history {
        match event {
            Event::Started { key, token, pool } => {
                if let Some(other) = running.insert(key, *token) {
                    panic!("{key}: started by {pool} (token {token}) while token {other} ran");
                }
            }
            Event::Stopped { key, token } | Event::Panicked { key, token } => {
                if running.get(key.as_str()) == Some(token) {
                    running.remove(key.as_str());
                }
            }
        }
    }
    running.len()
}

async fn assignment(pool: &Addr<WorkerPool<Recorder>>) -> Assignment {
    pool.send(GetStats::new()).await.unwrap()
}

#[actix_rt::test]
async fn keys_are_shared_moved_and_never_served_twice() {
    let (setup, admin) = Setup::new(Duration::from_secs(2), Duration::from_millis(400)).await;
    let keys: Vec<String> = (0..50).map(|i| format!("customer-{i}")).collect();
    let (history, workers): (History, Workers) = Default::default();
    let start = |owner: &str| {
        let config = setup.builder(owner).build().unwrap();
        let locks = LockManager::new(config.clone()).start();
        let (history, workers, pool) = (history.clone(), workers.clone(), owner.to_owned());
        let factory = move |key: WorkerKey| Recorder {
            key,
            pool: pool.clone(),
            history: history.clone(),
            workers: workers.clone(),
        };
        (
            WorkerPool::new(&config, locks.clone(), "customers", keys.clone(), factory).start(),
            locks,
        )
    };

    // Alone, a pool takes every key (after its first tick, a quarter lease).
    let (a, _a_locks) = start("a");
    pgcoord_testkit::eventually(Duration::from_secs(3), "a holds all 50", async || {
        assignment(&a).await.keys.len() == 50
    })
    .await;

    // A second process joins: the keys are shared within about a lease.
    let joined = Instant::now();
    let (b, b_locks) = start("b");
    pgcoord_testkit::eventually(Duration::from_secs(4), "shared 25/25", async || {
        let (x, y) = (
            assignment(&a).await.keys.len(),
            assignment(&b).await.keys.len(),
        );
        x == 25 && y == 25
    })
    .await;
    eprintln!("shared after {:?}", joined.elapsed());

    // A worker that panics is started again, with the same token, while its key is held.
    let (key, token) = {
        let held = assignment(&b).await.keys;
        let (key, token) = held.first_key_value().unwrap();
        (key.clone(), *token)
    };
    let worker = workers.lock().unwrap()[&key].clone();
    worker.do_send(Panic);
    pgcoord_testkit::eventually(Duration::from_secs(3), "restarted", async || {
        assignment(&b).await.restarts == 1
    })
    .await;
    assert_eq!(assignment(&b).await.keys.get(&key), Some(&token));

    // A lease lost on the server: its worker stops before anyone serves the key again.
    let (lost, lost_token) = {
        let held = assignment(&b).await.keys;
        let (key, token) = held.iter().nth(1).unwrap();
        (key.clone(), *token)
    };
    admin
        .execute(
            &format!("DELETE FROM {} WHERE name = $1", setup.quoted_table()),
            &[&format!("customers/keys/{lost}")],
        )
        .await
        .unwrap();
    b_locks.send(RunNow).await.unwrap().unwrap();
    pgcoord_testkit::eventually(
        Duration::from_secs(4),
        "the lost key served again",
        async || {
            let (x, y) = (assignment(&a).await, assignment(&b).await);
            [x.keys.get(&lost), y.keys.get(&lost)]
                .into_iter()
                .flatten()
                .any(|token| *token > lost_token)
        },
    )
    .await;

    // The first process leaves: the other takes every key within about a lease.
    let left = Instant::now();
    a.send(Shutdown).await.unwrap();
    pgcoord_testkit::eventually(Duration::from_secs(4), "b holds all 50", async || {
        assignment(&b).await.keys.len() == 50
    })
    .await;
    eprintln!("taken over after {:?}", left.elapsed());

    let history = history.lock().unwrap().clone();
    let running = check(&history);
    assert_eq!(running, 50, "one worker per key at the end");
}

/// Keys given as a stream: each item is the whole set; a key that leaves stops its worker and
/// frees its lease, a new one is claimed, and the pool goes on when the stream ends.
#[actix_rt::test]
async fn a_pool_follows_a_stream_of_key_sets() {
    let (setup, admin) = Setup::new(Duration::from_secs(2), Duration::from_millis(400)).await;
    let (history, workers): (History, Workers) = Default::default();
    let config = setup.builder("follower").build().unwrap();
    let locks = LockManager::new(config.clone()).start();
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<Vec<String>>();
    let keys =
        futures_util::stream::unfold(
            rx,
            |mut rx| async move { rx.recv().await.map(|set| (set, rx)) },
        );
    let factory = move |key: WorkerKey| Recorder {
        key,
        pool: "follower".into(),
        history: history.clone(),
        workers: workers.clone(),
    };
    let pool = WorkerPool::new(&config, locks, "streamed", Vec::new(), factory)
        .follow(keys)
        .start();
    let names = async |pool: &Addr<WorkerPool<Recorder>>| -> Vec<String> {
        assignment(pool).await.keys.into_keys().collect()
    };
    tx.send(vec!["a".into(), "b".into(), "c".into()]).unwrap();
    pgcoord_testkit::eventually(Duration::from_secs(3), "a, b, c", async || {
        names(&pool).await == ["a", "b", "c"]
    })
    .await;
    tx.send(vec!["b".into(), "c".into(), "d".into()]).unwrap();
    drop(tx);
    pgcoord_testkit::eventually(Duration::from_secs(3), "b, c, d", async || {
        names(&pool).await == ["b", "c", "d"]
    })
    .await;
    // "a" is free on the server again.
    pgcoord_testkit::eventually(Duration::from_secs(2), "a's lease released", async || {
        let sql = format!(
            "SELECT count(*) FROM {} WHERE name = 'streamed/keys/a'",
            setup.quoted_table()
        );
        admin.query_one(&sql, &[]).await.unwrap().get::<_, i64>(0) == 0
    })
    .await;
}

/// `max_moves` bounds the keys claimed and released per tick, counted by the pool's own ticks:
/// alone, a pool takes 40 keys at most 3 a tick; when a second joins, keys move at most 3 a
/// tick each way until they are shared 20/20.
#[actix_rt::test]
async fn max_moves_bounds_the_keys_moved_per_tick() {
    let (setup, _admin) = Setup::new(Duration::from_secs(2), Duration::from_millis(400)).await;
    let keys: Vec<String> = (0..40).map(|i| format!("k{i}")).collect();
    let history = History::default();
    let start = |owner: &str| {
        recorded(&setup, owner, "moves", &keys, &history)
            .max_moves(3)
            .start()
    };
    let a = start("a");
    let began = Instant::now();
    loop {
        assert!(
            began.elapsed() < Duration::from_secs(60),
            "not done in a minute"
        );
        let now = assignment(&a).await;
        // The first tick claims nothing; each later one at most 3.
        assert!(
            now.keys.len() as u64 <= 3 * now.ticks.saturating_sub(1),
            "{} keys after {} ticks",
            now.keys.len(),
            now.ticks
        );
        if now.keys.len() == 40 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let since = assignment(&a).await.ticks;
    let b = start("b");
    loop {
        assert!(
            began.elapsed() < Duration::from_secs(60),
            "not done in a minute"
        );
        let (x, y) = (assignment(&a).await, assignment(&b).await);
        assert!(
            y.keys.len() as u64 <= 3 * y.ticks.saturating_sub(1),
            "b: {} keys after {} ticks",
            y.keys.len(),
            y.ticks
        );
        // `a` releases only in ticks after b's first (b registers, then a sees two members).
        assert!(
            40 - x.keys.len() as u64 <= 3 * (x.ticks - since),
            "a: {} keys {} ticks after b started",
            x.keys.len(),
            x.ticks - since
        );
        if x.keys.len() == 20 && y.keys.len() == 20 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(check(&history.lock().unwrap()), 40, "one worker per key");
}

/// Starts a pool of `name` over `keys` for `owner`, recording into `history`.
fn recorded(
    setup: &Setup,
    owner: &str,
    name: &str,
    keys: &[String],
    history: &History,
) -> WorkerPool<Recorder> {
    let config = setup.builder(owner).build().unwrap();
    let locks = LockManager::new(config.clone()).start();
    let (history, workers, pool) = (history.clone(), Workers::default(), owner.to_owned());
    let factory = move |key: WorkerKey| Recorder {
        key,
        pool: pool.clone(),
        history: history.clone(),
        workers: workers.clone(),
    };
    WorkerPool::new(&config, locks, name, keys.to_vec(), factory)
}

/// The process each key's workers ran in, in order of their starts.
fn placements(history: &[Event]) -> HashMap<String, Vec<String>> {
    let mut placed: HashMap<String, Vec<String>> = HashMap::new();
    for event in history {
        if let Event::Started { key, pool, .. } = event {
            let places = placed.entry(key.clone()).or_default();
            if places.last() != Some(pool) {
                places.push(pool.clone());
            }
        }
    }
    placed
}

/// A member joining two others takes only its share, from both, and no key moves between the
/// two that were there: 30 keys shared 15/15 become 10/10/10 with 10 keys moved.
#[actix_rt::test]
async fn a_joining_member_moves_only_its_share() {
    let (setup, _admin) = Setup::new(Duration::from_secs(2), Duration::from_millis(400)).await;
    let keys: Vec<String> = (0..30).map(|i| format!("k{i}")).collect();
    let history = History::default();
    let a = recorded(&setup, "a", "joins", &keys, &history).start();
    let b = recorded(&setup, "b", "joins", &keys, &history).start();
    pgcoord_testkit::eventually(Duration::from_secs(6), "15/15", async || {
        assignment(&a).await.keys.len() == 15 && assignment(&b).await.keys.len() == 15
    })
    .await;
    let before = placements(&history.lock().unwrap());
    let c = recorded(&setup, "c", "joins", &keys, &history).start();
    pgcoord_testkit::eventually(Duration::from_secs(6), "10/10/10", async || {
        let held = [&a, &b, &c].map(async |p| assignment(p).await.keys.len());
        futures_util::future::join_all(held).await == [10, 10, 10]
    })
    .await;
    let history = history.lock().unwrap().clone();
    let after = placements(&history);
    let moved = keys
        .iter()
        .filter(|k| after[*k].len() > before[*k].len())
        .count();
    assert_eq!(moved, 10, "only the joiner's share moved: {after:?}");
    assert!(
        keys.iter().all(|k| after[k].len() <= before[k].len() + 1),
        "{after:?}"
    );
    assert_eq!(check(&history), 30, "one worker per key");
}

/// A drained member hands every key over and stops: out of the membership at once, its keys
/// let go three at once and three a tick, each worker stopped before its key is released, and the call resolves
/// once all are released; the other member serves every key, never two workers at once.
#[actix_rt::test]
async fn a_drained_member_hands_its_keys_over_and_stops() {
    let (setup, admin) = Setup::new(Duration::from_secs(2), Duration::from_millis(400)).await;
    let keys: Vec<String> = (0..20).map(|i| format!("k{i}")).collect();
    let history = History::default();
    let a = recorded(&setup, "a", "drains", &keys, &history)
        .max_moves(3)
        .start();
    let b = recorded(&setup, "b", "drains", &keys, &history).start();
    pgcoord_testkit::eventually(Duration::from_secs(6), "10/10", async || {
        assignment(&a).await.keys.len() == 10 && assignment(&b).await.keys.len() == 10
    })
    .await;
    let started = Instant::now();
    a.send(Drain).await.unwrap();
    eprintln!("drained in {:?}", started.elapsed());
    // Ten keys, three at once and three a tick: three ticks more, two whole ones at least (a
    // quarter lease each; the first comes whenever the pool's interval fires).
    assert!(
        started.elapsed() >= Duration::from_millis(2 * 500),
        "{:?}",
        started.elapsed()
    );
    assert!(!a.connected(), "the drained pool stopped");
    let sql = format!(
        "SELECT count(*) FROM {} WHERE owner = 'a' AND name LIKE 'drains/%'",
        setup.quoted_table()
    );
    let held: i64 = admin.query_one(&sql, &[]).await.unwrap().get(0);
    assert_eq!(
        held, 0,
        "every key and the membership released when Drain resolved"
    );
    pgcoord_testkit::eventually(Duration::from_secs(4), "b serves all 20", async || {
        assignment(&b).await.keys.len() == 20
    })
    .await;
    assert_eq!(check(&history.lock().unwrap()), 20, "one worker per key");
}

/// Weighted members: a member of weight 3 takes three times the keys of one of weight 1.
#[actix_rt::test]
async fn weighted_members_take_their_weights_part() {
    let (setup, _admin) = Setup::new(Duration::from_secs(2), Duration::from_millis(400)).await;
    let keys: Vec<String> = (0..40).map(|i| format!("k{i}")).collect();
    let history = History::default();
    let light = recorded(&setup, "light", "weighted", &keys, &history).start();
    let heavy = recorded(&setup, "heavy", "weighted", &keys, &history)
        .weight(3)
        .start();
    pgcoord_testkit::eventually(Duration::from_secs(8), "10/30", async || {
        assignment(&light).await.keys.len() == 10 && assignment(&heavy).await.keys.len() == 30
    })
    .await;
    assert_eq!(check(&history.lock().unwrap()), 40, "one worker per key");
}

/// A drain asked through the database — a resign request on the member's lease, as `pgcoord
/// ui`'s drain stores it — is found by the member at a round (never on a notification's word):
/// it hands every key over and stops, and the other member serves them all.
#[actix_rt::test]
async fn a_member_asked_to_drain_through_the_database_hands_its_keys_over_and_stops() {
    let (setup, admin) = Setup::new(Duration::from_secs(2), Duration::from_millis(400)).await;
    let keys: Vec<String> = (0..6).map(|i| format!("k{i}")).collect();
    let history = History::default();
    let a = recorded(&setup, "a", "asked", &keys, &history).start();
    let b = recorded(&setup, "b", "asked", &keys, &history).start();
    pgcoord_testkit::eventually(Duration::from_secs(6), "3/3", async || {
        assignment(&a).await.keys.len() == 3 && assignment(&b).await.keys.len() == 3
    })
    .await;
    let table = pgcoord::LeaseTable::new(&setup.builder("operator").build().unwrap());
    let asked = table
        .request_resign(&admin, "asked/members/a", "operator")
        .await
        .unwrap();
    assert!(asked.is_some(), "a is a member");
    let started = Instant::now();
    // Looked for every fourth round (a round is a quarter lease): within about a lease, then
    // three keys handed over.
    pgcoord_testkit::eventually(Duration::from_secs(10), "a stopped", async || {
        !a.connected()
    })
    .await;
    eprintln!("drained after {:?}", started.elapsed());
    let sql = format!(
        "SELECT count(*) FROM {} WHERE owner = 'a' AND name LIKE 'asked/%'",
        setup.quoted_table()
    );
    pgcoord_testkit::eventually(Duration::from_secs(4), "a holds nothing", async || {
        admin.query_one(&sql, &[]).await.unwrap().get::<_, i64>(0) == 0
    })
    .await;
    pgcoord_testkit::eventually(Duration::from_secs(4), "b serves all 6", async || {
        assignment(&b).await.keys.len() == 6
    })
    .await;
    assert_eq!(check(&history.lock().unwrap()), 6, "one worker per key");
}
