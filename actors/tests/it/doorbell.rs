//! The lease channel is a doorbell: a release's announcement wakes the waiter first in line,
//! whose own attempt takes the lease; a missed announcement costs a poll; a forged or late one
//! costs at most an attempt, and never makes a process hold or release anything.

use std::time::{Duration, Instant};

use actix::Actor;
use pgcoord::LeaseTable;
use pgcoord::lease::{AcquireRequest, Attempt};
use pgcoord_actors::*;
use pgcoord_testkit::{Proxy, unique_name};

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
/// returns, the waiter's attempts were refused and it is in line.
pub(super) async fn contend(
    setup: &Setup,
    admin: &tokio_postgres::Client,
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
    // Refused and in line: its place committed, however slow the machine.
    super::in_line(setup, admin, "job", 1).await;
    (held, waits)
}

async fn stats(manager: &actix::Addr<LockManager>) -> ManagerStats {
    manager.send(GetStats::new()).await.unwrap()
}

#[actix_rt::test]
async fn a_release_wakes_the_waiter_first_in_line_whose_one_attempt_takes_the_lease() {
    // A waiter polls every quarter of the lease: at 60 s no poll falls inside the test, however
    // busy the machine (a poll in flight at the release would take the lease uncounted).
    let (setup, admin) = Setup::new(Duration::from_secs(60), Duration::from_secs(1)).await;
    let (holder, waiter) = (setup.manager("holder"), setup.manager("waiter"));
    let (held, waits) = contend(&setup, &admin, &holder, &waiter, Some(b"mine")).await;
    let before = stats(&waiter).await;
    let released = Instant::now();
    held.release().await.unwrap();
    let lease = waits.await.unwrap().unwrap().unwrap();
    // Its poll is 15 s away: the announcement woke it.
    assert!(
        released.elapsed() < Duration::from_secs(5),
        "{:?}",
        released.elapsed()
    );
    let after = stats(&waiter).await;
    let attempts = after.acquire_statements - before.acquire_statements;
    // Its listener connecting late (a busy machine) tells every waiter to ask again too.
    let woken_all = after.woken_all - before.woken_all;
    assert!(
        attempts >= 1 && attempts <= 1 + woken_all,
        "{attempts} attempts after the release, {woken_all} times woken with everyone"
    );
    assert_eq!(lease.data(), Some(&b"mine"[..]));
    let (owner, token, _) = row(&setup, &admin, "job").await.unwrap();
    assert_eq!((owner.as_str(), token), ("waiter", lease.token()));
    lease.release().await.unwrap();
    assert_eq!(row(&setup, &admin, "job").await, None);
}

