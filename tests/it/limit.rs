//! Stored limits on their own: permits up to the limit, a raised limit admitting more, a lowered
//! one taking permits back (after their fenced transactions), and the errors.

use std::time::{Duration, Instant};

use pgcoord::lease::{LimitedAttempt, slot_names};
use pgcoord::{ErrorKind, LeaseTable};

use super::LEASE;

/// One attempt at a permit of `name` by `owner`, naming the slots of `known` permits.
async fn attempt(
    table: &LeaseTable,
    client: &(impl pgcoord::Statements + ?Sized),
    owner: &str,
    name: &str,
    known: u32,
) -> LimitedAttempt {
    let candidates = if known == 0 {
        Vec::new()
    } else {
        slot_names(name, known).unwrap()
    };
    table
        .owner(owner)
        .unwrap()
        .try_acquire_limited(client, name, &candidates, known, LEASE)
        .await
        .unwrap()
}

/// Waits until backend `pid` waits on a lock (a row another transaction holds).
async fn waits_on_a_lock(client: &tokio_postgres::Client, pid: i32) {
    let sql = "SELECT count(*) FROM pg_stat_activity WHERE pid = $1 AND wait_event_type = 'Lock'";
    let deadline = Instant::now() + Duration::from_secs(10);
    while client
        .query_one(sql, &[&pid])
        .await
        .unwrap()
        .get::<_, i64>(0)
        == 0
    {
        assert!(
            Instant::now() < deadline,
            "backend {pid} never waited on a lock"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Sets the limit of `name` to `permits` on a session of its own, and returns once that session
/// waits on a lock (a fenced slot it takes back): its pid, and the change's answer with the time
/// it took.
async fn change_waiting(
    table: &LeaseTable,
    config: &pgcoord::Config,
    client: &tokio_postgres::Client,
    name: &'static str,
    permits: u32,
) -> (
    i32,
    tokio::task::JoinHandle<(pgcoord::Result<pgcoord::lease::LimitChange>, Duration)>,
) {
    // Connected before, so the wait is the statement's alone.
    let changer = super::connect(config).await;
    let pid: i32 = (changer.query_one("SELECT pg_backend_pid()", &[]).await)
        .unwrap()
        .get(0);
    let table = table.clone();
    let change = tokio::spawn(async move {
        let started = Instant::now();
        let change = table.set_limit(&changer, name, permits).await;
        (change, started.elapsed())
    });
    waits_on_a_lock(client, pid).await;
    (pid, change)
}

/// The slot and token of a permit that must be granted.
async fn permit(
    table: &LeaseTable,
    client: &tokio_postgres::Client,
    owner: &str,
    name: &str,
    known: u32,
) -> (String, i64) {
    match attempt(table, client, owner, name, known).await {
        LimitedAttempt::Granted { slot, grant } => (slot, grant.token),
        other => panic!("{owner}: no permit of {name}: {other:?}"),
    }
}

#[tokio::test]
async fn permits_up_to_the_stored_limit_and_more_once_it_is_raised() {
    let (config, client) = super::setup().await;
    let table = LeaseTable::new(&config);
    let none = (table.owner("a").unwrap())
        .try_acquire_limited(&client, "tenant:42", &[], 0, LEASE)
        .await
        .unwrap_err();
    assert_eq!(none.kind(), ErrorKind::NotFound, "no limit stored yet");
    assert_eq!(table.limit(&client, "tenant:42").await.unwrap(), None);

    let change = table.set_limit(&client, "tenant:42", 2).await.unwrap();
    assert_eq!((change.previous, change.revoked), (None, 0));
    assert_eq!(table.limit(&client, "tenant:42").await.unwrap(), Some(2));
    // Candidates named for fewer permits than stored: asked to name them again.
    assert_eq!(
        attempt(&table, &client, "a", "tenant:42", 0).await,
        LimitedAttempt::Resized(2)
    );
    let (a, _) = permit(&table, &client, "a", "tenant:42", 2).await;
    let (b, _) = permit(&table, &client, "b", "tenant:42", 2).await;
    assert_ne!(a, b);
    assert_eq!(
        attempt(&table, &client, "c", "tenant:42", 2).await,
        LimitedAttempt::Full
    );

    let change = table.set_limit(&client, "tenant:42", 3).await.unwrap();
    assert_eq!((change.previous, change.revoked), (Some(2), 0));
    assert_eq!(
        attempt(&table, &client, "c", "tenant:42", 2).await,
        LimitedAttempt::Resized(3)
    );
    let (c, _) = permit(&table, &client, "c", "tenant:42", 3).await;
    assert_eq!(c, "tenant:42#2");
    assert_eq!(
        attempt(&table, &client, "d", "tenant:42", 3).await,
        LimitedAttempt::Full
    );

    // A limit of 0 admits nobody; the bounds are checked before any SQL.
    table.set_limit(&client, "paused", 0).await.unwrap();
    assert_eq!(
        attempt(&table, &client, "a", "paused", 0).await,
        LimitedAttempt::Full
    );
    let err = table.set_limit(&client, "x", 10_001).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidConfig);
    let err = table.set_limit(&client, "", 1).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidName);
}

#[tokio::test]
async fn a_lowered_limit_takes_the_highest_permits_back_after_their_fenced_transactions() {
    let (config, mut client) = super::setup().await;
    let table = LeaseTable::new(&config);
    let other = super::connect(&config).await;
    table.set_limit(&client, "jobs", 3).await.unwrap();
    let mut held = Vec::new();
    for owner in ["a", "b", "c"] {
        held.push((owner, permit(&table, &client, owner, "jobs", 3).await));
    }
    held.sort_by(|x, y| x.1.0.cmp(&y.1.0));
    let (top_owner, (top_slot, top_token)) = held[2].clone();
    assert_eq!(top_slot, "jobs#2");

    // The holder of the top slot writes under its permit...
    let tx = client.transaction().await.unwrap();
    (table.owner(top_owner).unwrap())
        .fence(&tx, &top_slot, top_token)
        .await
        .unwrap();
    // ...so lowering the limit waits for that transaction to end.
    let (_, lower) = change_waiting(&table, &config, &other, "jobs", 1).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !lower.is_finished(),
        "the change waits for the fenced transaction"
    );
    // Meanwhile it holds no other row: the middle slot (no transaction on it) was taken back at
    // once, and its holder's renewal answers at once, without it. (Waiting would last until the
    // fenced transaction below commits: bounded, it fails.)
    let (mid_owner, (mid_slot, mid_token)) = &held[1];
    let renewed = tokio::time::timeout(
        Duration::from_secs(2),
        (table.owner(mid_owner).unwrap()).renew(&other, &[(mid_slot.as_str(), *mid_token)], LEASE),
    )
    .await
    .expect("the renewal does not wait for the change")
    .unwrap();
    assert!(renewed.is_empty(), "{renewed:?}");
    tx.commit().await.unwrap();
    let (change, took) = lower.await.unwrap();
    let change = change.unwrap();
    assert!(took >= Duration::from_millis(300), "{took:?}");
    assert_eq!((change.previous, change.revoked), (Some(3), 2));

    // Slots 1 and 2 are gone: their holders renew and fence nothing.
    for (owner, (slot, token)) in &held[1..] {
        let renewed = (table.owner(owner).unwrap())
            .renew(&other, &[(slot.as_str(), *token)], LEASE)
            .await
            .unwrap();
        assert!(renewed.is_empty(), "{slot} taken back");
        let tx = client.transaction().await.unwrap();
        let err = (table.owner(owner).unwrap())
            .fence(&tx, slot, *token)
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::LockLost);
        tx.rollback().await.unwrap();
    }
    // Slot 0 is still its holder's, and nobody else is admitted.
    let (low_owner, (low_slot, low_token)) = &held[0];
    assert_eq!(low_slot, "jobs#0");
    let renewed = (table.owner(low_owner).unwrap())
        .renew(&other, &[(low_slot.as_str(), *low_token)], LEASE)
        .await
        .unwrap();
    assert_eq!(renewed, [*low_token]);
    assert_eq!(
        attempt(&table, &other, "d", "jobs", 3).await,
        LimitedAttempt::Full
    );

    // Raised again, the slots come back free, with greater tokens than before.
    table.set_limit(&other, "jobs", 3).await.unwrap();
    let (slot, token) = permit(&table, &other, "d", "jobs", 3).await;
    assert_ne!(slot, "jobs#0");
    assert!(token > top_token);
}

