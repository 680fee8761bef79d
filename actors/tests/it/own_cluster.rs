//! A throwaway cluster of a test's own, for tests that stop, pause or restart the server (so the
//! other tests keep theirs), and what such tests do to it: run blocking cluster operations,
//! find and freeze a session's backend, and time a statement cut off at its bound.

use std::sync::Arc;
use std::time::{Duration, Instant};

use pgcoord::ErrorKind;
use pgcoord_actors::*;
use pgcoord_testkit::{TempPostgres, backend_pids, unique_name};
use tokio_postgres::Client;

use super::Setup;

/// The lease of a cluster of a test's own: short, so losses show within seconds.
pub(super) const LEASE: Duration = Duration::from_secs(2);
/// Its heartbeat.
pub(super) const HEARTBEAT: Duration = Duration::from_millis(400);

/// A cluster of the test's own, migrated, with a [`Setup`] pointing at it and an admin client.
pub(super) async fn own_cluster() -> (Arc<TempPostgres>, Setup, Client) {
    own_cluster_with(&[]).await
}

/// [`own_cluster`] with server `settings` besides.
pub(super) async fn own_cluster_with(
    settings: &'static [(&'static str, &'static str)],
) -> (Arc<TempPostgres>, Setup, Client) {
    super::init_tracing();
    // Durable commits (the throwaway default is synchronous_commit=off): a crash restart must
    // not forget grants the test saw acknowledged.
    let settings = [&[("synchronous_commit", "on")], settings].concat();
    let server = Arc::new(
        tokio::task::spawn_blocking(move || TempPostgres::start_with(&settings))
            .await
            .unwrap()
            .unwrap(),
    );
    let setup = Setup {
        pg: server.pg_config(),
        table: unique_name("locks"),
        lease: LEASE,
        heartbeat: HEARTBEAT,
    };
    let admin = connect(&setup).await;
    pgcoord::schema::migrate(&admin, &setup.builder("admin").build().unwrap())
        .await
        .unwrap();
    (server, setup, admin)
}

async fn connect(setup: &Setup) -> Client {
    pgcoord::db::connect_spawned(&setup.builder("admin").build().unwrap())
        .await
        .unwrap()
}

/// Runs a blocking cluster operation (stop, restart, ...) without blocking the actors.
pub(super) async fn on_server(
    server: &Arc<TempPostgres>,
    op: fn(&TempPostgres) -> pgcoord::Result<()>,
) {
    let server = server.clone();
    tokio::task::spawn_blocking(move || op(&server))
        .await
        .unwrap()
        .unwrap();
}

/// Waits until `application_name` has a backend, and returns its pid.
pub(super) async fn backend_of(admin: &Client, application_name: &str) -> u32 {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(&pid) = backend_pids(admin, application_name).await.unwrap().first() {
            return pid;
        }
        assert!(
            Instant::now() < deadline,
            "no backend for {application_name}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until `application_name` has exactly one backend, and returns its pid. A pooled
/// connection whose connect timed out on a busy machine leaves a backend that lingers for a
/// moment; freezing that one instead of the live one would test nothing.
pub(super) async fn only_backend_of(admin: &Client, application_name: &str) -> u32 {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let [pid] = backend_pids(admin, application_name).await.unwrap()[..] {
            return pid;
        }
        assert!(
            Instant::now() < deadline,
            "no single backend for {application_name}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Freezes backend `pid` between two statements. A backend stopped in the middle of its
/// renewal would hold the leases' row locks: every renewal, the holder's included, would then
/// wait on it and the leases would rightly be lost — a different test from a connection that
/// stops answering.
pub(super) async fn freeze_while_idle(server: &TempPostgres, admin: &Client, pid: u32) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        server.freeze_backend(pid).unwrap();
        let state: Option<String> = admin
            .query_one(
                "SELECT state FROM pg_stat_activity WHERE pid = $1",
                &[&(pid as i32)],
            )
            .await
            .unwrap()
            .get(0);
        if state.as_deref() == Some("idle") {
            return;
        }
        server.thaw_backend(pid).unwrap();
        assert!(Instant::now() < deadline, "backend {pid} never idle");
        tokio::time::sleep(Duration::from_millis(7)).await;
    }
}

/// A listing on a frozen pooled backend fails `Unavailable` at the statement bound, not later.
pub(super) async fn cut_off_at_the_bound(table: &super::Table, bound: Duration) {
    let started = Instant::now();
    let err = table.list_prefix("").await.unwrap_err();
    let took = started.elapsed();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert!(took >= bound && took < bound * 2, "{took:?}");
}
