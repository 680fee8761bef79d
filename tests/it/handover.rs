//! Handover: a release grants the lease to the waiter first in line in the same statement, and
//! announces the grant with its token, when that waiter's place stored what its grant would be.

use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use pgcoord::LeaseTable;
use pgcoord::lease::{Attempt, ReleaseRequest, Released};

use super::release::{announcements, next};
use super::{LEASE, grant};

/// Puts `owner` in line for `name` with a lost attempt (which stores its grant: `data`, and
/// whether it replaces a kept row's). Returns the attempt's nonce, new at every call.
async fn line_up(
    table: &LeaseTable,
    client: &tokio_postgres::Client,
    name: &str,
    owner: &str,
    data: Option<&[u8]>,
    replace_data: bool,
) -> i64 {
    static NONCES: AtomicI64 = AtomicI64::new(-1_000_000);
    let nonce = NONCES.fetch_sub(7, Ordering::Relaxed);
    let attempt = table
        .try_acquire_or_queue(client, name, owner, data, replace_data, LEASE, LEASE, nonce)
        .await
        .unwrap();
    assert!(matches!(attempt, Attempt::Held(Some(_))), "{attempt:?}");
    nonce
}

/// How many places are in line for `name`.
async fn in_line(config: &pgcoord::Config, client: &tokio_postgres::Client, name: &str) -> i64 {
    let sql = format!(
        "SELECT count(*) FROM {} WHERE name = $1",
        config.lock_queue().quoted()
    );
    client.query_one(&sql, &[&name]).await.unwrap().get(0)
}

#[tokio::test]
async fn a_release_hands_the_lease_to_the_first_waiter_and_announces_its_token() {
    let (config, client) = super::setup().await;
    let table = LeaseTable::new(&config);
    let oid = table.table_oid(&client).await.unwrap();
    let g = grant(&table, &client, "job", "holder", LEASE).await;
    let first = line_up(&table, &client, "job", "first", Some(b"mine"), false).await;
    let second = line_up(&table, &client, "job", "second", None, false).await;
    let (_listening, mut announced) = announcements(&config).await;
    table
        .release(&client, "job", "holder", g.token, false)
        .await
        .unwrap();
    let payload = next(&mut announced).await;
    let released = Released::parse(&payload).unwrap();
    let token = released
        .handed_to("first", oid)
        .expect("handed to the first in line");
    assert!(token > g.token, "{payload}");
    assert_eq!(released.handed_to("second", oid), None);
    // It names the attempt that wrote the place it was handed to.
    assert_eq!(released.nonce, Some(first), "{payload}");
    // It names the lock table: a process of another table on the channel does not take it.
    assert_eq!(released.table_oid, Some(oid));
    assert_eq!(released.handed_to("first", oid + 1), None);
    // The row says the same: the new holder, its token, its data, its whole lease.
    let info = table.get(&client, "job").await.unwrap();
    assert_eq!(
        (info.owner.as_deref(), info.token, info.data.as_deref()),
        (Some("first"), Some(token), Some(&b"mine"[..]))
    );
    assert!(info.remaining.unwrap() > LEASE - Duration::from_secs(5));
    // Out of the line; the second waits on, first in line now.
    assert_eq!(in_line(&config, &client, "job").await, 1);
    table
        .release(&client, "job", "first", token, false)
        .await
        .unwrap();
    let payload = next(&mut announced).await;
    let released = Released::parse(&payload).unwrap();
    assert!(released.handed_to("second", oid).is_some());
    assert_eq!(released.nonce, Some(second), "{payload}");
}

/// Every refused attempt writes its own nonce with the place, so a handover names the last
/// attempt before it; a place without one (written by an older version) is handed over with an
/// announcement that names none.
#[tokio::test]
async fn a_handover_names_the_nonce_of_the_last_attempt_that_wrote_the_place() {
    let (config, client) = super::setup().await;
    let table = LeaseTable::new(&config);
    let oid = table.table_oid(&client).await.unwrap();
    let (_listening, mut announced) = announcements(&config).await;
    let g = grant(&table, &client, "job", "holder", LEASE).await;
    let earlier = line_up(&table, &client, "job", "waiter", None, false).await;
    let last = line_up(&table, &client, "job", "waiter", None, false).await;
    assert_ne!(earlier, last);
    table
        .release(&client, "job", "holder", g.token, false)
        .await
        .unwrap();
    let payload = next(&mut announced).await;
    let released = Released::parse(&payload).unwrap();
    assert!(released.handed_to("waiter", oid).is_some(), "{payload}");
    assert_eq!(released.nonce, Some(last), "{payload}");
    // A place of an older version: no nonce stored, none announced.
    let token = released.handed_over.unwrap();
    line_up(&table, &client, "job", "old", None, false).await;
    client
        .execute(
            &format!(
                "UPDATE {} SET nonce = NULL WHERE name = 'job'",
                config.lock_queue().quoted()
            ),
            &[],
        )
        .await
        .unwrap();
    table
        .release(&client, "job", "waiter", token, false)
        .await
        .unwrap();
    let payload = next(&mut announced).await;
    let released = Released::parse(&payload).unwrap();
    assert!(released.handed_to("old", oid).is_some(), "{payload}");
    assert_eq!(released.nonce, None, "{payload}");
    assert!(!payload.contains('#'), "{payload}");
}

