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

#[tokio::test]
async fn a_cluster_whose_owner_was_killed_is_reaped_by_the_next_start() {
    // A child process starts a cluster and is killed with SIGKILL, so nothing of its own cleans up.
    let exe = std::env::current_exe().unwrap();
    let mut child = std::process::Command::new(&exe)
        .args([
            "--exact",
            "embedded::orphan_child",
            "--nocapture",
            "--ignored",
        ])
        .env("PGCOORD_ORPHAN_PARENT", "1")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::BufRead;
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let dir = loop {
        let line = lines
            .next()
            .expect("the child reports its cluster")
            .unwrap();
        if let Some(dir) = line.strip_prefix("ORPHAN_DIR=") {
            break std::path::PathBuf::from(dir);
        }
    };
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(dir.exists(), "left behind by the killed process");
    let _next = TempPostgres::start().unwrap();
    assert!(!dir.exists(), "reaped by the next start");
}

/// Run only by the test above, in a child process it then kills.
#[test]
#[ignore = "started by a_cluster_whose_owner_was_killed_is_reaped_by_the_next_start"]
fn orphan_child() {
    if std::env::var("PGCOORD_ORPHAN_PARENT").is_err() {
        return;
    }
    let server = TempPostgres::start().unwrap();
    println!("ORPHAN_DIR={}", server.directory().display());
    std::thread::sleep(std::time::Duration::from_secs(60));
}
