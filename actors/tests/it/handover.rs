//! Handover through the runtime: a waiter's process holds a lease its holder's release handed
//! it with no acquire statement, takes it from the table when it missed the announcement,
//! gives it back when its waiter left as it was handed over, and keeps lock tables that share
//! a channel apart. What an announcement proves, and what a false one cannot do: see
//! `handover_proof`.

use std::time::{Duration, Instant};

use actix::Actor;
use pgcoord::LeaseTable;
use pgcoord::embedded::{Proxy, unique_name};
use pgcoord::lease::Attempt;
use pgcoord_actors::*;

use super::Setup;

/// The row of `name`: owner, token, seconds left.
pub(super) async fn row(
    setup: &Setup,
    admin: &tokio_postgres::Client,
    name: &str,
) -> Option<(String, i64, f64)> {
    let sql = format!(
        "SELECT owner, token, extract(epoch FROM expires_at - clock_timestamp())::float8
         FROM {} WHERE name = $1 AND owner IS NOT NULL",
        setup.quoted_table()
    );
    let row = admin.query_opt(&sql, &[&name]).await.unwrap()?;
    Some((row.get(0), row.get(1), row.get(2)))
}

/// `holder` takes "job" and `waiter` asks for it (with `data`, for up to 15 s). When this
/// returns, the waiter's attempt was refused and it is in line (and both managers know their
/// table's oid).
pub(super) async fn contend(
    holder: &actix::Addr<LockManager>,
    waiter: &actix::Addr<LockManager>,
    data: Option<&[u8]>,
) -> (
    Lease,
    actix_rt::task::JoinHandle<Result<pgcoord::Result<Lease>, actix::MailboxError>>,
) {
    let held = holder.send(Acquire::new("job")).await.unwrap().unwrap();
    let mut acquire = Acquire::new("job").timeout(Duration::from_secs(15));
    if let Some(data) = data {
        acquire = acquire.data(data.to_vec());
    }
    let waits = actix_rt::spawn(waiter.send(acquire));
    tokio::time::sleep(Duration::from_millis(300)).await;
    (held, waits)
}

#[actix_rt::test]
async fn a_waiter_is_handed_the_lease_with_its_data_and_sends_no_acquire_statement_for_it() {
    let (setup, admin) = Setup::new(Duration::from_secs(20), Duration::from_secs(1)).await;
    let (holder, waiter) = (setup.manager("holder"), setup.manager("waiter"));
    let (held, waits) = contend(&holder, &waiter, Some(b"mine")).await;
    let before = waiter
        .send(GetStats::new())
        .await
        .unwrap()
        .acquire_statements;
    let released = Instant::now();
    held.release().await.unwrap();
    let lease = waits.await.unwrap().unwrap().unwrap();
    // Its poll is 5 s away: the announcement handed it over.
    assert!(
        released.elapsed() < Duration::from_secs(2),
        "{:?}",
        released.elapsed()
    );
    let after = waiter
        .send(GetStats::new())
        .await
        .unwrap()
        .acquire_statements;
    assert_eq!(
        after, before,
        "no acquire statement for a lease handed over"
    );
    let stats = waiter.send(GetStats::new()).await.unwrap();
    assert_eq!(
        (stats.handovers_from_announcement, stats.handovers_from_row),
        (1, 0),
        "held on the announcement's proof"
    );
    assert_eq!(lease.data(), Some(&b"mine"[..]));
    let (owner, token, _) = row(&setup, &admin, "job").await.unwrap();
    assert_eq!((owner.as_str(), token), ("waiter", lease.token()));
    // Held as any grant: renewed by the waiter's heartbeat, released by its handle.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let (_, _, left) = row(&setup, &admin, "job").await.unwrap();
    assert!(left > 18.0, "renewed: {left} s left");
    lease.release().await.unwrap();
    assert_eq!(row(&setup, &admin, "job").await, None);
}

