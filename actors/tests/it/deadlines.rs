//! A caller's timeout is hard: an acquire, a permit or a single attempt answers within it
//! whatever the connections do, and what is left to clean up (a grant whose answer was lost,
//! the waiter's place in line) is finished by the manager afterwards, never left held.

use std::time::{Duration, Instant};

use actix::prelude::*;
use pgcoord::ErrorKind;
use pgcoord_actors::*;
use pgcoord_testkit::{Proxy, backend_pids, unique_name};

use super::Setup;
use super::own_cluster::{freeze_while_idle, own_cluster};

const TIMEOUT: Duration = Duration::from_secs(1);
/// What a timeout may be overrun by: the answer's way back through the actors, on a test
/// thread the whole runtime shares (a busy machine's timers fire late).
const SLACK: Duration = Duration::from_millis(300);

/// A manager for `config` whose pool has `n` connections open and idle (all checked out at
/// once, then given back): the connections its next statements get.
async fn warm(config: pgcoord::Config, n: usize) -> Addr<LockManager> {
    let pool = pgcoord::Pool::new(&config);
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut open = Vec::new();
    for _ in 0..n {
        open.push(pool.checkout(deadline).await.unwrap());
    }
    drop(open);
    assert_eq!(pool.connections(), (n as u32, n as u32));
    LockManager::with_pool(config, pool, None).start()
}

/// Sends `request` and checks it answers within [`TIMEOUT`] (plus slack), with one of `kinds`.
async fn answers_in_time<M>(
    manager: &Addr<LockManager>,
    request: M,
    kinds: &[ErrorKind],
    what: &str,
) where
    M: Message<Result = pgcoord::Result<Lease>> + Send + 'static,
    LockManager: Handler<M>,
{
    let started = Instant::now();
    let answer = manager.send(request).await.unwrap();
    let took = started.elapsed();
    let err = answer.expect_err(what);
    assert!(kinds.contains(&err.kind()), "{what}: {err}");
    assert!(took < TIMEOUT + SLACK, "{what}: answered after {took:?}");
}

/// The database did not answer, or (a fresh connection found in time) the lease stayed held.
const UNAVAILABLE_OR_HELD: &[ErrorKind] = &[ErrorKind::Unavailable, ErrorKind::NotAcquired];

/// The rows `owner` holds now.
async fn held_by(setup: &Setup, admin: &tokio_postgres::Client, owner: &str) -> Vec<String> {
    let sql = format!(
        "SELECT name FROM {} WHERE owner = $1 AND expires_at > clock_timestamp() ORDER BY name",
        setup.quoted_table()
    );
    let rows = admin.query(&sql, &[&owner]).await.unwrap();
    rows.iter().map(|r| r.get(0)).collect()
}

/// The manager's idle pooled connections stop forwarding (black-holed by a proxy; new
/// connections pass), and every statement timeout is longer than the caller's timeout. An
/// acquire of a free lease, of a held one, a single attempt and a permit each answer within
/// their timeout — `Unavailable`, or `NotAcquired` for a lease another holds once a fresh
/// connection could tell — and nothing is left held.
#[actix_rt::test]
async fn calls_answer_within_their_timeout_while_idle_pooled_connections_hang() {
    let (setup, admin) = Setup::new(Duration::from_secs(20), Duration::from_secs(1)).await;
    let holder = setup.manager("holder");
    let held = holder.send(Acquire::new("held")).await.unwrap().unwrap();
    // A manager of its own for each call, its pool warm, then black-holed.
    let cut_off = async || {
        let proxy = Proxy::start(&setup.pg).await.unwrap();
        let config = setup
            .builder("waiter")
            .pg_config(&proxy.pg_config(&setup.pg))
            .session_pg_config(&setup.pg)
            .statement_timeout(Duration::from_secs(5))
            .pool_size(4)
            .build()
            .unwrap();
        let waiter = warm(config, 4).await;
        proxy.cut();
        (proxy, waiter)
    };
    let cases = [
        ("a free lease", Acquire::new("free").timeout(TIMEOUT)),
        ("a held lease", Acquire::new("held").timeout(TIMEOUT)),
        (
            "a single attempt",
            Acquire::new("once").fail_if_locked().timeout(TIMEOUT),
        ),
    ];
    for (what, request) in cases {
        let (_proxy, waiter) = cut_off().await;
        answers_in_time(&waiter, request, UNAVAILABLE_OR_HELD, what).await;
    }
    let (_proxy, waiter) = cut_off().await;
    let permit = AcquirePermit::new("permits", 2).timeout(TIMEOUT);
    answers_in_time(&waiter, permit, &[ErrorKind::Unavailable], "a permit").await;
    // A waiter in line when its connections hang: its deadline passes during a nap, and it
    // leaves the line after answering, not before.
    let proxy = Proxy::start(&setup.pg).await.unwrap();
    let config = (setup.builder("waiter"))
        .pg_config(&proxy.pg_config(&setup.pg))
        .session_pg_config(&setup.pg)
        .build()
        .unwrap();
    let waiter = warm(config, 4).await;
    let started = Instant::now();
    let wait = waiter.send(Acquire::new("held").timeout(TIMEOUT * 2));
    let wait = actix_rt::spawn(wait);
    tokio::time::sleep(Duration::from_millis(300)).await; // refused, in line, napping
    proxy.cut();
    let err = wait.await.unwrap().unwrap().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotAcquired, "{err}");
    let took = started.elapsed();
    assert!(took < TIMEOUT * 2 + SLACK, "answered after {took:?}");
    // Nothing was left held meanwhile, and the clean-ups finish on fresh connections.
    pgcoord_testkit::eventually(Duration::from_secs(10), "nothing held", async || {
        held_by(&setup, &admin, "waiter").await.is_empty()
    })
    .await;
    held.release().await.unwrap();
}

