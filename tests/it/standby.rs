//! Streaming standbys of the throwaway cluster: asynchronous and synchronous replication,
//! promotion, and clients that follow a failover.

use std::time::Instant;

use pgcoord_testkit::TempPostgres;

use super::embedded::client_of;

/// Runs a blocking [`TempPostgres`] call on the blocking pool, off the runtime's threads.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(f).await.expect("blocking task")
}

/// The port of the server `client` is connected to.
async fn server_port(client: &tokio_postgres::Client) -> u16 {
    let port: i32 = client
        .query_one("SELECT inet_server_port()", &[])
        .await
        .unwrap()
        .get(0);
    port as u16
}

/// The rows of the test table `t`, in order.
async fn rows_of(client: &tokio_postgres::Client) -> Vec<i32> {
    client
        .query("SELECT x FROM t ORDER BY x", &[])
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect()
}

/// A client from [`failover_pg_config`](pgcoord_testkit::failover_pg_config) on its own task.
async fn failover_client(
    servers: &[&TempPostgres],
) -> Result<tokio_postgres::Client, tokio_postgres::Error> {
    let (client, conn) = pgcoord_testkit::failover_pg_config(servers)
        .connect(tokio_postgres::NoTls)
        .await?;
    tokio::spawn(conn);
    Ok(client)
}

#[tokio::test]
async fn an_async_standby_follows_and_takes_over_but_may_miss_acknowledged_commits() {
    use pgcoord::ErrorKind;
    use pgcoord_testkit::Replication;
    use std::sync::Arc;
    use tokio_postgres::error::SqlState;

    let primary = Arc::new(
        blocking(TempPostgres::start_primary)
            .await
            .expect("primary"),
    );
    let writer = client_of(&primary, None).await.unwrap();
    let commit: String = writer
        .query_one("SHOW synchronous_commit", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(commit, "on", "start_primary overrides the default");
    writer
        .batch_execute("CREATE TABLE t (x int); INSERT INTO t VALUES (1)")
        .await
        .unwrap();

    let started = Instant::now();
    let standby = Arc::new({
        let primary = primary.clone();
        blocking(move || primary.start_standby(Replication::Asynchronous))
            .await
            .expect("standby")
    });
    eprintln!("async standby streaming in {:?}", started.elapsed());
    assert_eq!(standby.standby_name(), Some("standby1"));
    assert_eq!(primary.standby_name(), None);
    assert_ne!(standby.port(), primary.port());
    assert_ne!(standby.directory(), primary.directory());

    // The primary streams to it asynchronously; it is a read-only copy holding the data so far.
    let row = writer
        .query_one(
            "SELECT state, sync_state FROM pg_stat_replication WHERE application_name = $1",
            &[&"standby1"],
        )
        .await
        .unwrap();
    assert_eq!(
        (row.get::<_, String>(0), row.get::<_, String>(1)),
        ("streaming".to_owned(), "async".to_owned())
    );
    let reader = client_of(&standby, None).await.unwrap();
    let recovering: bool = reader
        .query_one("SELECT pg_is_in_recovery()", &[])
        .await
        .unwrap()
        .get(0);
    assert!(recovering);
    assert_eq!(rows_of(&reader).await, vec![1]);
    let err = reader
        .execute("INSERT INTO t VALUES (0)", &[])
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some(&SqlState::READ_ONLY_SQL_TRANSACTION));

    // A row committed on the primary shows up on the standby shortly after.
    writer
        .execute("INSERT INTO t VALUES (2)", &[])
        .await
        .unwrap();
    blocking({
        let (primary, standby) = (primary.clone(), standby.clone());
        move || primary.wait_replayed(&standby)
    })
    .await
    .expect("replayed");
    assert_eq!(rows_of(&reader).await, vec![1, 2], "visible once replayed");
    let err = blocking({
        let primary = primary.clone();
        move || primary.wait_replayed(&primary)
    })
    .await
    .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{err}");

    // Failover clients reach the primary while it runs.
    let client = failover_client(&[&primary, &standby]).await.unwrap();
    assert_eq!(server_port(&client).await, primary.port());

    // Asynchronous: the primary acknowledges a commit the standby does not have (here it is
    // down), and then fails.
    drop(reader);
    blocking({
        let standby = standby.clone();
        move || standby.stop()
    })
    .await
    .unwrap();
    writer
        .execute("INSERT INTO t VALUES (3)", &[])
        .await
        .unwrap();
    blocking({
        let primary = primary.clone();
        move || primary.stop_immediate()
    })
    .await
    .unwrap();
    blocking({
        let standby = standby.clone();
        move || standby.start_again()
    })
    .await
    .expect("the standby starts again without its primary");
    assert!(
        failover_client(&[&primary, &standby]).await.is_err(),
        "no writable server before the promotion"
    );

    // Promoted, the standby takes writes from failover clients; the acknowledged row 3 is lost.
    let promoting = Instant::now();
    blocking({
        let standby = standby.clone();
        move || standby.promote()
    })
    .await
    .expect("promote");
    eprintln!("async standby promoted in {:?}", promoting.elapsed());
    let client = failover_client(&[&primary, &standby]).await.unwrap();
    assert_eq!(server_port(&client).await, standby.port());
    client
        .execute("INSERT INTO t VALUES (4)", &[])
        .await
        .unwrap();
    assert_eq!(rows_of(&client).await, vec![1, 2, 4], "row 3 lost");
    assert!(standby.promote().is_err(), "a primary cannot be promoted");

    // Dropped, the standby is stopped and removed like any throwaway cluster.
    let standby = Arc::into_inner(standby).expect("no other handle");
    let dir = standby.directory().to_path_buf();
    let pid = standby.pid().unwrap();
    drop(client);
    drop(standby);
    assert!(!dir.exists(), "standby directory removed");
    assert!(
        !std::path::Path::new(&format!("/proc/{pid}")).exists(),
        "standby postmaster gone"
    );
}

