//! Batched statements do what the single ones would: a batch acquire grants what single attempts
//! would, a batch release releases what single releases would, and both skip rows another
//! transaction holds instead of waiting for them.

use std::time::Duration;

use pgcoord::lease::{AcquireRequest, Attempt, MAX_NAMES_PER_STATEMENT, ReleaseRequest};
use pgcoord::{ErrorKind, LeaseTable};

use super::release::{announcements, next};
use super::{LEASE, grant};

/// The batch acquire grants exactly what single attempts would, and never waits on a row
/// another transaction holds.
#[tokio::test]
async fn a_batch_acquire_grants_what_single_attempts_would_and_skips_locked_rows() {
    let (config, client) = super::setup().await;
    let other = super::connect(&config).await;
    let table = LeaseTable::new(&config);
    // held: someone else's live lease. expired: someone else's, lapsed. reserved: free, but
    // its next grant reserved for another waiter. kept: free, kept with data. fenced: a row
    // another transaction holds locked.
    grant(&table, &client, "held", "other", LEASE).await;
    grant(
        &table,
        &client,
        "expired",
        "other",
        Duration::from_millis(1),
    )
    .await;
    let r = grant(&table, &client, "reserved", "other", LEASE).await;
    super::in_line(&table, &client, "reserved", "waiter", LEASE).await;
    super::release(&table, &client, "reserved", "other", r.token, false).await;
    let k = grant(&table, &client, "kept", "other", LEASE).await;
    super::release(&table, &client, "kept", "other", k.token, true).await;
    client
        .execute(
            &format!(
                "UPDATE {} SET data = 'old' WHERE name = 'kept'",
                config.lock_table().quoted()
            ),
            &[],
        )
        .await
        .unwrap();
    let f = grant(&table, &client, "fenced", "other", Duration::from_millis(1)).await;
    tokio::time::sleep(Duration::from_millis(5)).await;
    let mut fence = super::connect(&config).await;
    let tx = fence.transaction().await.unwrap();
    tx.execute(
        &format!(
            "SELECT 1 FROM {} WHERE name = 'fenced' FOR UPDATE",
            config.lock_table().quoted()
        ),
        &[],
    )
    .await
    .unwrap();

    let request = |name| AcquireRequest::new(name).data(b"new".as_slice());
    let requests = [
        request("new"),
        request("held"),
        request("expired"),
        request("reserved"),
        request("kept"),
        AcquireRequest {
            replace_data: true,
            ..request("kept-replaced")
        },
        request("fenced"),
    ];
    let started = std::time::Instant::now();
    let granted = table
        .owner("me")
        .unwrap()
        .try_acquire_many(&other, &requests, LEASE)
        .await
        .unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "no wait on the locked row"
    );
    let mut names: Vec<&str> = granted.keys().map(String::as_str).collect();
    names.sort();
    assert_eq!(names, ["expired", "kept", "kept-replaced", "new"]);
    assert_eq!(
        granted["kept"].data.as_deref(),
        Some(b"old".as_slice()),
        "kept data stays"
    );
    assert_eq!(granted["new"].data.as_deref(), Some(b"new".as_slice()));
    let mut tokens: Vec<i64> = granted.values().map(|g| g.token).collect();
    tokens.sort();
    tokens.dedup();
    assert_eq!(tokens.len(), 4, "a token per grant");
    assert!(tokens[0] > f.token, "tokens keep increasing");
    // What the server says matches: the grants are ours, the rest untouched.
    for name in ["new", "expired", "kept"] {
        let info = table.get(&client, name).await.unwrap();
        assert_eq!(
            (info.owner.as_deref(), info.token),
            (Some("me"), Some(granted[name].token))
        );
    }
    assert_eq!(
        table.get(&client, "held").await.unwrap().owner.as_deref(),
        Some("other")
    );
    // Another waiter is first in line for "reserved": not granted, nothing changed.
    let reserved = table.get(&client, "reserved").await;
    assert!(
        !matches!(&reserved, Ok(info) if info.owner.is_some()),
        "{reserved:?}"
    );
    tx.rollback().await.unwrap();
    // Bad names are refused before any SQL, and nothing is granted.
    let err = table
        .owner("me")
        .unwrap()
        .try_acquire_many(&other, &[request("ok"), request("")], LEASE)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidName, "{err}");
    assert_eq!(
        table.get(&client, "ok").await.unwrap_err().kind(),
        ErrorKind::NotFound
    );
    // So is a batch of more names than one statement may take grant locks for.
    let names: Vec<String> = (0..=MAX_NAMES_PER_STATEMENT)
        .map(|i| format!("m{i}"))
        .collect();
    let requests: Vec<_> = names.iter().map(|n| request(n)).collect();
    let owner = table.owner("me").unwrap();
    let err = owner
        .try_acquire_many(&other, &requests, LEASE)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{err}");
    assert_eq!(
        table.get(&client, "m0").await.unwrap_err().kind(),
        ErrorKind::NotFound
    );
    let granted = owner
        .try_acquire_many(&other, &requests[1..], LEASE)
        .await
        .unwrap();
    assert_eq!(
        granted.len(),
        MAX_NAMES_PER_STATEMENT,
        "the most names, all granted"
    );
}

