//! What someone who can connect does with NOTIFY and LISTEN alone: forged probes, forged
//! payload-store references, forged "not here" answers and doorbell floods. Each must cost a
//! bounded amount and never hide a fault, drop a message silently, or handle one twice.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use actix::prelude::*;
use pgcoord::payload::{PayloadStore, PayloadTable};
use pgcoord::signal::{Body, Envelope, Kind};
use pgcoord_actors::*;
use pgcoord_testkit::unique_name;

use super::{Collector, Setup};

/// A listener whose session cannot hear its own probes stays found deaf — replaced again and
/// again, never said to be listening — while an adversary NOTIFYs forged probes to it: the
/// largest number there is, and probes the listener really sent, heard by LISTENing where
/// they go and replayed later.
#[actix_rt::test]
async fn forged_and_replayed_probes_do_not_hide_a_deaf_listener() {
    let (setup, admin) = Setup::new(Duration::from_secs(10), Duration::from_secs(2)).await;
    // Deaf: its session is in another database than the one its pool sends probes in (a
    // NOTIFY reaches only its own database), where anyone can still NOTIFY it.
    let other = unique_name("deaf");
    (admin.batch_execute(&format!("CREATE DATABASE \"{other}\"")))
        .await
        .unwrap();
    let mut session = setup.pg.clone();
    session.dbname(&other);
    let config = (setup.builder("deaf"))
        .session_pg_config(&session)
        .ping_interval(Duration::from_millis(100))
        .ping_timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let listener = ListenerActor::new(config, None);
    let reply = listener.reply_channel().clone();
    let listener = listener.start_supervised();

    // The adversary hears the real probes where they are sent, and NOTIFYs the deaf session.
    let ears = setup.builder("ears").build().unwrap();
    let (_ears, mut heard) = super::listen_on(&ears, &[&reply]).await;
    let mouth = setup
        .builder("mouth")
        .session_pg_config(&session)
        .build()
        .unwrap();
    let (mouth, _) = super::listen_on(&mouth, &[]).await;
    let forging = tokio::spawn(async move {
        let mut seen: Vec<(Instant, String)> = Vec::new();
        loop {
            while let Ok(text) = heard.try_recv() {
                let payload = text.split_once(": ").unwrap().1.to_owned();
                seen.push((Instant::now(), payload));
            }
            let mut forged = vec![format!("pgcoord-probe {}", u64::MAX)];
            // Replays of probes heard long enough ago that none is still awaited (a probe is
            // awaited for about a second here): a replay proves nothing then.
            let old = seen
                .iter()
                .filter(|(at, _)| at.elapsed() > Duration::from_secs(3));
            forged.extend(old.map(|(_, p)| p.clone()));
            for text in forged {
                mouth
                    .execute("SELECT pg_notify($1, $2)", &[&reply.as_str(), &text])
                    .await
                    .unwrap();
            }
            // Slower than the ping timeout: the forgeries alone do not keep a probe waiting.
            tokio::time::sleep(Duration::from_millis(400)).await;
        }
    });

    // While it goes on, the listener keeps being replaced and never says it listens.
    let stats = async || listener.send(GetStats::new()).await.unwrap();
    let started = stats().await.connections;
    let deadline = Instant::now() + Duration::from_secs(8);
    while Instant::now() < deadline {
        let now = stats().await;
        assert!(!now.listening, "said to listen: {now:?}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let replaced = stats().await.connections - started;
    forging.abort();
    // About one every second here (found deaf, then the backoff); a stuck one makes none.
    assert!(replaced >= 3, "replaced {replaced} times in 8 s");
}

/// A payload store that counts how it is read: one key at a time, or in batches (each one
/// statement for the payload table).
struct Reads {
    inner: Arc<PayloadTable>,
    gets: AtomicU64,
    batches: AtomicU64,
}

impl PayloadStore for Reads {
    fn put(&self, payload: Vec<u8>) -> pgcoord::BoxFuture<'_, pgcoord::Result<String>> {
        self.inner.put(payload)
    }

    fn get<'a>(&'a self, key: &'a str) -> pgcoord::BoxFuture<'a, pgcoord::Result<Vec<u8>>> {
        self.gets.fetch_add(1, Ordering::Relaxed);
        self.inner.get(key)
    }

    fn get_many<'a>(
        &'a self,
        keys: &'a [String],
    ) -> pgcoord::BoxFuture<'a, Vec<pgcoord::Result<Vec<u8>>>> {
        self.batches.fetch_add(1, Ordering::Relaxed);
        self.inner.get_many(keys)
    }
}