/// The waiter's LISTEN connection goes through a proxy that black-holes it, so the release's
/// announcement never reaches it: its next poll finds the lease free and takes it.
#[actix_rt::test]
async fn a_waiter_that_missed_the_announcement_takes_the_lease_at_its_next_poll() {
    let (setup, _admin) = Setup::new(Duration::from_secs(8), Duration::from_secs(1)).await;
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
    let lease = waits.await.unwrap().unwrap().unwrap();
    // At its next poll (a quarter lease, 2 s), never later.
    assert!(
        released.elapsed() < Duration::from_secs(5),
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
    let owner = table.owner("same").unwrap();
    let request = AcquireRequest::new("job");
    let Attempt::Granted(before) = (owner.try_acquire(&admin, &request, Duration::from_secs(1)))
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

/// Releases sent together share a statement (`release_many`), which announces each lease's
/// own first waiter: every waiter is woken and takes its lease with one attempt.
#[actix_rt::test]
async fn a_batch_of_releases_wakes_each_leases_waiter() {
    // No poll inside the test (see above): each grant is the woken attempt's.
    let (setup, admin) = Setup::new(Duration::from_secs(60), Duration::from_secs(1)).await;
    let holder = setup.manager("holder");
    let names = ["a", "b", "c"];
    let mut held = Vec::new();
    let mut waits = Vec::new();
    let mut waiters = Vec::new();
    for name in names {
        held.push(holder.send(Acquire::new(name)).await.unwrap().unwrap());
        let waiter = setup.manager(&format!("w{name}"));
        // Connected first: its connection's wake-up cannot send an attempt counted before the
        // releases and answered after them.
        super::listening(&waiter).await;
        let acquire = Acquire::new(name).timeout(Duration::from_secs(10));
        waits.push(actix_rt::spawn(waiter.send(acquire)));
        waiters.push(waiter);
    }
    // All refused and in line, their places committed.
    for name in names {
        super::in_line(&setup, &admin, name, 1).await;
    }
    let mut before = Vec::new();
    for waiter in &waiters {
        before.push(stats(waiter).await);
    }
    let releases_before = stats(&holder).await.release_statements;
    let released = Instant::now();
    let releases = futures_util::future::join_all(held.into_iter().map(|lease| lease.release()));
    for result in releases.await {
        result.unwrap();
    }
    let releases = stats(&holder).await.release_statements - releases_before;
    assert!(
        releases < 3,
        "{releases} release statements: some were sent together"
    );
    for (i, wait) in waits.into_iter().enumerate() {
        let lease = wait.await.unwrap().unwrap().unwrap();
        let after = stats(&waiters[i]).await;
        let attempts = after.acquire_statements - before[i].acquire_statements;
        // A waiter whose listener reconnected (a busy machine) was also told to ask again
        // (everyone is, as announcements may have been missed): at most one attempt each.
        let woken_all = after.woken_all - before[i].woken_all;
        assert!(
            attempts >= 1 && attempts <= 1 + woken_all,
            "{attempts} attempts for {}, {woken_all} times woken with everyone",
            names[i]
        );
        let (owner, token, _) = row(&setup, &admin, names[i]).await.unwrap();
        assert_eq!((owner, token), (format!("w{}", names[i]), lease.token()));
        lease.release().await.unwrap();
    }
    assert!(
        released.elapsed() < Duration::from_secs(5),
        "woken, not polled (the poll is 15 s away)"
    );
}

/// Two lock tables of one name in two schemas share the default lease channel, and (against
/// the documented rule) one owner identity waits in both. A release in one table rings the
/// other's waiter too: it asks, is refused, and waits on while its own table's lease is held.
#[actix_rt::test]
async fn a_release_in_another_lock_table_on_the_channel_costs_an_attempt_and_grants_nothing() {
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
    let table_b = super::Table::new(&setup.builder("admin").schema(&schema_b).build().unwrap());
    let held_a = holder_a.send(Acquire::new("job")).await.unwrap().unwrap();
    let held_b = holder_b.send(Acquire::new("job")).await.unwrap().unwrap();
    let wait = |waiter: &actix::Addr<LockManager>| {
        actix_rt::spawn(waiter.send(Acquire::new("job").timeout(Duration::from_secs(15))))
    };
    let (waits_a, waits_b) = (wait(&waiter_a), wait(&waiter_b));
    tokio::time::sleep(Duration::from_millis(300)).await; // both refused, in line
    held_a.release().await.unwrap();
    let lease_a = waits_a.await.unwrap().unwrap().unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(!waits_b.is_finished(), "B's waiter was granted A's lease");
    let b = table_b.get("job").await.unwrap();
    assert_eq!(b.owner.as_deref(), Some("hb"));
    held_b.release().await.unwrap();
    let lease_b = waits_b.await.unwrap().unwrap().unwrap();
    let b = table_b.get("job").await.unwrap();
    assert_eq!(
        (b.owner.as_deref(), b.token),
        (Some("w"), Some(lease_b.token()))
    );
    lease_a.release().await.unwrap();
    lease_b.release().await.unwrap();
}

/// Anyone who can connect may NOTIFY the lease channel. Announcements in every form — the
/// handover form of earlier versions naming the waiter with the holder's token, a release
/// naming the waiter first in line, one for anyone, the bare name, garbage — naming the waiter,
/// the holder and a bystander make nobody hold or release anything: the holder keeps its row,
/// the waiter keeps waiting, and no process sends a release. The waiter asks at most once per
/// announcement, and is refused.
#[actix_rt::test]
async fn forged_announcements_of_any_form_grant_nothing_and_release_nothing() {
    let (setup, admin) = Setup::new(Duration::from_secs(20), Duration::from_secs(1)).await;
    let channel = LeaseTable::new(&setup.builder("admin").build().unwrap())
        .channel()
        .to_owned();
    let (holder, waiter, bystander) = (
        setup.manager("holder"),
        setup.manager("waiter"),
        setup.manager("bystander"),
    );
    let (held, waits) = contend(&setup, &admin, &holder, &waiter, None).await;
    let _ = stats(&bystander).await; // started and listening
    let (before, holder_releases) = (
        stats(&waiter).await.acquire_statements,
        stats(&holder).await.release_statements,
    );
    let token = held.token();
    let mut forged = Vec::new();
    for owner in ["waiter", "holder", "bystander"] {
        for nonce in ["", "#0", "#-1"] {
            forged.push(format!("3>job{token}@16384{nonce}:{owner}"));
        }
        forged.push(format!("3:job{owner}"));
    }
    forged.extend(["3:job".into(), "job".into(), "".into(), "9:x".into()]);
    for payload in &forged {
        admin
            .execute("SELECT pg_notify($1, $2)", &[&channel, payload])
            .await
            .unwrap();
    }
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert!(!waits.is_finished(), "the waiter was granted on a forgery");
    let (owner, row_token, _) = row(&setup, &admin, "job").await.unwrap();
    assert_eq!((owner.as_str(), row_token), ("holder", token));
    assert_eq!(holder.send(GetStats::new()).await.unwrap().held, 1);
    assert_eq!(stats(&holder).await.release_statements, holder_releases);
    assert_eq!(stats(&bystander).await.release_statements, 0);
    let asked = stats(&waiter).await.acquire_statements - before;
    assert!(
        asked as usize <= forged.len(),
        "{asked} attempts for {} forgeries",
        forged.len()
    );
    // The real release wakes the waiter, which takes the lease with a token of its own.
    held.release().await.unwrap();
    let lease = waits.await.unwrap().unwrap().unwrap();
    assert!(lease.token() > token);
    let (owner, row_token, _) = row(&setup, &admin, "job").await.unwrap();
    assert_eq!((owner.as_str(), row_token), ("waiter", lease.token()));
    lease.release().await.unwrap();
}

/// A flood of announcements naming the waited-for lease costs the waiter an attempt per
/// doorbell gap (50 ms), not one per announcement; the real release still hands it the lease.
#[actix_rt::test]
async fn a_flood_of_forged_announcements_costs_an_attempt_per_gap() {
    let (setup, admin) = Setup::new(Duration::from_secs(20), Duration::from_secs(1)).await;
    let channel = LeaseTable::new(&setup.builder("admin").build().unwrap())
        .channel()
        .to_owned();
    let (holder, waiter) = (setup.manager("holder"), setup.manager("waiter"));
    let (held, waits) = contend(&setup, &admin, &holder, &waiter, None).await;
    let asked = async || stats(&waiter).await.acquire_statements;
    let (sent, asked, most) = super::flood(&admin, &channel, "job", asked).await;
    assert!(asked <= most, "{asked} attempts for {sent} announcements");
    assert!(!waits.is_finished(), "the waiter was granted on a forgery");
    held.release().await.unwrap();
    let lease = waits.await.unwrap().unwrap().unwrap();
    lease.release().await.unwrap();
}

#[actix_rt::test]
async fn a_release_nobody_waits_for_sends_no_notify() {
    let (setup, _admin) = Setup::new(Duration::from_secs(20), Duration::from_secs(1)).await;
    let config = setup.builder("admin").build().unwrap();
    let channel = LeaseTable::new(&config).channel().to_owned();
    let (listening, mut heard) = super::listen_on(&config, &[config.lease_channel()]).await;
    let manager = setup.manager("alone");
    let lease = manager.send(Acquire::new("solo")).await.unwrap().unwrap();
    lease.release().await.unwrap();
    // Notifications of one channel arrive in commit order: nothing came before the marker.
    (listening.execute("SELECT pg_notify($1, 'marker')", &[&channel]))
        .await
        .unwrap();
    let first = tokio::time::timeout(Duration::from_secs(5), heard.recv()).await;
    assert_eq!(first.unwrap(), Some(format!("{channel}: marker")));
    assert_eq!(stats(&manager).await.release_statements, 1);
}