#[tokio::test]
async fn a_change_cut_off_while_it_takes_a_permit_back_is_finished_by_setting_it_again() {
    let (config, mut client) = super::setup().await;
    let table = LeaseTable::new(&config);
    let other = super::connect(&config).await;
    table.set_limit(&client, "pool", 2).await.unwrap();
    let mut held = [
        ("a", permit(&table, &client, "a", "pool", 2).await),
        ("b", permit(&table, &client, "b", "pool", 2).await),
    ];
    held.sort_by(|x, y| x.1.0.cmp(&y.1.0));
    let (top_owner, (top_slot, top_token)) = held[1].clone();
    assert_eq!(top_slot, "pool#1");
    let tx = client.transaction().await.unwrap();
    (table.owner(top_owner).unwrap())
        .fence(&tx, &top_slot, top_token)
        .await
        .unwrap();

    // Lowered on a session that is terminated while it waits for the fenced transaction.
    let (pid, lower) = change_waiting(&table, &config, &other, "pool", 1).await;
    (other.execute("SELECT pg_terminate_backend($1)", &[&pid]))
        .await
        .unwrap();
    let err = lower.await.unwrap().0.unwrap_err();
    assert!(err.to_string().contains("set it again to finish"), "{err}");

    // The limit is stored: nobody is admitted above it, though the fenced holder's permit is
    // not taken back yet.
    assert_eq!(table.limit(&other, "pool").await.unwrap(), Some(1));
    assert_eq!(
        attempt(&table, &other, "c", "pool", 1).await,
        LimitedAttempt::Full
    );
    tx.commit().await.unwrap();
    // Set again, the change finishes: the permit is taken back.
    let change = table.set_limit(&other, "pool", 1).await.unwrap();
    assert_eq!((change.previous, change.revoked), (Some(1), 1));
    let renewed = (table.owner(top_owner).unwrap())
        .renew(&other, &[(top_slot.as_str(), top_token)], LEASE)
        .await
        .unwrap();
    assert!(renewed.is_empty(), "taken back");
}