/// The manager's idle pooled backends are frozen (SIGSTOP) while new connections work: the
/// attempt reaches the server and hangs there, its outcome unknown past the caller's timeout.
/// The caller has its answer within the timeout; once the backends are thawed, any grant the
/// attempt made is released by the manager within a few seconds, long before the lease (20 s)
/// would have ended it — and the next acquire of the name, waiting for that clean-up, is
/// granted.
#[actix_rt::test]
async fn an_attempt_frozen_on_the_server_is_answered_in_time_and_cleaned_up_after() {
    let (server, setup, admin) = own_cluster().await;
    let app = unique_name("app");
    let config = setup
        .builder("waiter")
        .application_name(&app)
        .lease(Duration::from_secs(20))
        .heartbeat(Duration::from_secs(2))
        .statement_timeout(Duration::from_secs(5))
        .pool_size(2)
        .build()
        .unwrap();
    let waiter = warm(config, 2).await;
    let frozen: Vec<u32> = backend_pids(&admin, &app).await.unwrap();
    assert!(!frozen.is_empty());
    for &pid in &frozen {
        freeze_while_idle(&server, &admin, pid).await;
    }
    answers_in_time(
        &waiter,
        Acquire::new("job").timeout(TIMEOUT),
        &[ErrorKind::Unavailable],
        "an acquire on a frozen backend",
    )
    .await;
    for &pid in &frozen {
        server.thaw_backend(pid).unwrap();
    }
    let thawed = Instant::now();
    // The clean-up holds the name's turn: this waits for it, then is granted.
    let lease = waiter
        .send(Acquire::new("job").timeout(Duration::from_secs(10)))
        .await
        .unwrap()
        .unwrap();
    assert!(
        thawed.elapsed() < Duration::from_secs(8),
        "granted {:?} after the thaw",
        thawed.elapsed()
    );
    let sql = format!(
        "SELECT count(*) FROM {} WHERE name = 'job' AND owner = 'waiter'",
        setup.quoted_table()
    );
    let rows: i64 = admin.query_one(&sql, &[]).await.unwrap().get(0);
    assert_eq!(rows, 1, "one tenure, the lease's own");
    let info = setup.table().get("job").await.unwrap();
    assert_eq!(info.token, Some(lease.token()));
    lease.release().await.unwrap();
}

/// A release holds its name's turn while its statement runs: an acquire of the same name sent
/// to the same manager right after it sends no attempt until the release is done (so no check
/// of an attempt of unknown outcome could free the tenure being released), and is granted then.
#[actix_rt::test]
async fn an_acquire_after_a_release_of_the_same_name_waits_for_it() {
    let (setup, mut admin) = Setup::new(Duration::from_secs(20), Duration::from_secs(1)).await;
    let manager = setup.manager("holder");
    let lease = manager.send(Acquire::new("job")).await.unwrap().unwrap();
    // A fencing guard in an open transaction holds the release on the row.
    let tx = admin.transaction().await.unwrap();
    lease.fence(&tx).await.unwrap();
    let token = lease.token();
    let release = actix_rt::spawn(lease.release());
    tokio::time::sleep(Duration::from_millis(100)).await;
    let before = manager
        .send(GetStats::new())
        .await
        .unwrap()
        .acquire_statements;
    let again = actix_rt::spawn(manager.send(Acquire::new("job").timeout(Duration::from_secs(10))));
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after = manager
        .send(GetStats::new())
        .await
        .unwrap()
        .acquire_statements;
    assert_eq!(after, before, "no attempt while the release is under way");
    assert!(!release.is_finished() && !again.is_finished());
    tx.commit().await.unwrap();
    release.await.unwrap().unwrap();
    let next = again.await.unwrap().unwrap().unwrap();
    assert!(next.token() > token);
    next.release().await.unwrap();
}

/// A manager stopped while an attempt of its is on the server: the attempt still gets its
/// answer (the wait runs on a task of its own), and the grant, which no manager can record any
/// more, is released at once instead of staying held for a lease.
#[actix_rt::test]
async fn a_grant_whose_manager_stopped_is_released() {
    let (server, setup, admin) = own_cluster().await;
    let app = unique_name("app");
    let config = setup
        .builder("stopping")
        .application_name(&app)
        .lease(Duration::from_secs(20))
        .heartbeat(Duration::from_secs(2))
        .pool_size(1)
        .build()
        .unwrap();
    let manager = warm(config, 1).await;
    let pooled = backend_pids(&admin, &app).await.unwrap();
    assert_eq!(pooled.len(), 1);
    freeze_while_idle(&server, &admin, pooled[0]).await;
    let wait = actix_rt::spawn(manager.send(Acquire::new("job").timeout(Duration::from_secs(10))));
    tokio::time::sleep(Duration::from_millis(300)).await; // the attempt is on the frozen backend
    manager.send(Shutdown).await.unwrap();
    server.thaw_backend(pooled[0]).unwrap();
    assert!(wait.await.unwrap().is_err(), "nobody to hand the lease to");
    let held = format!(
        "SELECT count(*) FROM {} WHERE owner = 'stopping' AND expires_at > clock_timestamp()",
        setup.quoted_table()
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let rows: i64 = admin.query_one(&held, &[]).await.unwrap().get(0);
        if rows == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "the grant is still held");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