/// The waiter's LISTEN connection goes through a proxy that black-holes it, so the handover's
/// announcement never reaches it: its next poll finds the lease its own and takes it.
#[actix_rt::test]
async fn a_waiter_that_missed_the_announcement_takes_the_lease_at_its_next_poll() {
    let (setup, admin) = Setup::new(Duration::from_secs(8), Duration::from_secs(1)).await;
    let proxy = Proxy::start(&setup.pg).await.unwrap();
    let deaf = setup
        .builder("deaf")
        .session_pg_config(&proxy.pg_config(&setup.pg))
        .build()
        .unwrap();
    let (holder, waiter) = (setup.manager("holder"), LockManager::new(deaf).start());
    let held = holder.send(Acquire::new("job")).await.unwrap().unwrap();
    let waits = actix_rt::spawn(waiter.send(Acquire::new("job").timeout(Duration::from_secs(10))));
    tokio::time::sleep(Duration::from_millis(300)).await; // refused, in line
    proxy.cut();
    let released = Instant::now();
    held.release().await.unwrap();
    let (owner, token, _) = row(&setup, &admin, "job").await.unwrap();
    assert_eq!(owner, "deaf", "handed over at the release");
    let lease = waits.await.unwrap().unwrap().unwrap();
    assert_eq!(lease.token(), token);
    let stats = waiter.send(GetStats::new()).await.unwrap();
    assert_eq!(
        (stats.handovers_from_announcement, stats.handovers_from_row),
        (0, 1),
        "taken from the table"
    );
    // At its next poll (a quarter lease, 2 s), not when the lease it was handed expires (8 s).
    assert!(
        released.elapsed() < Duration::from_secs(5),
        "{:?}",
        released.elapsed()
    );
    lease.release().await.unwrap();
}

/// The waiter's place is put in line by a statement of the test (as if its `Acquire` had given
/// up at the moment of the release): the process hears that it was handed a lease nobody there
/// waits for, and releases it, so the next in line need not wait for it to expire.
#[actix_rt::test]
async fn a_lease_handed_to_a_process_whose_waiter_left_is_given_back_at_once() {
    let (setup, admin) = Setup::new(Duration::from_secs(20), Duration::from_secs(1)).await;
    let config = setup.builder("gone").build().unwrap();
    let table = LeaseTable::new(&config);
    let (holder, gone, next) = (
        setup.manager("holder"),
        setup.manager("gone"),
        setup.manager("next"),
    );
    // The manager of "gone" listens, and none of its callers waits.
    gone.send(GetStats::new()).await.unwrap();
    let held = holder.send(Acquire::new("job")).await.unwrap().unwrap();
    let attempt = table
        .try_acquire_or_queue(
            &admin,
            "job",
            "gone",
            None,
            false,
            Duration::from_secs(20),
            Duration::from_secs(20),
            1,
        )
        .await
        .unwrap();
    assert!(matches!(attempt, Attempt::Held(Some(_))));
    let next_waits =
        actix_rt::spawn(next.send(Acquire::new("job").timeout(Duration::from_secs(10))));
    tokio::time::sleep(Duration::from_millis(300)).await; // in line behind "gone"
    let released = Instant::now();
    held.release().await.unwrap();
    let lease = next_waits.await.unwrap().unwrap().unwrap();
    // Not the 20 s of the lease "gone" was handed, nor the 5 s poll.
    assert!(
        released.elapsed() < Duration::from_secs(2),
        "{:?}",
        released.elapsed()
    );
    lease.release().await.unwrap();
}

/// A lease of this owner found at the first attempt of a wait (a process before this one with
/// the same owner identity, say) is not taken: it is waited out, as any holder's.
#[actix_rt::test]
async fn a_lease_of_the_same_owner_found_at_once_is_waited_out_not_taken() {
    let (setup, admin) = Setup::new(Duration::from_secs(1), Duration::from_millis(250)).await;
    let config = setup.builder("same").build().unwrap();
    let table = LeaseTable::new(&config);
    let Attempt::Granted(before) = table
        .try_acquire(&admin, "job", "same", None, false, Duration::from_secs(1))
        .await
        .unwrap()
    else {
        panic!("free")
    };
    let manager = setup.manager("same");
    let started = Instant::now();
    let lease = manager
        .send(Acquire::new("job").timeout(Duration::from_secs(5)))
        .await
        .unwrap()
        .unwrap();
    assert!(
        lease.token() > before.token,
        "a grant of its own, not the one found"
    );
    assert!(
        started.elapsed() > Duration::from_millis(500),
        "{:?}",
        started.elapsed()
    );
    lease.release().await.unwrap();
}

