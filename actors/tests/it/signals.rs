//! Signals through the ListenerActor: publish/subscribe, request/reply, payload sizes and the
//! store, reconnection after real faults, garbage, slow subscribers, panicking handlers.

use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use pgcoord::ErrorKind;
use pgcoord::payload::{PayloadStore, PayloadTable};
use pgcoord::signal::{Envelope, Kind, NOTIFY_LIMIT};
use pgcoord_actors::Ask;
use pgcoord_actors::*;
use pgcoord_testkit::unique_name;

use super::{Collector, Setup};

pub(super) const FAST: Duration = Duration::from_millis(200);

pub(super) async fn setup() -> (Setup, tokio_postgres::Client) {
    Setup::new(Duration::from_secs(10), Duration::from_secs(2)).await
}

pub(super) fn config(
    setup: &Setup,
    pg: &tokio_postgres::Config,
    inline_limit: usize,
) -> pgcoord::Config {
    setup
        .builder("signals")
        .pg_config(pg)
        .ping_interval(FAST)
        .ping_timeout(FAST)
        .inline_limit(inline_limit)
        .build()
        .unwrap()
}

pub(super) fn store(config: &pgcoord::Config) -> Arc<PayloadTable> {
    Arc::new(PayloadTable::new(config, pgcoord::Pool::new(config)))
}

/// A started listener on `pg` with the payload table as its store.
pub(super) fn listener_on(
    setup: &Setup,
    pg: &tokio_postgres::Config,
    inline_limit: usize,
) -> Addr<ListenerActor> {
    let config = config(setup, pg, inline_limit);
    // Through the store's actor, as a Coordinator wires it.
    let store = PayloadStoreActor::for_table((*store(&config)).clone(), &config).start();
    ListenerActor::new(config, Some(PayloadStoreActor::store(store))).start_supervised()
}

pub(super) fn listener(setup: &Setup) -> Addr<ListenerActor> {
    listener_on(setup, &setup.pg, 4096)
}

pub(super) async fn subscribe(listener: &Addr<ListenerActor>, channel: &str) -> Collector<Signal> {
    let (collector, recipient) = Collector::start_new();
    listener
        .send(Subscribe::new(channel, recipient))
        .await
        .unwrap()
        .unwrap();
    collector
}

async fn stored_rows(admin: &tokio_postgres::Client, setup: &Setup) -> i64 {
    let sql = format!("SELECT count(*) FROM \"{}_p\"", setup.table);
    admin.query_one(&sql, &[]).await.unwrap().get(0)
}

#[actix_rt::test]
async fn a_publish_reaches_subscribers_in_two_runtimes() {
    let (setup, _) = setup().await;
    let channel = unique_name("events");
    // A second actix System on its own thread, as a second process would be.
    let (tx, rx) = std::sync::mpsc::channel();
    let (other_setup, other_channel) = (setup.clone(), channel.clone());
    let other = std::thread::spawn(move || {
        System::new().block_on(async move {
            let listener = listener(&other_setup);
            let collector = subscribe(&listener, &other_channel).await;
            tx.send(()).unwrap();
            collector.wait_for(1, Duration::from_secs(10)).await
        })
    });
    let here = listener(&setup);
    let local = subscribe(&here, &channel).await;
    rx.recv_timeout(Duration::from_secs(10)).unwrap();
    here.send(Publish::value(&channel, "hello").unwrap())
        .await
        .unwrap()
        .unwrap();
    let received = local.wait_for(1, Duration::from_secs(5)).await;
    assert_eq!(received[0].value::<String>().unwrap(), "hello");
    let remote = other.join().unwrap();
    assert_eq!(remote[0].value::<String>().unwrap(), "hello");
    assert_eq!(&*remote[0].channel, channel.as_str());
}

#[actix_rt::test]
async fn any_channel_name_notify_takes_is_usable_and_quoting_holds() {
    let (setup, admin) = setup().await;
    let here = listener(&setup);
    let suffix = unique_name("");
    // Dots, dashes, spaces, mixed case, and quotes made to break out of the quoting.
    let names = [
        format!("orders.created{suffix}"),
        format!("bad-channel{suffix}"),
        format!("Mixed Case{suffix}"),
        format!("q\"; DROP TABLE \"{}\"; --{suffix}", setup.table),
    ];
    for name in &names {
        let got = subscribe(&here, name).await;
        here.send(Publish::value(name, name).unwrap())
            .await
            .unwrap()
            .unwrap();
        let received = got.wait_for(1, Duration::from_secs(5)).await;
        assert_eq!(&*received[0].channel, name.as_str());
        assert_eq!(&received[0].value::<String>().unwrap(), name);
    }
    // Nothing broke out: the lock table is still there.
    let sql = format!("SELECT count(*) FROM \"{}\"", setup.table);
    admin.query_one(&sql, &[]).await.unwrap();
    // What NOTIFY cannot take is refused, typed.
    for bad in [String::new(), "x".repeat(64), "nul\0inside".to_owned()] {
        let (_, recipient) = Collector::<Signal>::start_new();
        let refused = here
            .send(Subscribe::new(bad.clone(), recipient))
            .await
            .unwrap();
        let kind = refused.err().map(|e| e.kind());
        assert_eq!(kind, Some(pgcoord::ErrorKind::InvalidIdentifier), "{bad:?}");
    }
}