#[tokio::test]
async fn a_grant_answers_busy_instead_of_waiting_while_a_change_holds_the_limit() {
    let (config, client) = super::setup().await;
    let table = LeaseTable::new(&config);
    table.set_limit(&client, "pool", 2).await.unwrap();
    // The limit's row locked as a change's first statement locks it.
    let mut changing = super::connect(&config).await;
    let tx = changing.transaction().await.unwrap();
    let lock = format!(
        "SELECT 1 FROM {} WHERE name = 'pool' FOR UPDATE",
        config.limit_table().quoted()
    );
    assert_eq!(tx.execute(&lock, &[]).await.unwrap(), 1);
    let answer = tokio::time::timeout(
        Duration::from_secs(5),
        attempt(&table, &client, "a", "pool", 2),
    )
    .await
    .expect("answered without waiting for the change");
    assert_eq!(answer, LimitedAttempt::Busy);
    // Busy without an error (no `could not obtain lock` line in the server's log): an attempt
    // in the caller's own transaction leaves it usable.
    let mut own = super::connect(&config).await;
    let own_tx = own.transaction().await.unwrap();
    let answer = attempt(&table, &own_tx, "b", "pool", 2).await;
    assert_eq!(answer, LimitedAttempt::Busy);
    own_tx.execute("SELECT 1", &[]).await.expect("still usable");
    own_tx.rollback().await.unwrap();
    tx.rollback().await.unwrap();
    permit(&table, &client, "a", "pool", 2).await;
}

#[tokio::test]
async fn concurrent_changes_and_grants_never_admit_more_than_the_limit() {
    let (config, client) = super::setup().await;
    let table = LeaseTable::new(&config);
    table.set_limit(&client, "hot", 4).await.unwrap();
    // Eight owners take and give back permits while the limit moves between 4 and 1; after
    // each change, the permits held are at most the limit set.
    let mut takers = Vec::new();
    for i in 0..8 {
        let (table, config) = (table.clone(), config.clone());
        takers.push(tokio::spawn(async move {
            let client = super::connect(&config).await;
            let owner = format!("o{i}");
            let until = Instant::now() + Duration::from_secs(2);
            while Instant::now() < until {
                let known = table.limit(&client, "hot").await.unwrap().unwrap();
                if let LimitedAttempt::Granted { slot, grant } =
                    attempt(&table, &client, &owner, "hot", known.max(4)).await
                {
                    let request = pgcoord::lease::ReleaseRequest {
                        name: &slot,
                        token: grant.token,
                        keep: true,
                        announce_always: true,
                    };
                    let _ = table
                        .owner(&owner)
                        .unwrap()
                        .release(&client, &request)
                        .await;
                }
            }
        }));
    }
    let until = Instant::now() + Duration::from_secs(2);
    let mut limit = 4;
    let count_held = format!(
        "SELECT count(*) FROM {} WHERE name LIKE 'hot#%' AND owner IS NOT NULL
           AND expires_at > clock_timestamp()",
        config.lock_table().quoted()
    );
    let mut checks = 0;
    while Instant::now() < until {
        limit = if limit == 4 { 1 } else { 4 };
        table.set_limit(&client, "hot", limit).await.unwrap();
        for _ in 0..5 {
            let held: i64 = client.query_one(&count_held, &[]).await.unwrap().get(0);
            // Only a change can lower the limit, and only this task changes it.
            assert!(
                held <= i64::from(limit),
                "{held} held under a limit of {limit}"
            );
            checks += 1;
        }
    }
    for taker in takers {
        taker.await.unwrap();
    }
    assert!(checks > 10);
}
