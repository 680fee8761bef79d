//! The runtime on a thread of its own, used from a plain tokio runtime as an axum or tonic
//! service would: no actix System in the test's own threads.

use std::time::Duration;

use pgcoord_actors::*;
use pgcoord_testkit::unique_name;

use super::Setup;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tokio_service_holds_leases_and_exchanges_messages_through_the_threaded_runtime() {
    // A long lease: the shutdown's release, not an expiry, frees it.
    let (setup, admin) = Setup::new(Duration::from_secs(60), Duration::from_secs(10)).await;
    let runtime = Runtime::connect(setup.builder("tokio").build().unwrap())
        .await
        .unwrap();
    let coordinator = runtime.coordinator().clone();
    let name = unique_name("threaded");
    let channel = unique_name("threaded");
    let mut messages = runtime.subscribe(&channel).await.unwrap();

    // Acquired on one tokio task, held and checked on another: the lease is Send.
    let lease = tokio::spawn({
        let name = name.clone();
        async move { coordinator.acquire(Acquire::new(name)).await }
    })
    .await
    .unwrap()
    .unwrap();
    let row = holder(&admin, &setup, &name)
        .await
        .expect("the lease's row");
    assert_eq!(row.get::<_, String>(0), "tokio");
    assert_eq!(row.get::<_, i64>(1), lease.token());
    let checked = tokio::spawn(async move {
        assert_eq!(lease.loss(), None);
        lease
    })
    .await
    .unwrap();
    checked
        .fence(&admin)
        .await
        .expect("its token fences writes");

    // A message published from the tokio side comes back through the subscription's stream.
    let publish = Publish::value(&channel, &42u32).unwrap();
    runtime
        .coordinator()
        .signals()
        .unwrap()
        .call(publish)
        .await
        .unwrap();
    let signal = match tokio::time::timeout(Duration::from_secs(10), messages.next())
        .await
        .expect("the message within 10 s")
        .expect("the runtime is running")
    {
        Heard::Signal(signal) => signal,
        other => panic!("a message, not {other:?}"),
    };
    assert_eq!(signal.value::<u32>().unwrap(), 42);

    // The graceful stop releases the lease on the server at once and ends the thread.
    drop(messages);
    let released = runtime.shutdown(Duration::from_secs(5)).await.unwrap();
    assert_eq!(released, 1);
    assert!(
        holder(&admin, &setup, &name).await.is_none(),
        "the row is gone at once"
    );
    assert_eq!(checked.loss(), Some(LossReason::Shutdown));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_answers_within_its_bound_while_a_handler_blocks_the_runtimes_thread() {
    let (setup, _admin) = Setup::new(Duration::from_secs(10), Duration::from_secs(2)).await;
    let runtime = Runtime::connect(setup.builder("blocked").build().unwrap())
        .await
        .unwrap();
    let topic = unique_name("blocked");
    let (entered, mut blocking) = tokio::sync::mpsc::unbounded_channel();
    // A handler that blocks the thread it runs on (a mistake, but one users make).
    let consume = Consume::new(topic.clone(), "c", move |_| {
        let _ = entered.send(());
        std::thread::sleep(Duration::from_secs(4));
        async { Ok(()) }
    });
    runtime.coordinator().consume(consume).unwrap();
    runtime.coordinator().append(&topic, b"x").await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), blocking.recv())
        .await
        .expect("the handler runs");
    let started = std::time::Instant::now();
    let stopped = runtime.shutdown(Duration::from_millis(500)).await;
    let took = started.elapsed();
    assert_eq!(stopped.unwrap_err().kind(), pgcoord::ErrorKind::Timeout);
    assert!(
        took < Duration::from_millis(1500),
        "answered after {took:?}"
    );
}

#[tokio::test]
async fn a_threaded_runtime_that_cannot_start_says_why() {
    let (setup, _admin) = Setup::new(Duration::from_secs(20), Duration::from_secs(5)).await;
    let missing = setup
        .builder("tokio")
        .lock_table(unique_name("missing"))
        .build()
        .unwrap();
    let error = Runtime::connect(missing).await.expect_err("refused");
    assert_eq!(error.kind(), pgcoord::ErrorKind::NotFound, "{error}");
    assert!(error.to_string().contains("does not exist"), "{error}");
}

/// Under a plain tokio runtime there is no actix System to start actors on: `Coordinator::connect`
/// says so, naming the door that works there, instead of panicking.
#[tokio::test]
async fn coordinator_connect_outside_an_actix_system_names_runtime() {
    let (setup, _admin) = Setup::new(Duration::from_secs(20), Duration::from_secs(5)).await;
    let config = setup.builder("tokio").build().unwrap();
    let pool = pgcoord::Pool::new(&config);
    for error in [
        Coordinator::connect(config.clone()).await.err(),
        Coordinator::connect_with_pool(config, pool).await.err(),
    ] {
        let error = error.expect("refused");
        assert_eq!(error.kind(), pgcoord::ErrorKind::Unsupported, "{error}");
        assert!(error.to_string().contains("Runtime"), "{error}");
    }
}

/// The lease's row: its owner and token, if it is there.
async fn holder(
    admin: &tokio_postgres::Client,
    setup: &Setup,
    name: &str,
) -> Option<tokio_postgres::Row> {
    let sql = format!(
        "SELECT owner, token FROM {} WHERE name = $1",
        setup.quoted_table()
    );
    admin.query_opt(&sql, &[&name]).await.unwrap()
}