#[actix_rt::test]
async fn typed_request_reply_and_remote_errors() {
    #[derive(serde::Serialize, serde::Deserialize)]
    struct Add {
        a: i64,
        b: i64,
    }
    let (setup, _) = setup().await;
    let (server, client) = (listener(&setup), listener(&setup));
    let channel = unique_name("adder");
    let serve = Serve::typed(&channel, |add: Add| async move {
        if add.b == 0 {
            Err("b must not be zero")
        } else {
            Ok(add.a + add.b)
        }
    });
    server.send(serve).await.unwrap().unwrap();
    let reply = client
        .send(Ask::value(&channel, &Add { a: 40, b: 2 }).unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(pgcoord::signal::from_payload::<i64>(&reply).unwrap(), 42);
    // Decoded by the coordinator, on its own listener.
    let coordinator = Coordinator::start(setup.builder("typed").build().unwrap());
    let sum: i64 = coordinator
        .ask_returning(Ask::value(&channel, &Add { a: 1, b: 2 }).unwrap())
        .await
        .unwrap();
    assert_eq!(sum, 3);
    let err = coordinator
        .ask_returning::<i64>(Ask::value(&channel, &Add { a: 1, b: 0 }).unwrap())
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Remote);
    assert!(err.to_string().contains("b must not be zero"), "{err}");
}

#[actix_rt::test]
async fn without_a_handler_the_deadline_ends_the_request_and_nothing_leaks() {
    let (setup, _) = setup().await;
    let client = listener(&setup);
    let started = Instant::now();
    let err = client
        .send(Ask::new(unique_name("nobody"), b"hi".to_vec()).timeout(Duration::from_millis(300)))
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Timeout);
    assert!(started.elapsed() < Duration::from_secs(2));
    // A caller that gives up through actix's timeout is forgotten too.
    let gave_up = client
        .send(Ask::new(unique_name("nobody"), b"hi".to_vec()))
        .timeout(FAST)
        .await;
    assert!(matches!(gave_up, Err(MailboxError::Timeout)));
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        client.send(GetStats::new()).await.unwrap().pending_requests,
        0
    );
}

#[actix_rt::test]
async fn with_two_handlers_exactly_one_reply_is_used() {
    let (setup, _) = setup().await;
    let (first, second, client) = (listener(&setup), listener(&setup), listener(&setup));
    let channel = unique_name("twice");
    for (server, name) in [(&first, "first"), (&second, "second")] {
        let serve = Serve::new(
            &channel,
            move |_| async move { Ok(name.as_bytes().to_vec()) },
        );
        server.send(serve).await.unwrap().unwrap();
    }
    let reply = client
        .send(Ask::new(&channel, b"who".to_vec()))
        .await
        .unwrap()
        .unwrap();
    assert!(reply == b"first" || reply == b"second");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let stats = client.send(GetStats::new()).await.unwrap();
    assert_eq!(
        (stats.unmatched_replies, stats.pending_requests),
        (1, 0),
        "the second reply was dropped"
    );
}

#[actix_rt::test]
async fn a_thousand_concurrent_requests_are_all_correlated() {
    let (setup, _) = setup().await;
    let (server, client) = (listener(&setup), listener(&setup));
    let channel = unique_name("echo");
    server
        .send(Serve::new(&channel, |p| async move { Ok(p) }))
        .await
        .unwrap()
        .unwrap();
    let requests: Vec<_> = (0..1000u32)
        .map(|i| {
            client
                .send(Ask::new(&channel, i.to_be_bytes().to_vec()).timeout(Duration::from_secs(30)))
        })
        .collect();
    for (i, request) in requests.into_iter().enumerate() {
        assert_eq!(request.await.unwrap().unwrap(), (i as u32).to_be_bytes());
    }
}

