//! The web examples stop right: sent SIGTERM (or ctrl-c) while they hold leases, the processes
//! release every one at once, as the README promises, instead of leaving them to expire. Each
//! example runs as its own process (built as `cargo run --example` builds it) against a
//! throwaway cluster of its own, serving until the signal.

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use pgcoord::{Config, LeaseTable};
use pgcoord_testkit::TempPostgres;

#[tokio::test(flavor = "multi_thread")]
async fn the_axum_example_releases_every_lease_on_sigterm() {
    axum_stops_on(libc::SIGTERM).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_axum_example_releases_every_lease_on_ctrl_c() {
    axum_stops_on(libc::SIGINT).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_actix_web_example_releases_every_lease_on_sigterm() {
    let pg = TempPostgres::start().expect("cluster");
    let mut example = Example::start("actix_web", &pg);
    // One instance leads: its term is a lease held until the shutdown releases it.
    let held = example.wait_for_leases(&pg, 1).await;
    assert_eq!(held, ["background_job"]);
    example.stops_on(libc::SIGTERM, &pg).await;
}

/// The axum example with a job running under its lease (a minute's work), stopped by `signal`.
async fn axum_stops_on(signal: libc::c_int) {
    let pg = TempPostgres::start().expect("cluster");
    let mut example = Example::start("axum", &pg);
    let line = example.wait_for_line("serving on http://");
    let address = line.trim_start_matches("serving on http://").to_owned();
    let mut job = std::net::TcpStream::connect(&address).expect("connect to the example");
    // Answered when the job ends: after the signal, when its lease is gone.
    write!(
        job,
        "POST /jobs/long HTTP/1.1\r\nHost: {address}\r\nContent-Length: 2\r\nConnection: close\r\n\r\n60"
    )
    .expect("send the job");
    let held = example.wait_for_leases(&pg, 1).await;
    assert_eq!(held, ["job:long"]);
    example.stops_on(signal, &pg).await;
}

/// A running example, serving until a signal.
struct Example {
    name: &'static str,
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Example {
    /// Starts `name --serve` on `pg`.
    fn start(name: &'static str, pg: &TempPostgres) -> Example {
        let mut child = Command::new(built(name))
            .arg("--serve")
            .env("DATABASE_URL", pg.dsn())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("start the {name} example: {e}"));
        // Read on a thread of its own, so waiting for a line has a bound.
        let (tx, lines) = mpsc::channel();
        let stdout = child.stdout.take().expect("stdout");
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Example { name, child, lines }
    }

    /// Waits (30 s at most) for a line of output starting with `prefix`, and returns it.
    fn wait_for_line(&mut self, prefix: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) if line.starts_with(prefix) => return line,
                Ok(_) => {}
                Err(e) => panic!("{}: no line {prefix:?} ({e})", self.name),
            }
        }
    }

    /// Waits (30 s at most, the example's start included) until `count` leases are held, and
    /// returns their names.
    async fn wait_for_leases(&mut self, pg: &TempPostgres, count: usize) -> Vec<String> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let held = held(pg).await;
            if held.len() == count {
                return held;
            }
            assert!(
                Instant::now() < deadline,
                "{}: {count} leases never held (held: {held:?})",
                self.name
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Sends `signal`, then checks the lock table has no lease held within a second, and that
    /// the process ends (within 10 s) with success.
    async fn stops_on(mut self, signal: libc::c_int, pg: &TempPostgres) {
        assert!(
            self.child.try_wait().expect("child").is_none(),
            "{}: ended before the signal",
            self.name
        );
        // SAFETY: kill(2) on our own child's pid, which stays reserved until we wait for it.
        let sent = unsafe { libc::kill(self.child.id() as libc::pid_t, signal) };
        assert_eq!(sent, 0, "signal {signal} to the {} example", self.name);
        let signalled = Instant::now();
        loop {
            let held = held(pg).await;
            if held.is_empty() {
                break;
            }
            if signalled.elapsed() > Duration::from_secs(1) {
                let status = self.child.try_wait();
                let said: Vec<String> = self.lines.try_iter().collect();
                panic!(
                    "{}: leases still held a second after signal {signal}: {held:?} \
                     (the process: {status:?}, its output since: {said:?})",
                    self.name
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        let status = loop {
            if let Some(status) = self.child.try_wait().expect("child") {
                break status;
            }
            assert!(
                Instant::now() < deadline,
                "{}: still running 10 s after signal {signal}",
                self.name
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        assert!(status.success(), "{}: ended with {status}", self.name);
    }
}

impl Drop for Example {
    fn drop(&mut self) {
        // A failed test leaves no example running.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The names of the leases held now in `pg`'s lock table (the examples use the default names).
async fn held(pg: &TempPostgres) -> Vec<String> {
    let config = Config::builder()
        .pg_config(&pg.pg_config())
        .build()
        .unwrap();
    let client = super::connect(&config).await;
    let table = LeaseTable::new(&config);
    match table.list(&client).await {
        Ok(leases) => (leases.into_iter())
            .filter(|lease| lease.is_held())
            .map(|lease| lease.name)
            .collect(),
        // Not migrated yet.
        Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::UNDEFINED_TABLE) => vec![],
        Err(e) => panic!("list the leases: {e}"),
    }
}

/// The example `name`'s program, built once for every test here, into the build directory of
/// this test (cargo leaves it unlocked while tests run).
fn built(name: &str) -> PathBuf {
    static BUILT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    let profile = BUILT.get_or_init(|| {
        // …/target/debug/deps/it-…: the profile's directory is two up.
        let exe = std::env::current_exe().expect("the test's path");
        let profile = exe
            .parent()
            .and_then(|deps| deps.parent())
            .expect("profile");
        let target = profile.parent().expect("target directory");
        let mut cargo = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
        // With the workspace's features, as `cargo test --workspace` built them: nothing is
        // compiled again (the root package's features alone would build the dependencies anew).
        cargo.args([
            "build",
            "--workspace",
            "--example",
            "axum",
            "--example",
            "actix_web",
        ]);
        cargo
            .arg("--manifest-path")
            .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml"));
        cargo.arg("--target-dir").arg(target);
        if profile.ends_with("release") {
            cargo.arg("--release");
        }
        let status = cargo.status().expect("run cargo");
        assert!(status.success(), "cargo build of the examples: {status}");
        profile.to_owned()
    });
    profile.join("examples").join(name)
}