#[tokio::test]
async fn a_batch_release_hands_each_lease_to_its_first_waiter() {
    let (config, client) = super::setup().await;
    let table = LeaseTable::new(&config);
    let oid = table.table_oid(&client).await.unwrap();
    let a = grant(&table, &client, "a", "holder", LEASE).await;
    let b = grant(&table, &client, "b", "holder", LEASE).await;
    let c = grant(&table, &client, "c", "holder", LEASE).await;
    line_up(&table, &client, "a", "wa", None, false).await;
    line_up(&table, &client, "b", "wb", None, false).await;
    let (_listening, mut announced) = announcements(&config).await;
    let requests =
        [("a", a.token), ("b", b.token), ("c", c.token)].map(|(name, token)| ReleaseRequest {
            name,
            token,
            keep: false,
        });
    let released = table
        .release_many(&client, "holder", &requests)
        .await
        .unwrap();
    assert_eq!(released.len(), 3, "handed over or freed, each was released");
    let mut payloads = Vec::new();
    for _ in 0..3 {
        payloads.push(next(&mut announced).await);
    }
    let find = |name: &str| {
        (payloads.iter())
            .map(|p| Released::parse(p).unwrap())
            .find(|r| r.name == name)
            .unwrap()
    };
    assert_eq!(
        find("a").handed_to("wa", oid).map(|t| t > a.token),
        Some(true)
    );
    assert_eq!(
        find("b").handed_to("wb", oid).map(|t| t > b.token),
        Some(true)
    );
    let c_free = find("c");
    assert_eq!((c_free.reserved_for, c_free.handed_over), (None, None));
    for (name, owner) in [("a", Some("wa")), ("b", Some("wb"))] {
        assert_eq!(
            table.get(&client, name).await.unwrap().owner.as_deref(),
            owner
        );
    }
    assert!(table.get(&client, "c").await.is_err(), "c's row is gone");
}

#[tokio::test]
async fn a_kept_rows_data_is_handed_only_to_a_waiter_that_replaces_it() {
    let (config, client) = super::setup().await;
    let table = LeaseTable::new(&config);
    let oid = table.table_oid(&client).await.unwrap();
    let (_listening, mut announced) = announcements(&config).await;
    // A waiter that would keep the row's data: announced, not handed the lease (its process
    // could not know the data it would hold); the row stays free with its data.
    let g = match table
        .try_acquire(&client, "job", "holder", Some(b"kept"), true, LEASE)
        .await
        .unwrap()
    {
        Attempt::Granted(g) => g,
        other => panic!("{other:?}"),
    };
    line_up(&table, &client, "job", "keeper", Some(b"theirs"), false).await;
    table
        .release(&client, "job", "holder", g.token, true)
        .await
        .unwrap();
    assert_eq!(next(&mut announced).await, "3:jobkeeper");
    let info = table.get(&client, "job").await.unwrap();
    assert_eq!(
        (info.owner, info.data.as_deref()),
        (None, Some(&b"kept"[..]))
    );
    // It asks itself, as before handover, and gets the kept data.
    let Attempt::Granted(g) = table
        .try_acquire_or_queue(
            &client,
            "job",
            "keeper",
            Some(b"theirs"),
            false,
            LEASE,
            LEASE,
            3,
        )
        .await
        .unwrap()
    else {
        panic!("the first in line is granted")
    };
    assert_eq!(g.data.as_deref(), Some(&b"kept"[..]));
    // A waiter that replaces the data is handed the lease with its own.
    line_up(&table, &client, "job", "replacer", Some(b"new"), true).await;
    table
        .release(&client, "job", "keeper", g.token, true)
        .await
        .unwrap();
    let payload = next(&mut announced).await;
    let token = Released::parse(&payload)
        .unwrap()
        .handed_to("replacer", oid);
    let info = table.get(&client, "job").await.unwrap();
    assert_eq!(
        (info.token, info.data.as_deref()),
        (token, Some(&b"new"[..]))
    );
}

#[tokio::test]
async fn a_place_without_a_stored_grant_or_lapsed_is_announced_not_handed_over() {
    let (config, client) = super::setup().await;
    let table = LeaseTable::new(&config);
    let (_listening, mut announced) = announcements(&config).await;
    // `enqueue` (a waiter that did not attempt, or of a version before handover) stores none.
    let g = grant(&table, &client, "job", "holder", LEASE).await;
    table.enqueue(&client, "job", "old", LEASE).await.unwrap();
    table
        .release(&client, "job", "holder", g.token, false)
        .await
        .unwrap();
    assert_eq!(next(&mut announced).await, "3:jobold");
    assert!(table.get(&client, "job").await.is_err(), "the row is gone");
    table.dequeue(&client, "job", "old").await.unwrap();
    // A place that lapsed is nobody's.
    let g = grant(&table, &client, "job", "holder", LEASE).await;
    let attempt = table
        .try_acquire_or_queue(
            &client,
            "job",
            "gone",
            None,
            false,
            LEASE,
            Duration::from_millis(1),
            4,
        )
        .await
        .unwrap();
    assert!(matches!(attempt, Attempt::Held(Some(_))));
    tokio::time::sleep(Duration::from_millis(20)).await;
    table
        .release(&client, "job", "holder", g.token, false)
        .await
        .unwrap();
    // The dequeue above may announce too (it was first and the lease free): skip to this one.
    let mut payload = next(&mut announced).await;
    while payload != "3:job" {
        payload = next(&mut announced).await;
    }
    assert!(table.get(&client, "job").await.is_err());
}