/// A MessagePack string payload, with multi-byte UTF-8, whose event envelope encodes to exactly
/// `target` bytes.
fn payload_for(target: usize) -> Vec<u8> {
    for ascii in 0..NOTIFY_LIMIT {
        let text = format!("żółw ✓ {}", "x".repeat(ascii));
        let payload = pgcoord::signal::to_payload(&text).unwrap();
        let len = Envelope::new(Kind::Event, payload.clone())
            .encoded_len()
            .unwrap();
        if len == target {
            return payload;
        }
    }
    panic!("no payload encodes to {target} bytes")
}

#[actix_rt::test]
async fn envelopes_at_the_notify_limit_go_inline_or_through_the_store_intact() {
    let (setup, admin) = setup().await;
    // A high inline limit, so the encoded size alone decides.
    let listener = listener_on(&setup, &setup.pg, 100_000);
    let channel = unique_name("limit");
    let collector = subscribe(&listener, &channel).await;
    for (target, stored) in [
        (NOTIFY_LIMIT - 1, false),
        (NOTIFY_LIMIT, true),
        (NOTIFY_LIMIT + 1, true),
    ] {
        let payload = payload_for(target);
        let before = stored_rows(&admin, &setup).await;
        let n = collector.received().len() + 1;
        listener
            .send(Publish::new(&channel, payload.clone()))
            .await
            .unwrap()
            .unwrap();
        let received = collector.wait_for(n, Duration::from_secs(5)).await;
        assert_eq!(
            received[n - 1].payload,
            payload,
            "{target} bytes arrive intact"
        );
        let went_to_store = stored_rows(&admin, &setup).await > before;
        assert_eq!(went_to_store, stored, "{target}-byte envelope");
    }
}

#[actix_rt::test]
async fn oversize_payloads_without_a_store_are_refused_before_sending() {
    let (setup, _) = setup().await;
    let config = config(&setup, &setup.pg, 4096);
    let listener = ListenerActor::new(config, None).start_supervised();
    let err = listener
        .send(Publish::new(unique_name("big"), vec![7u8; 5000]))
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::PayloadTooLarge);
}

#[actix_rt::test]
async fn a_one_mebibyte_round_trip_goes_through_the_store() {
    let (setup, admin) = setup().await;
    let (server, client) = (listener(&setup), listener(&setup));
    let channel = unique_name("big");
    server
        .send(Serve::new(&channel, |mut p: Vec<u8>| async move {
            p.reverse();
            Ok(p)
        }))
        .await
        .unwrap()
        .unwrap();
    let payload: Vec<u8> = (0..1 << 20).map(|i: u32| (i % 251) as u8).collect();
    let reply = client
        .send(Ask::new(&channel, payload.clone()).timeout(Duration::from_secs(30)))
        .await
        .unwrap()
        .unwrap();
    let mut expected = payload;
    expected.reverse();
    assert!(reply == expected, "1 MiB arrives reversed and intact");
    assert_eq!(
        stored_rows(&admin, &setup).await,
        2,
        "request and reply both stored"
    );
}

#[actix_rt::test]
async fn a_missing_store_row_is_a_typed_error() {
    let (setup, admin) = setup().await;
    let config = config(&setup, &setup.pg, 4096);
    let table = store(&config);
    let key = table.put(b"soon gone".to_vec()).await.unwrap();
    assert_eq!(table.get(&key).await.unwrap(), b"soon gone");
    admin
        .execute(&format!("DELETE FROM \"{}_p\"", setup.table), &[])
        .await
        .unwrap();
    assert_eq!(
        table.get(&key).await.unwrap_err().kind(),
        ErrorKind::NotFound
    );
    assert_eq!(
        table.get("not-a-key").await.unwrap_err().kind(),
        ErrorKind::NotFound
    );
    let actor = PayloadStoreActor::new(table.clone(), 1)
        .expiring((*table).clone(), Duration::from_secs(3600))
        .start();
    // Expired rows are deleted by delete_expired.
    let short = setup
        .builder("x")
        .payload_table(format!("{}_p", setup.table))
        .payload_ttl(Duration::from_millis(1))
        .build()
        .unwrap();
    let short = PayloadTable::new(&short, pgcoord::Pool::new(&short));
    let key = short.put(b"x".to_vec()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(
        short.get(&key).await.unwrap_err().kind(),
        ErrorKind::NotFound
    );
    assert_eq!(actor.send(RunNow).await.unwrap().unwrap(), 1);
}

#[actix_rt::test]
async fn a_subscriber_gets_what_is_published_and_bad_channel_names_are_refused() {
    let (setup, _) = setup().await;
    let listener = listener(&setup);
    let channel = unique_name("once");
    let (heard, recipient) = Collector::<Signal>::start_new();
    let subscribe = Subscribe::new(channel.clone(), recipient);
    listener.send(subscribe).await.unwrap().unwrap();
    let publish = Publish::new(&channel, b"first".to_vec());
    listener.send(publish).await.unwrap().unwrap();
    let got = heard.wait_for(1, Duration::from_secs(5)).await;
    assert_eq!(got[0].payload[..], *b"first");
    // Names NOTIFY cannot take; anything else is quoted (see any_channel_name_…).
    for bad in ["", "nul\0inside", &"c".repeat(64)] {
        let err = listener
            .send(Publish::new(bad, b"x".to_vec()))
            .await
            .unwrap()
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidIdentifier, "{bad:?}");
        let (_, recipient) = Collector::<Signal>::start_new();
        let err = listener
            .send(Subscribe::new(bad, recipient))
            .await
            .unwrap()
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidIdentifier);
    }
}

