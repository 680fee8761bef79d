//! `ui`: the live view served by the command (the page itself is tested in a browser in
//! `ui/tests/browser.rs`).

use std::io::{BufRead, BufReader, Read, Write};

use super::*;

/// GET `path` from `address`: the status line and the body.
fn get(address: &str, path: &str) -> (String, String) {
    let mut stream = std::net::TcpStream::connect(address).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let status = response.lines().next().unwrap_or_default().to_owned();
    let body = response
        .split_once("\r\n\r\n")
        .map_or(String::new(), |(_, b)| b.to_owned());
    (status, body)
}

#[tokio::test]
async fn ui_serves_the_page_and_what_it_shows_until_sigterm() {
    let table = unique_name("cli");
    assert!(pgcoord(&table, &["migrate"]).status.success());
    let config = config(&table, "job-runner");
    let client = pgcoord::db::connect_spawned(&config).await.unwrap();
    let attempt = LeaseTable::new(&config)
        .owner("job-runner")
        .unwrap()
        .try_acquire(
            &client,
            &AcquireRequest::new("nightly"),
            Duration::from_secs(30),
        )
        .await
        .unwrap();
    assert!(matches!(attempt, Attempt::Granted(_)));

    let mut ui = pgcoord_command(&table, &["ui", "--listen", "127.0.0.1:0"])
        .spawn()
        .unwrap();
    let address = served_at(&mut ui);

    let (status, page) = get(&address, "/");
    assert!(status.contains("200"), "{status}");
    assert!(page.contains("pgcoord — live view"), "{page}");
    let (status, snapshot) = get(&address, "/snapshot");
    assert!(status.contains("200"), "{status}");
    let snapshot: serde_json::Value = serde_json::from_str(&snapshot).unwrap();
    let lease = &snapshot["leases"][0];
    assert_eq!(lease["name"], "nightly", "{snapshot}");
    assert_eq!(lease["owner"], "job-runner", "{snapshot}");
    assert_eq!(lease["held"], true, "{snapshot}");

    // SIGTERM: it stops, exit 0.
    // SAFETY: kill(2) with the child's pid and a signal number; no memory is involved.
    unsafe { libc::kill(ui.id() as i32, libc::SIGTERM) };
    let stopped = ui.wait().unwrap();
    assert_eq!(stopped.code(), Some(0), "{stopped:?}");

    // Actions without their token: refused at once, the token asked for where it belongs.
    let no_token = pgcoord_command(
        &table,
        &["ui", "--listen", "127.0.0.1:0", "--allow-actions"],
    )
    .env_remove("PGCOORD_UI_TOKEN")
    .output()
    .unwrap();
    assert_eq!(no_token.status.code(), Some(2), "{no_token:?}");
    assert!(
        String::from_utf8_lossy(&no_token.stderr).contains("PGCOORD_UI_TOKEN"),
        "{no_token:?}"
    );
    let short = pgcoord_command(
        &table,
        &["ui", "--listen", "127.0.0.1:0", "--allow-actions"],
    )
    .env("PGCOORD_UI_TOKEN", "short")
    .output()
    .unwrap();
    assert_eq!(short.status.code(), Some(2), "{short:?}");
    assert!(
        !String::from_utf8_lossy(&short.stderr).contains("short"),
        "{short:?}"
    );

    // A port it cannot take: a usage error, at once.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().to_string();
    let refused = pgcoord(&table, &["ui", "--listen", &port]);
    assert_eq!(refused.status.code(), Some(2), "{refused:?}");
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("cannot listen"),
        "{refused:?}"
    );
}

/// With the database unreachable the page is still served, and each look answers within its
/// bound with the error (503), never hanging.
#[test]
fn ui_answers_a_look_at_an_unreachable_database_with_the_error_in_time() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let dsn = format!("host=127.0.0.1 port={port} user=nobody dbname=none connect_timeout=1");
    let table = unique_name("cli");
    let mut ui = pgcoord_command(&table, &["--dsn", &dsn, "ui", "--listen", "127.0.0.1:0"])
        .spawn()
        .unwrap();
    let address = served_at(&mut ui);
    let (status, _) = get(&address, "/");
    assert!(status.contains("200"), "{status}");
    let asked = std::time::Instant::now();
    let (status, body) = get(&address, "/snapshot");
    assert!(status.contains("503"), "{status} {body}");
    assert!(body.contains("\"error\""), "{body}");
    assert!(
        asked.elapsed() < Duration::from_secs(5),
        "{:?}",
        asked.elapsed()
    );
    // SAFETY: kill(2) with the child's pid and a signal number; no memory is involved.
    unsafe { libc::kill(ui.id() as i32, libc::SIGTERM) };
    assert_eq!(ui.wait().unwrap().code(), Some(0));
}

/// Where `pgcoord ui` serves, from its first line (with port 0: any free one).
fn served_at(ui: &mut std::process::Child) -> String {
    let mut first = String::new();
    BufReader::new(ui.stdout.as_mut().unwrap())
        .read_line(&mut first)
        .unwrap();
    (first
        .trim()
        .strip_prefix("serving the live view at http://"))
    .and_then(|a| a.strip_suffix('/'))
    .unwrap_or_else(|| panic!("{first:?}"))
    .to_owned()
}