#[tokio::test]
async fn a_releaser_in_line_for_its_own_lease_is_passed_over_and_leaves_the_line() {
    let (config, client) = super::setup().await;
    let table = LeaseTable::new(&config);
    let oid = table.table_oid(&client).await.unwrap();
    // A holder in line for what it holds: a refused attempt of its own that raced a handover
    // to it. Its release must not hand the lease back to it, nor leave it first in line.
    let g = grant(&table, &client, "job", "holder", LEASE).await;
    line_up(&table, &client, "job", "holder", None, false).await;
    line_up(&table, &client, "job", "waiter", None, false).await;
    let (_listening, mut announced) = announcements(&config).await;
    table
        .release(&client, "job", "holder", g.token, false)
        .await
        .unwrap();
    let payload = next(&mut announced).await;
    assert!(
        Released::parse(&payload)
            .unwrap()
            .handed_to("waiter", oid)
            .is_some(),
        "{payload}"
    );
    assert_eq!(in_line(&config, &client, "job").await, 0);
    // The same in a batch, and when the only other place stores no grant: it is announced.
    let info = table.get(&client, "job").await.unwrap();
    line_up(&table, &client, "job", "waiter", None, false).await;
    table.enqueue(&client, "job", "old", LEASE).await.unwrap();
    let request = ReleaseRequest {
        name: "job",
        token: info.token.unwrap(),
        keep: false,
    };
    assert_eq!(
        table
            .release_many(&client, "waiter", &[request])
            .await
            .unwrap()
            .len(),
        1
    );
    assert_eq!(next(&mut announced).await, "3:jobold");
    assert_eq!(
        in_line(&config, &client, "job").await,
        1,
        "only old's place"
    );
}

/// A waiter whose process died after it got in line is handed the lease all the same; nobody
/// renews it, so the next waiter gets it when that lease ends (the dead waiter's own lease),
/// not when the dead waiter's place would have lapsed (twice its lease).
#[tokio::test]
async fn a_lease_handed_to_a_waiter_that_died_is_free_when_its_lease_ends() {
    let (config, client) = super::setup().await;
    let table = LeaseTable::new(&config);
    let g = grant(&table, &client, "job", "holder", LEASE).await;
    let short = Duration::from_millis(300);
    let attempt = table
        .try_acquire_or_queue(&client, "job", "dead", None, false, short, LEASE, 1)
        .await
        .unwrap();
    assert!(matches!(attempt, Attempt::Held(Some(_))));
    line_up(&table, &client, "job", "next", None, false).await;
    table
        .release(&client, "job", "holder", g.token, false)
        .await
        .unwrap();
    let ask = || table.try_acquire_or_queue(&client, "job", "next", None, false, LEASE, LEASE, 2);
    match ask().await.unwrap() {
        Attempt::Held(Some(holder)) => assert_eq!(holder.owner, "dead"),
        other => panic!("{other:?}"),
    }
    tokio::time::sleep(short + Duration::from_millis(100)).await;
    assert!(matches!(ask().await.unwrap(), Attempt::Granted(_)));
}

/// A handed lease's expiry counts from when the release wrote the row, not from its
/// transaction's start: the waiter counts its deadline from its attempt, which may come after
/// the start of a long transaction that then releases (or of a release queued behind a table
/// lock). Here the release runs in a transaction begun a second before the waiter lined up.
#[tokio::test]
async fn a_handed_lease_expires_a_lease_after_the_release_wrote_it() {
    let (config, mut client) = super::setup().await;
    let table = LeaseTable::new(&config);
    let g = grant(&table, &client, "job", "holder", LEASE).await;
    let waiter = super::connect(&config).await;
    let tx = client.transaction().await.unwrap();
    tx.batch_execute("SELECT pg_sleep(1)").await.unwrap();
    let lined_up: std::time::SystemTime = waiter
        .query_one("SELECT clock_timestamp()", &[])
        .await
        .unwrap()
        .get(0);
    line_up(&table, &waiter, "job", "waiter", None, false).await;
    table
        .release(&tx, "job", "holder", g.token, false)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let expires: std::time::SystemTime = client
        .query_one(
            &format!(
                "SELECT expires_at FROM {} WHERE name = 'job' AND owner = 'waiter'",
                config.lock_table().quoted()
            ),
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let lease = expires.duration_since(lined_up).unwrap();
    assert!(
        lease >= LEASE,
        "expires {lease:?} after the waiter lined up"
    );
}