/// Messages whose payload went through the store are fetched on their own, but reach
/// subscribers in the order they were published, mixed with inline ones.
#[actix_rt::test]
async fn stored_and_inline_messages_arrive_in_publish_order() {
    let (setup, _) = setup().await;
    let (publisher, listener) = (listener(&setup), listener(&setup));
    let channel = unique_name("mixed");
    let events = subscribe(&listener, &channel).await;
    let sizes: Vec<usize> = (0..40).map(|i| if i % 3 == 0 { 6000 } else { 1 }).collect();
    for (i, &size) in sizes.iter().enumerate() {
        let mut payload = vec![0u8; size];
        payload[0] = i as u8;
        publisher
            .send(Publish::new(&channel, payload))
            .await
            .unwrap()
            .unwrap();
    }
    let got = events.wait_for(sizes.len(), Duration::from_secs(10)).await;
    let order: Vec<(u8, usize)> = got
        .iter()
        .map(|s| (s.payload[0], s.payload.len()))
        .collect();
    let expected: Vec<(u8, usize)> = sizes
        .iter()
        .enumerate()
        .map(|(i, &n)| (i as u8, n))
        .collect();
    assert_eq!(order, expected);
}

/// A payload store that counts the fetches running at once, and makes each take 20 ms.
struct Counting {
    inner: Arc<PayloadTable>,
    now: std::sync::atomic::AtomicUsize,
    most: std::sync::atomic::AtomicUsize,
}

impl pgcoord::payload::PayloadStore for Counting {
    fn put(&self, payload: Vec<u8>) -> pgcoord::BoxFuture<'_, pgcoord::Result<String>> {
        self.inner.put(payload)
    }

    fn get<'a>(&'a self, key: &'a str) -> pgcoord::BoxFuture<'a, pgcoord::Result<Vec<u8>>> {
        use std::sync::atomic::Ordering::SeqCst;
        Box::pin(async move {
            let now = self.now.fetch_add(1, SeqCst) + 1;
            self.most.fetch_max(now, SeqCst);
            tokio::time::sleep(Duration::from_millis(20)).await;
            let got = self.inner.get(key).await;
            self.now.fetch_sub(1, SeqCst);
            got
        })
    }
}

/// A burst of stored messages is fetched through the store's actor at most its bound at a time
/// (here 2), in order, all delivered.
#[actix_rt::test]
async fn a_burst_of_stored_messages_is_fetched_a_bounded_number_at_a_time() {
    let (setup, _) = setup().await;
    let publisher = listener(&setup);
    let config = setup
        .builder("signals")
        .ping_interval(FAST)
        .ping_timeout(FAST)
        .build()
        .unwrap();
    let counting = Arc::new(Counting {
        inner: store(&config),
        now: Default::default(),
        most: Default::default(),
    });
    let payloads = PayloadStoreActor::new(counting.clone(), 2).start();
    let listener =
        ListenerActor::new(config, Some(PayloadStoreActor::store(payloads))).start_supervised();
    let channel = unique_name("burst");
    let events = subscribe(&listener, &channel).await;
    for i in 0..30u8 {
        let mut payload = vec![0u8; 6000];
        payload[0] = i;
        publisher
            .send(Publish::new(&channel, payload))
            .await
            .unwrap()
            .unwrap();
    }
    let got = events.wait_for(30, Duration::from_secs(20)).await;
    let order: Vec<u8> = got.iter().map(|s| s.payload[0]).collect();
    assert_eq!(order, (0..30).collect::<Vec<u8>>());
    let most = counting.most.load(std::sync::atomic::Ordering::SeqCst);
    assert_eq!(most, 2, "fetches at once");
}