/// Releases sent together share a statement (`release_many`), which hands each lease to its own
/// first waiter: every waiter holds its lease without an acquire statement of its own.
#[actix_rt::test]
async fn a_batch_of_releases_hands_each_lease_to_its_waiter() {
    let (setup, admin) = Setup::new(Duration::from_secs(20), Duration::from_secs(1)).await;
    let holder = setup.manager("holder");
    let names = ["a", "b", "c"];
    let mut held = Vec::new();
    let mut waits = Vec::new();
    let mut waiters = Vec::new();
    for name in names {
        held.push(holder.send(Acquire::new(name)).await.unwrap().unwrap());
        let waiter = setup.manager(&format!("w{name}"));
        let acquire = Acquire::new(name).timeout(Duration::from_secs(10));
        waits.push(actix_rt::spawn(waiter.send(acquire)));
        waiters.push(waiter);
    }
    tokio::time::sleep(Duration::from_millis(300)).await; // all refused, in line
    let mut before = Vec::new();
    for waiter in &waiters {
        before.push(
            waiter
                .send(GetStats::new())
                .await
                .unwrap()
                .acquire_statements,
        );
    }
    let releases_before = holder
        .send(GetStats::new())
        .await
        .unwrap()
        .release_statements;
    let released = futures_util::future::join_all(held.into_iter().map(|lease| lease.release()));
    for result in released.await {
        result.unwrap();
    }
    let releases = holder
        .send(GetStats::new())
        .await
        .unwrap()
        .release_statements
        - releases_before;
    assert!(
        releases < 3,
        "{releases} release statements: some were sent together"
    );
    for (i, wait) in waits.into_iter().enumerate() {
        let lease = wait.await.unwrap().unwrap().unwrap();
        let after = waiters[i]
            .send(GetStats::new())
            .await
            .unwrap()
            .acquire_statements;
        assert_eq!(after, before[i], "no acquire statement for {}", names[i]);
        let (owner, token, _) = row(&setup, &admin, names[i]).await.unwrap();
        assert_eq!((owner, token), (format!("w{}", names[i]), lease.token()));
        lease.release().await.unwrap();
    }
}

/// Two lock tables of one name in two schemas share the default lease channel, and (against
/// the documented rule) one owner identity waits in both. A handover in one table names that
/// owner; the manager of the other table must not take it for its own lease of that name,
/// which another process still holds.
#[actix_rt::test]
async fn a_handover_in_another_lock_table_on_the_channel_is_not_taken() {
    let (setup, admin) = Setup::new(Duration::from_secs(20), Duration::from_secs(1)).await;
    let in_schema = |owner: &str, schema: &str| {
        LockManager::new(setup.builder(owner).schema(schema).build().unwrap()).start()
    };
    let (schema_a, schema_b) = (unique_name("sa"), unique_name("sb"));
    for schema in [&schema_a, &schema_b] {
        admin
            .batch_execute(&format!("CREATE SCHEMA \"{schema}\""))
            .await
            .unwrap();
        let config = setup.builder("admin").schema(schema).build().unwrap();
        pgcoord::schema::migrate(&admin, &config).await.unwrap();
    }
    let (holder_a, waiter_a) = (in_schema("ha", &schema_a), in_schema("w", &schema_a));
    let (holder_b, waiter_b) = (in_schema("hb", &schema_b), in_schema("w", &schema_b));
    let held_a = holder_a.send(Acquire::new("job")).await.unwrap().unwrap();
    let held_b = holder_b.send(Acquire::new("job")).await.unwrap().unwrap();
    let wait = |waiter: &actix::Addr<LockManager>| {
        actix_rt::spawn(waiter.send(Acquire::new("job").timeout(Duration::from_secs(15))))
    };
    let (waits_a, waits_b) = (wait(&waiter_a), wait(&waiter_b));
    tokio::time::sleep(Duration::from_millis(300)).await; // both refused, in line
    held_a.release().await.unwrap();
    let lease_a = waits_a.await.unwrap().unwrap().unwrap();
    // B's waiter heard the handover too (same channel, same owner): it must wait on, since
    // its own table's lease is still held by hb.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(!waits_b.is_finished(), "B's waiter took A's handover");
    let b = waiter_b.send(Get("job".into())).await.unwrap().unwrap();
    assert_eq!(b.owner.as_deref(), Some("hb"));
    // Released in B, it goes to B's waiter, handed over in B.
    held_b.release().await.unwrap();
    let lease_b = waits_b.await.unwrap().unwrap().unwrap();
    let b = waiter_b.send(Get("job".into())).await.unwrap().unwrap();
    assert_eq!(
        (b.owner.as_deref(), b.token),
        (Some("w"), Some(lease_b.token()))
    );
    lease_a.release().await.unwrap();
    lease_b.release().await.unwrap();
}