/// A random key shaped like the store's (a UUID), pointing at no row.
fn forged_key() -> String {
    let (a, b) = (pgcoord::signal::new_id(), pgcoord::signal::new_id());
    format!(
        "{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
        a >> 32,
        (a >> 16) & 0xffff,
        a & 0xffff,
        b >> 48,
        b & 0xffff_ffff_ffff
    )
}

/// A flood of references to payloads that are in no store, on a subscribed channel: each is
/// counted, fetched in batches (a few statements for thousands), warned about at a bounded
/// rate and announced in a few coalesced `MessageLost`s that add up to all of them — none
/// silently dropped — and the valid message sent after them is delivered once they are read.
#[actix_rt::test]
async fn a_flood_of_forged_payload_references_costs_a_few_statements_and_announcements() {
    let (setup, admin) = Setup::new(Duration::from_secs(10), Duration::from_secs(2)).await;
    let (log, _guard) = super::capture_warnings();
    let config = setup.builder("flooded").build().unwrap();
    let reads = Arc::new(Reads {
        inner: Arc::new(PayloadTable::new(&config, pgcoord::Pool::new(&config))),
        gets: AtomicU64::new(0),
        batches: AtomicU64::new(0),
    });
    let store = PayloadStoreActor::new(reads.clone(), 2).start();
    let listener =
        ListenerActor::new(config, Some(PayloadStoreActor::store(store))).start_supervised();
    let (states, recipient) = Collector::<ConnState>::start_new();
    listener.send(SubscribeConnState(recipient)).await.unwrap();
    let channel = unique_name("flooded");
    let (events, recipient) = Collector::<Signal>::start_new();
    (listener.send(Subscribe::new(&channel, recipient)))
        .await
        .unwrap()
        .unwrap();

    const FORGED: usize = 5_000;
    let texts: Vec<String> = (0..FORGED)
        .map(|_| {
            let mut envelope = Envelope::new(Kind::Event, Vec::new());
            envelope.body = Body::Stored(forged_key());
            envelope.encode().unwrap()
        })
        .collect();
    let flood = Instant::now();
    admin
        .execute(
            "SELECT count(pg_notify($1, t)) FROM unnest($2::text[]) AS t",
            &[&channel, &texts],
        )
        .await
        .unwrap();
    (listener.send(Publish::new(&channel, b"valid".to_vec())))
        .await
        .unwrap()
        .unwrap();
    // After the flood, in order: 50 statements of 100 keys, 4 at a time, take well under this.
    let got = events.wait_for(1, Duration::from_secs(10)).await;
    let took = flood.elapsed();
    assert_eq!(got[0].payload[..], *b"valid");
    assert!(took < Duration::from_secs(5), "delivered after {took:?}");
    let stats = listener.send(GetStats::new()).await.unwrap();
    assert_eq!(stats.undeliverable, FORGED as u64);
    // Fetched in batches: far fewer statements than references.
    let batches = reads.batches.load(Ordering::Relaxed);
    assert_eq!(reads.gets.load(Ordering::Relaxed), 0);
    assert!(batches <= (FORGED / 10) as u64, "{batches} fetches");

    // Announced at once, then once a second at most for what was lost meanwhile: every loss
    // is in some announcement, the last one after the last loss.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let lost: Vec<String> = (states.received().into_iter())
        .filter_map(|s| match s {
            ConnState::MessageLost { channel: on, error } if on == channel => Some(error),
            _ => None,
        })
        .collect();
    let announced: u64 = (lost.iter())
        .map(|e| match e.split_once(" more lost") {
            Some((n, _)) => n.parse::<u64>().unwrap(),
            None => 1,
        })
        .sum();
    assert_eq!(announced, FORGED as u64, "{lost:?}");
    let seconds = took.as_secs() + 1;
    assert!(
        lost.len() as u64 <= 1 + seconds,
        "{} announcements",
        lost.len()
    );
    // As garbage is: at the first and every power of two, 13 lines for 5,000.
    assert_eq!(log.lines_containing("cannot fetch a stored payload"), 13);
}

