//! pgcoord on the application's own bb8-postgres pool (`pgcoord::Pool::from_bb8`): one pool per
//! process, nothing prepared on the application's connections, and a hung connection never
//! handed back to the application.

use std::time::{Duration, Instant};

use actix::prelude::*;
use pgcoord::bb8_postgres::PostgresConnectionManager;
use pgcoord_actors::*;
use pgcoord_testkit::{backend_pids, unique_name};
use tokio_postgres::NoTls;

use super::own_cluster::{cut_off_at_the_bound, only_backend_of, own_cluster};
use super::{Collector, Setup};

/// The application's pool: at most `max_size` connections named `app`, a borrower waiting at
/// most `wait` for one.
async fn app_pool(
    pg: &tokio_postgres::Config,
    app: &str,
    max_size: u32,
    wait: Duration,
) -> pgcoord::bb8::Pool<PostgresConnectionManager<NoTls>> {
    let mut own = pg.clone();
    own.application_name(app);
    pgcoord::bb8::Pool::builder()
        .max_size(max_size)
        .connection_timeout(wait)
        .build(PostgresConnectionManager::new(own, NoTls))
        .await
        .unwrap()
}

/// The application's own bb8-postgres pool: pgcoord's statements run on it, nothing is prepared
/// on its connections, and pgcoord opens no pool of its own.
#[actix_rt::test]
async fn a_coordinator_runs_on_the_applications_own_pool() {
    let (setup, admin) = Setup::new(Duration::from_secs(10), Duration::from_secs(2)).await;
    let app = unique_name("app");
    let config = setup
        .builder("byo")
        .application_name(format!("{app}-pgcoord"))
        .inline_limit(1000)
        .build()
        .unwrap();
    let app_pool = app_pool(&setup.pg, &app, 2, Duration::from_secs(5)).await;
    let pool = pgcoord::Pool::from_bb8(&config, app_pool.clone());
    let coordinator = Coordinator::connect_with_pool(config, pool).await.unwrap();

    let leases: Vec<_> = (0..6)
        .map(|i| {
            coordinator
                .locks()
                .unwrap()
                .send(Acquire::new(format!("l{i}")))
        })
        .collect();
    let leases: Vec<_> = futures_util::future::join_all(leases)
        .await
        .into_iter()
        .map(|r| r.unwrap().unwrap())
        .collect();
    let (collector, recipient) = Collector::<Signal>::start_new();
    let channel = unique_name("byo");
    let subscribe = Subscribe::new(channel.clone(), recipient);
    coordinator
        .signals()
        .unwrap()
        .call(subscribe)
        .await
        .unwrap();
    // One inline message and one through the payload table, both on the application's pool.
    coordinator
        .signals()
        .unwrap()
        .call(Publish::new(&channel, vec![1]))
        .await
        .unwrap();
    coordinator
        .signals()
        .unwrap()
        .call(Publish::new(&channel, vec![2; 5000]))
        .await
        .unwrap();
    let got = collector.wait_for(2, Duration::from_secs(5)).await;
    assert_eq!(got[1].payload.len(), 5000);
    let guard = coordinator
        .advisory()
        .unwrap()
        .call(AdvisoryLock::new(7))
        .await
        .unwrap();
    coordinator.locks().unwrap().call(RunNow).await.unwrap();

    let count = |name: String| {
        let admin = &admin;
        async move { backend_pids(admin, &name).await.unwrap().len() }
    };
    assert!(
        (1..=2).contains(&count(app.clone()).await),
        "the application's pool serves"
    );
    assert_eq!(
        count(format!("{app}-pgcoord")).await,
        0,
        "no pool of pgcoord's own"
    );
    assert_eq!(count(format!("{app}-pgcoord listener")).await, 1);
    assert_eq!(count(format!("{app}-pgcoord advisory")).await, 1);
    let conn = app_pool.get().await.unwrap();
    let prepared: i64 = conn
        // Unnamed, so that this query does not count itself.
        .query_typed("SELECT count(*) FROM pg_prepared_statements", &[])
        .await
        .unwrap()[0]
        .get(0);
    assert_eq!(
        prepared, 0,
        "nothing prepared on the application's connections"
    );
    drop((conn, leases, guard));
}

/// A statement that hangs on a connection of the application's pool: pgcoord cannot close it
/// (bb8 decides), so it keeps it aside until it answers again, and the application's next
/// borrower never gets the hung backend.
#[actix_rt::test]
async fn a_hung_connection_of_the_applications_pool_is_kept_aside_until_it_answers() {
    let (server, setup, admin) = own_cluster().await;
    let app = unique_name("app");
    let bound = Duration::from_millis(500);
    let config = setup
        .builder("inspector")
        .statement_timeout(bound)
        .build()
        .unwrap();
    let app_pool = app_pool(&setup.pg, &app, 1, Duration::from_millis(300)).await;
    let pool = pgcoord::Pool::from_bb8(&config, app_pool.clone());
    let table = super::Table::on(&config, pool.clone());
    let _manager = LockManager::with_pool(config, pool, None).start();
    table.list_prefix("").await.unwrap();
    let pooled = only_backend_of(&admin, &app).await;
    server.freeze_backend(pooled).unwrap();

    cut_off_at_the_bound(&table, bound).await;
    // Kept aside: the application's pool (of one) has nothing to lend while the backend hangs.
    assert!(
        app_pool.get().await.is_err(),
        "the hung connection was lent out"
    );

    server.thaw_backend(pooled).unwrap();
    // Thawed, it answers the next ping and goes back, the same session.
    let deadline = Instant::now() + Duration::from_secs(5);
    let conn = loop {
        if let Ok(conn) = app_pool.get().await {
            break conn;
        }
        assert!(Instant::now() < deadline, "the connection came back");
    };
    let pid: i32 = conn
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(pid as u32, pooled);
    drop(conn);
    table.list_prefix("").await.unwrap();
}