#[tokio::test]
async fn a_sync_standby_holds_every_acknowledged_commit() {
    use pgcoord_testkit::Replication;
    use std::sync::Arc;
    use std::time::Duration;
    use tokio::time::timeout;

    let primary = Arc::new(
        blocking(TempPostgres::start_primary)
            .await
            .expect("primary"),
    );
    let writer = Arc::new(client_of(&primary, None).await.unwrap());
    writer
        .batch_execute("CREATE TABLE t (x int); INSERT INTO t VALUES (1)")
        .await
        .unwrap();

    let started = Instant::now();
    let standby = Arc::new({
        let primary = primary.clone();
        blocking(move || primary.start_standby(Replication::Synchronous))
            .await
            .expect("standby")
    });
    eprintln!("sync standby streaming in {:?}", started.elapsed());
    let row = writer
        .query_one(
            "SELECT state, sync_state, current_setting('synchronous_standby_names') \
             FROM pg_stat_replication WHERE application_name = $1",
            &[&"standby1"],
        )
        .await
        .unwrap();
    assert_eq!(
        (
            row.get::<_, String>(0),
            row.get::<_, String>(1),
            row.get::<_, String>(2)
        ),
        (
            "streaming".to_owned(),
            "sync".to_owned(),
            "standby1".to_owned()
        )
    );

    // A second, asynchronous standby neither inherits the primary's synchronous_standby_names
    // (which would make it wait for itself once promoted) nor releases its commits.
    let second = {
        let primary = primary.clone();
        blocking(move || primary.start_standby(Replication::Asynchronous))
            .await
            .expect("second standby")
    };
    assert_eq!(second.standby_name(), Some("standby2"));
    let names: String = client_of(&second, None)
        .await
        .unwrap()
        .query_one("SHOW synchronous_standby_names", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(names, "");
    let conf =
        std::fs::read_to_string(second.directory().join("data/postgresql.auto.conf")).unwrap();
    assert!(conf.contains("application_name=standby2"), "{conf}");

    // remote_apply: a commit returns once the standby applied it, so it is visible there at once.
    let reader = client_of(&standby, None).await.unwrap();
    writer
        .batch_execute("SET synchronous_commit = remote_apply")
        .await
        .unwrap();
    let mut expected = vec![1];
    for x in 2..=20 {
        writer
            .execute("INSERT INTO t VALUES ($1)", &[&x])
            .await
            .unwrap();
        expected.push(x);
        assert_eq!(
            rows_of(&reader).await,
            expected,
            "visible on the standby at once"
        );
    }
    drop(reader);

    // on: a commit returns once the standby flushed it; with the standby down it waits...
    writer
        .batch_execute("SET synchronous_commit = on")
        .await
        .unwrap();
    blocking({
        let standby = standby.clone();
        move || standby.stop()
    })
    .await
    .unwrap();
    let mut pending = tokio::spawn({
        let writer = writer.clone();
        async move { writer.execute("INSERT INTO t VALUES (21)", &[]).await }
    });
    assert!(
        timeout(Duration::from_secs(1), &mut pending).await.is_err(),
        "the commit returned without the standby"
    );
    // ... and returns once the standby is back.
    let back = Instant::now();
    blocking({
        let standby = standby.clone();
        move || standby.start_again()
    })
    .await
    .unwrap();
    timeout(Duration::from_secs(30), pending)
        .await
        .expect("the commit returns once the standby is back")
        .unwrap()
        .unwrap();
    expected.push(21);
    eprintln!(
        "blocked commit returned {:?} after restarting the standby",
        back.elapsed()
    );
    for x in 22..=40 {
        writer
            .execute("INSERT INTO t VALUES ($1)", &[&x])
            .await
            .unwrap();
        expected.push(x);
    }

    // The primary fails right after its last acknowledged commit: the promoted standby has them
    // all, and takes writes without waiting for a standby of its own.
    blocking({
        let primary = primary.clone();
        move || primary.stop_immediate()
    })
    .await
    .unwrap();
    let promoting = Instant::now();
    blocking({
        let standby = standby.clone();
        move || standby.promote()
    })
    .await
    .expect("promote");
    eprintln!("sync standby promoted in {:?}", promoting.elapsed());
    let client = failover_client(&[&primary, &standby]).await.unwrap();
    assert_eq!(server_port(&client).await, standby.port());
    assert_eq!(
        rows_of(&client).await,
        expected,
        "every acknowledged commit"
    );
    let names: String = client
        .query_one("SHOW synchronous_standby_names", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(names, "", "the promoted standby waits for no standby");
    timeout(
        Duration::from_secs(5),
        client.batch_execute("SET synchronous_commit = on; INSERT INTO t VALUES (41)"),
    )
    .await
    .expect("a commit on the promoted standby does not wait")
    .unwrap();
}

#[tokio::test]
async fn a_sync_standby_needs_synchronous_commit_and_only_standbys_promote() {
    use pgcoord::ErrorKind;
    use pgcoord_testkit::Replication;

    // The default cluster commits with synchronous_commit=off, which waits for no standby.
    let server = blocking(TempPostgres::start).await.expect("start");
    let err = server
        .start_standby(Replication::Synchronous)
        .err()
        .expect("refused");
    assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{err}");
    let err = server.promote().expect_err("not a standby");
    assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{err}");
    assert_eq!(server.standby_name(), None);
}
