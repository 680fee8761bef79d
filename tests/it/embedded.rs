//! The throwaway cluster starts, serves, stops, and leaves no files or processes behind.

use std::time::Instant;

use pgcoord::embedded::TempPostgres;

#[tokio::test]
async fn starts_serves_stops_and_cleans_up() {
    let started = Instant::now();
    let server = TempPostgres::start().expect("start");
    let startup = started.elapsed();
    eprintln!("embedded cluster started in {startup:?}");
    let (client, conn) = server
        .pg_config()
        .connect(tokio_postgres::NoTls)
        .await
        .unwrap();
    let conn = tokio::spawn(conn);
    let one: i32 = client.query_one("SELECT 1", &[]).await.unwrap().get(0);
    assert_eq!(one, 1);

    // A restart keeps the data and the port.
    client
        .batch_execute("CREATE TABLE kept (x int); INSERT INTO kept VALUES (42)")
        .await
        .unwrap();
    drop(client);
    let _ = conn.await;
    server.restart().unwrap();
    let (client, conn) = tokio_postgres::connect(&server.dsn(), tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    let x: i32 = client
        .query_one("SELECT x FROM kept", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(x, 42);

    let dir = server.directory().to_path_buf();
    let pid = server.pid().unwrap();
    assert!(dir.exists());
    drop(server);
    assert!(!dir.exists(), "data directory removed");
    assert!(
        !std::path::Path::new(&format!("/proc/{pid}")).exists(),
        "postmaster gone"
    );
    // Its backends are gone too: the port no longer accepts connections.
    assert!(client.query_one("SELECT 1", &[]).await.is_err());
}