/// The payload table reads many keys in one statement, whatever the keys: found, missing, not
/// even UUIDs (which must not fail the others), or in capitals.
#[actix_rt::test]
async fn the_payload_table_reads_many_keys_at_once_whatever_they_are() {
    let (setup, _admin) = Setup::new(Duration::from_secs(10), Duration::from_secs(2)).await;
    let config = setup.builder("many").build().unwrap();
    let table = PayloadTable::new(&config, pgcoord::Pool::new(&config));
    let (one, two) = (
        table.put(b"one".to_vec()).await.unwrap(),
        table.put(b"two".to_vec()).await.unwrap(),
    );
    let keys = [
        one,
        "not-a-key".to_owned(),
        "-".repeat(36),
        forged_key(),
        two.to_ascii_uppercase(),
    ];
    let found = table.get_many(&keys).await;
    assert_eq!(found.len(), keys.len());
    assert_eq!(found[0].as_deref().unwrap(), b"one");
    for missing in &found[1..4] {
        let kind = missing.as_ref().unwrap_err().kind();
        assert_eq!(kind, pgcoord::ErrorKind::NotFound);
    }
    assert_eq!(found[4].as_deref().unwrap(), b"two");
}

/// Takes 400 ms over each routed message (a number), counting how often it handled each.
struct Sluggish {
    handled: Arc<Mutex<HashMap<u64, u32>>>,
}

impl Actor for Sluggish {
    type Context = Context<Self>;
}

impl Handler<Shutdown> for Sluggish {
    type Result = ();
    fn handle(&mut self, _: Shutdown, ctx: &mut Context<Self>) {
        ctx.stop();
    }
}

impl Handler<Routed> for Sluggish {
    type Result = ResponseFuture<Result<Vec<u8>, String>>;
    fn handle(&mut self, routed: Routed, _: &mut Context<Self>) -> Self::Result {
        let handled = self.handled.clone();
        Box::pin(async move {
            let n: u64 = routed.value().map_err(|e| e.to_string())?;
            *handled.lock().unwrap().entry(n).or_default() += 1;
            tokio::time::sleep(Duration::from_millis(400)).await;
            pgcoord::signal::to_payload(&(n * 10)).map_err(|e| e.to_string())
        })
    }
}