#[tokio::test]
async fn a_batch_release_does_what_single_releases_would_and_skips_locked_rows() {
    let (config, client) = super::setup().await;
    let table = LeaseTable::new(&config);
    let (listening, mut announced) = announcements(&config).await;
    let plain = grant(&table, &client, "plain", "me", LEASE).await;
    let kept = grant(&table, &client, "kept", "me", LEASE).await;
    let reserved = grant(&table, &client, "reserved", "me", LEASE).await;
    super::in_line(&table, &client, "reserved", "waiter", LEASE).await;
    let lost = grant(&table, &client, "lost", "me", LEASE).await;
    let locked = grant(&table, &client, "locked", "me", LEASE).await;
    // "lost" was taken over (another token now); "locked" is a row another transaction holds.
    client
        .execute(
            &format!(
                "UPDATE {} SET token = token + 1000000 WHERE name = 'lost'",
                config.lock_table().quoted()
            ),
            &[],
        )
        .await
        .unwrap();
    let mut fence = super::connect(&config).await;
    let tx = fence.transaction().await.unwrap();
    table
        .owner("me")
        .unwrap()
        .fence(&tx, "locked", locked.token)
        .await
        .unwrap();

    let request = |name, token, keep| ReleaseRequest {
        name,
        token,
        keep,
        announce_always: false,
    };
    let started = std::time::Instant::now();
    let released = table
        .owner("me")
        .unwrap()
        .release_many(
            &client,
            &[
                request("plain", plain.token, false),
                request("kept", kept.token, true),
                request("reserved", reserved.token, false),
                request("lost", lost.token, false),
                request("locked", locked.token, false),
            ],
        )
        .await
        .unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "no wait on the locked row"
    );
    let mut names: Vec<&str> = released.iter().map(String::as_str).collect();
    names.sort();
    assert_eq!(names, ["kept", "plain", "reserved"]);
    // As single releases leave them: deleted, kept free, free for the waiter; the others as
    // they were.
    assert_eq!(
        table.get(&client, "plain").await.unwrap_err().kind(),
        ErrorKind::NotFound
    );
    let info = table.get(&client, "kept").await.unwrap();
    assert_eq!((info.owner, info.token), (None, None));
    assert_eq!(
        table.get(&client, "reserved").await.unwrap_err().kind(),
        ErrorKind::NotFound
    );
    assert!(matches!(
        table
            .owner("me")
            .unwrap()
            .try_acquire(&client, &AcquireRequest::new("reserved"), LEASE)
            .await
            .unwrap(),
        Attempt::Held(_)
    ));
    assert_eq!(
        table.get(&client, "lost").await.unwrap().owner.as_deref(),
        Some("me")
    );
    assert!(table.get(&client, "locked").await.unwrap().is_held());
    // Only the lease someone waits for is announced.
    assert_eq!(next(&mut announced).await, "8:reservedwaiter");
    super::release::ring_marker(&config, &listening).await;
    assert_eq!(next(&mut announced).await, super::release::MARKER);
    // The skipped row, released alone once the guard ends; the lost one tells its caller.
    tx.rollback().await.unwrap();
    super::release(&table, &client, "locked", "me", locked.token, false).await;
    let err = table
        .owner("me")
        .unwrap()
        .release(
            &client,
            &ReleaseRequest {
                name: "lost",
                token: lost.token,
                keep: false,
                announce_always: false,
            },
        )
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::LockLost);
    // Bad names are refused before any SQL.
    let err = table
        .owner("me")
        .unwrap()
        .release_many(&client, &[request("", 1, false)])
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidName);
}