/// An adversary LISTENs on a routed pool member's channel, and for each request it sees
/// NOTIFYs a forged "not here" to the request's reply channel while the worker (400 ms) has
/// it: the router sends again, but the member does not deliver it again — each message, asked
/// or told, is handled exactly once, and a call that answers answers with the worker's answer.
#[actix_rt::test]
async fn a_forged_not_here_does_not_get_a_routed_message_handled_twice() {
    let (setup, _admin) = Setup::new(Duration::from_secs(10), Duration::from_secs(2)).await;
    let config = setup.builder("member").build().unwrap();
    let locks = LockManager::new(config.clone()).start();
    let handled: Arc<Mutex<HashMap<u64, u32>>> = Arc::default();
    let counts = handled.clone();
    let factory = move |_: WorkerKey| Sluggish {
        handled: counts.clone(),
    };
    let pool = WorkerPool::new(&config, locks.clone(), "routed", vec!["k".into()], factory)
        .routed(ListenerActor::new(config.clone(), None).start_supervised())
        .start();
    pgcoord_testkit::eventually(Duration::from_secs(10), "the key held", async || {
        !pool.send(GetStats::new()).await.unwrap().keys.is_empty()
    })
    .await;
    let sender = setup.builder("sender").build().unwrap();
    let router = KeyRouter::new(
        "routed",
        LockManager::new(sender.clone()).start(),
        ListenerActor::new(sender, None).start_supervised(),
    );

    // The member's channel, as anyone can work it out from the names.
    let table = config.lock_table().quoted();
    let scope = format!("route {}:{table} 6:routed ", table.len());
    let channel = pgcoord::lease::holder_channel(&scope, "member");
    let channel = pgcoord::ident::Ident::channel(&channel).unwrap();
    let (_ears, mut heard) = super::listen_on(&config, &[&channel]).await;
    let (mouth, _) = super::listen_on(&config, &[]).await;
    let forging = tokio::spawn(async move {
        while let Some(text) = heard.recv().await {
            let payload = text.split_once(": ").unwrap().1;
            let Ok(request) = Envelope::decode(payload) else {
                continue;
            };
            let Some(reply_to) = request.reply_to else {
                continue;
            };
            let mut not_here = Envelope::new(Kind::Reply, vec![2]);
            not_here.id = request.id;
            let text = not_here.encode().unwrap();
            mouth
                .execute("SELECT pg_notify($1, $2)", &[&reply_to, &text])
                .await
                .unwrap();
        }
    });

    const ASKS: u64 = 20;
    let asks = (0..ASKS).map(|n| {
        let router = router.clone();
        async move {
            let asked = router.ask_value::<u64, u64>("k", &n, Duration::from_secs(5));
            (n, asked.await)
        }
    });
    let answers = futures_util::future::join_all(asks).await;
    // Tells too: in the mailbox once, whatever the adversary says.
    let tells = (100..100 + ASKS).map(|n| {
        let router = router.clone();
        async move { router.tell_value("k", &n, Duration::from_secs(5)).await }
    });
    for told in futures_util::future::join_all(tells).await {
        if let Err(e) = told {
            assert!(e.to_string().contains("may or may not"), "{e}");
        }
    }
    // Time for the last tells' worker, and for a second delivery if there were one.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    forging.abort();
    let handled = handled.lock().unwrap().clone();
    assert_eq!(handled.len() as u64, 2 * ASKS, "{handled:?}");
    assert!(
        handled.values().all(|&n| n == 1),
        "handled twice: {handled:?}"
    );
    for (n, answer) in answers {
        match answer {
            Ok(answer) => assert_eq!(answer, n * 10),
            // The adversary may win every race for the answer: then the caller is told it
            // may have been handled, which it was, once.
            Err(e) => assert!(e.to_string().contains("may or may not"), "{n}: {e}"),
        }
    }
}

/// A flood of forged doorbells on a topic's channel (anyone can NOTIFY it, with the topic's
/// name) makes a consumer read at most once per 50 ms, not once per doorbell; an event
/// appended after it still arrives.
#[actix_rt::test]
async fn a_flood_of_topic_doorbells_costs_a_read_per_gap() {
    let (setup, admin) = Setup::new(Duration::from_secs(10), Duration::from_secs(2)).await;
    let config = setup.builder("consumer").build().unwrap();
    let table = pgcoord::topic::TopicTable::new(&config);
    let coordinator = Coordinator::connect(config).await.unwrap();
    let seen = Arc::new(AtomicU64::new(0));
    let counted = seen.clone();
    let consume = Consume::new("t", "c", move |_: Delivery| {
        counted.fetch_add(1, Ordering::Relaxed);
        async { Ok(()) }
    })
    // Only the doorbells make it read during the flood.
    .poll(Duration::from_secs(30));
    let consumer = coordinator.consume(consume).unwrap();
    let stats = async || consumer.stats().await.unwrap();
    pgcoord_testkit::eventually(Duration::from_secs(10), "active and read", async || {
        let now = stats().await;
        now.active && now.reads > 0
    })
    .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let reads = async || stats().await.reads;
    let (sent, reads, most) = super::flood(&admin, table.channel(), "t", reads).await;
    assert!(reads <= most, "{reads} reads for {sent} doorbells");

    table.append(&admin, "t", b"real").await.unwrap();
    pgcoord_testkit::eventually(Duration::from_secs(10), "the event handled", async || {
        seen.load(Ordering::Relaxed) == 1
    })
    .await;
}

/// Forged references flooded on another channel of the observer's listener do not make an
/// election observer report again; flooded on the election channel, they make it resync — a
/// couple of times, not once per reference.
#[actix_rt::test]
async fn forged_references_make_an_election_observer_resync_only_for_its_own_channel() {
    let (setup, admin) = Setup::new(Duration::from_secs(10), Duration::from_secs(2)).await;
    let config = setup.builder("watcher").build().unwrap();
    let election_channel = config.election_channel().as_str().to_owned();
    let watcher = Coordinator::start(config);
    let (lost, recipient) = Collector::<ConnState>::start_new();
    watcher
        .signals()
        .unwrap()
        .send(SubscribeConnState(recipient))
        .await
        .unwrap();
    let (observed, recipient) = Collector::<LeaderChanged>::start_new();
    watcher.election("e").unwrap().observe(recipient);
    observed.wait_for(1, Duration::from_secs(5)).await;
    let other = unique_name("other");
    let (_, recipient) = Collector::<Signal>::start_new();
    (watcher
        .signals()
        .unwrap()
        .send(Subscribe::new(&other, recipient)))
    .await
    .unwrap()
    .unwrap();
    let flood = async |channel: &str| {
        let texts: Vec<String> = (0..200)
            .map(|_| {
                let mut envelope = Envelope::new(Kind::Event, Vec::new());
                envelope.body = Body::Stored(forged_key());
                envelope.encode().unwrap()
            })
            .collect();
        admin
            .execute(
                "SELECT count(pg_notify($1, t)) FROM unnest($2::text[]) AS t",
                &[&channel, &texts],
            )
            .await
            .unwrap();
        // Until every loss is announced (at once, then once a second for the rest).
        let announced = async || {
            (lost.received().iter())
                .filter_map(|s| match s {
                    ConnState::MessageLost { channel: on, error } if on == channel => {
                        Some(match error.split_once(" more lost") {
                            Some((n, _)) => n.parse::<u64>().unwrap(),
                            None => 1,
                        })
                    }
                    _ => None,
                })
                .sum::<u64>()
                == 200
        };
        pgcoord_testkit::eventually(Duration::from_secs(10), "every loss announced", announced)
            .await;
    };

    flood(&other).await;
    // Time for any read a loss would have asked for.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(observed.received().len(), 1, "{:?}", observed.received());

    flood(&election_channel).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let reports = observed.received();
    assert!((2..=3).contains(&reports.len()), "{reports:?}");
    assert!(reports.iter().all(|r| r.resync && r.leader.is_none()));
}

/// The tokio door's subscription marks a message its subscriber missed — here a reference to a
/// stored payload that is not there, which anyone can NOTIFY — with a gap for its own channel,
/// and says nothing of another channel's: the stream's reader resyncs exactly when it must.
#[actix_rt::test]
async fn a_subscription_stream_marks_a_lost_message_of_its_channel_as_a_gap() {
    let (setup, admin) = Setup::new(Duration::from_secs(10), Duration::from_secs(2)).await;
    let coordinator = Coordinator::start(setup.builder("reader").build().unwrap());
    let (ours, other) = (unique_name("ours"), unique_name("other"));
    let mut subscription = coordinator.subscribe(&ours).await.unwrap();
    let _other = coordinator.subscribe(&other).await.unwrap();
    let forge = async |channel: &str| {
        let mut envelope = Envelope::new(Kind::Event, Vec::new());
        envelope.body = Body::Stored(forged_key());
        let text = envelope.encode().unwrap();
        admin
            .execute("SELECT pg_notify($1, $2)", &[&channel, &text])
            .await
            .unwrap();
    };
    forge(&other).await;
    forge(&ours).await;
    coordinator
        .signals()
        .unwrap()
        .call(Publish::new(&ours, b"after".to_vec()))
        .await
        .unwrap();
    let mut heard = Vec::new();
    while heard.len() < 2 {
        let next = tokio::time::timeout(Duration::from_secs(10), subscription.next()).await;
        heard.push(
            next.expect("heard within the bound")
                .expect("the stream goes on"),
        );
    }
    match &heard[0] {
        Heard::Gap(ConnState::MessageLost { channel, .. }) => assert_eq!(*channel, ours),
        other => panic!("a gap of our channel first, not {other:?}"),
    }
    assert!(
        matches!(&heard[1], Heard::Signal(signal) if signal.payload.as_ref() == b"after"),
        "{heard:?}"
    );
}
