//! Lease statements on their own: tokens, renewal, the fencing guard, owner matching, the data a
//! takeover leaves, and freeing the grants of an attempt whose answer was lost.

use std::time::Duration;

use pgcoord::lease::{AcquireRequest, Attempt, ReleaseRequest};
use pgcoord::{ErrorKind, LeaseTable};

use super::{LEASE, grant};

#[tokio::test]
async fn tokens_strictly_increase_and_survive_a_server_restart() {
    let server = pgcoord_testkit::TempPostgres::start().unwrap();
    let config = pgcoord::Config::builder()
        .pg_config(&server.pg_config())
        .build()
        .unwrap();
    let client = super::connect(&config).await;
    pgcoord::schema::migrate(&client, &config).await.unwrap();
    let table = LeaseTable::new(&config);
    let mut last = 0;
    for i in 0..20 {
        let g = grant(&table, &client, &format!("n{}", i % 3), "me", LEASE).await;
        assert!(g.token > last);
        last = g.token;
        table
            .owner("me")
            .unwrap()
            .release(
                &client,
                &ReleaseRequest {
                    name: &format!("n{}", i % 3),
                    token: g.token,
                    keep: false,
                    announce_always: false,
                },
            )
            .await
            .unwrap();
    }
    drop(client);
    server.restart().unwrap();
    let client = super::connect(&config).await;
    let after = grant(&table, &client, "n0", "me", LEASE).await;
    assert!(after.token > last, "{} after {last}", after.token);
}

#[tokio::test]
async fn renew_never_inserts_steals_or_revives() {
    let (config, client) = super::setup().await;
    let table = LeaseTable::new(&config);
    let a = grant(&table, &client, "a", "me", LEASE).await;
    let short = grant(&table, &client, "short", "me", Duration::from_millis(50)).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let held = vec![
        ("a".to_string(), a.token),
        ("short".to_string(), short.token),
        ("missing".to_string(), 1),
        ("a".to_string(), a.token + 1000),
    ];
    let renewed = table
        .owner("me")
        .unwrap()
        .renew(&client, &held, LEASE)
        .await
        .unwrap();
    assert_eq!(renewed, vec![a.token]);
    assert_eq!(
        table.get(&client, "missing").await.unwrap_err().kind(),
        ErrorKind::NotFound
    );
    let info = table.get(&client, "short").await.unwrap();
    assert_eq!(
        info.remaining,
        Some(Duration::ZERO),
        "expired stays expired"
    );
    assert!(!info.is_held());
}

#[tokio::test]
async fn the_fencing_guard_rejects_stale_tokens_and_holds_off_takeover() {
    let (config, mut client) = super::setup().await;
    let table = LeaseTable::new(&config);
    let other = super::connect(&config).await;
    let short = Duration::from_millis(300);
    let g = grant(&table, &client, "job", "me", short).await;

    // A guarded transaction keeps the lease from being taken over until it ends...
    let tx = client.transaction().await.unwrap();
    table
        .owner("me")
        .unwrap()
        .fence(&tx, "job", g.token)
        .await
        .unwrap();
    // ...while the holder can still renew.
    let renewed = table
        .owner("me")
        .unwrap()
        .renew(&other, &[("job", g.token)], short)
        .await
        .unwrap();
    assert_eq!(renewed.len(), 1);
    tokio::time::sleep(short + Duration::from_millis(100)).await;
    // Expired, but guarded: a takeover does not wait for the guard (it would hold a connection
    // for as long as the guarded transaction lasts); it answers Busy at once.
    // (Waiting would last until the guarded transaction below commits: bounded, it fails.)
    let attempt = tokio::time::timeout(
        Duration::from_secs(1),
        (table.owner("thief").unwrap()).try_acquire(&other, &AcquireRequest::new("job"), LEASE),
    )
    .await
    .expect("the takeover does not wait")
    .unwrap();
    assert_eq!(attempt, Attempt::Busy, "takeover is held off by the guard");
    tx.commit().await.unwrap();
    let Attempt::Granted(new) = table
        .owner("thief")
        .unwrap()
        .try_acquire(&other, &AcquireRequest::new("job"), LEASE)
        .await
        .unwrap()
    else {
        panic!("expired lease should be taken over after the guard ends")
    };

    // The stale token is rejected from now on.
    let tx = client.transaction().await.unwrap();
    let err = table
        .owner("me")
        .unwrap()
        .fence(&tx, "job", g.token)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::LockLost);
    tx.rollback().await.unwrap();
    let tx = client.transaction().await.unwrap();
    table
        .owner("thief")
        .unwrap()
        .fence(&tx, "job", new.token)
        .await
        .unwrap();
    tx.commit().await.unwrap();
}

#[tokio::test]
async fn bad_names_and_durations_are_rejected_before_sql() {
    let (config, client) = super::setup().await;
    let table = LeaseTable::new(&config);
    let long = "x".repeat(256);
    for (name, owner) in [
        ("", "me"),
        (long.as_str(), "me"),
        ("ok", ""),
        ("ok", long.as_str()),
    ] {
        // A bad owner is refused when it is bound, a bad name by the attempt.
        let err = match table.owner(owner) {
            Ok(owner) => (owner.try_acquire(&client, &AcquireRequest::new(name), LEASE))
                .await
                .unwrap_err(),
            Err(e) => e,
        };
        assert_eq!(err.kind(), ErrorKind::InvalidName);
    }
    let err = table
        .owner("me")
        .unwrap()
        .try_acquire(&client, &AcquireRequest::new("ok"), Duration::ZERO)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::DurationTooSmall);
    assert!(table.list(&client).await.unwrap().is_empty());
}

#[tokio::test]
async fn pooled_connections_prepare_each_statement_once_and_survive_schema_changes() {
    let (config, admin) = super::setup().await;
    let config = super::builder()
        .lock_table(config.lock_table().to_string())
        .pool_size(1)
        .build()
        .unwrap();
    let (pool, table) = (pgcoord::Pool::new(&config), LeaseTable::new(&config));
    // This session's prepared acquire and release statements.
    let prepared = "SELECT count(*) FROM pg_prepared_statements
                    WHERE statement LIKE 'WITH locked%' OR statement LIKE 'WITH ended%'";
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let conn = pool.checkout(deadline).await.unwrap();
    let g = grant(&table, &*conn, "a", "me", LEASE).await;
    super::release(&table, &*conn, "a", "me", g.token, false).await;
    let after_first: i64 = conn.client().query_one(prepared, &[]).await.unwrap().get(0);
    assert_eq!(after_first, 2, "acquire and release prepared");
    for _ in 0..5 {
        let g = grant(&table, &*conn, "a", "me", LEASE).await;
        super::release(&table, &*conn, "a", "me", g.token, false).await;
    }
    let after_more: i64 = conn.client().query_one(prepared, &[]).await.unwrap().get(0);
    assert_eq!(after_more, after_first, "not prepared again");

    // The table is dropped and created again with another shape behind the pool's back.
    pgcoord::schema::drop_tables(&admin, &config).await.unwrap();
    pgcoord::schema::migrate(&admin, &config).await.unwrap();
    admin
        .batch_execute(&format!(
            "ALTER TABLE {} ADD COLUMN extra int",
            config.lock_table().quoted()
        ))
        .await
        .unwrap();
    grant(&table, &*conn, "b", "me", LEASE).await;
}

/// Renewal, release (single and batched), proclamation and the fencing guard match the owner as
/// well as the token: a process that came to believe it holds another's token (a forged
/// handover announcement, say) renews, releases, proclaims and fences nothing of the holder's.
#[tokio::test]
async fn a_token_without_its_owner_renews_releases_or_fences_nothing() {
    let (config, mut client) = super::setup().await;
    let table = LeaseTable::new(&config);
    let g = grant(&table, &client, "job", "holder", LEASE).await;
    let renewed = table
        .owner("thief")
        .unwrap()
        .renew(&client, &[("job", g.token)], LEASE * 2)
        .await
        .unwrap();
    assert!(renewed.is_empty(), "renewed another's lease");
    let err = table
        .owner("thief")
        .unwrap()
        .release(
            &client,
            &ReleaseRequest {
                name: "job",
                token: g.token,
                keep: false,
                announce_always: false,
            },
        )
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::LockLost);
    let request = pgcoord::lease::ReleaseRequest {
        name: "job",
        token: g.token,
        keep: false,
        announce_always: false,
    };
    let released = table
        .owner("thief")
        .unwrap()
        .release_many(&client, &[request])
        .await
        .unwrap();
    assert!(released.is_empty(), "released another's lease in a batch");
    let err = table
        .owner("thief")
        .unwrap()
        .proclaim(&client, "job", g.token, b"forged")
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::LockLost);
    let tx = client.transaction().await.unwrap();
    let err = table
        .owner("thief")
        .unwrap()
        .fence(&tx, "job", g.token)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::LockLost);
    tx.rollback().await.unwrap();
    // The holder's lease is as it was, and its owner still renews and releases it.
    let info = table.get(&client, "job").await.unwrap();
    assert_eq!(
        (info.owner.as_deref(), info.token, info.data),
        (Some("holder"), Some(g.token), None)
    );
    assert!(info.remaining.unwrap() <= LEASE);
    let renewed = table
        .owner("holder")
        .unwrap()
        .renew(&client, &[("job", g.token)], LEASE)
        .await
        .unwrap();
    assert_eq!(renewed, vec![g.token]);
    super::release(&table, &client, "job", "holder", g.token, false).await;
}

/// A lease taken over after its holder's expiry is the new holder's, data included: the dead
/// holder's data never passes to it (on a plain attempt and in a batch). Only a kept row's data
/// outlives its tenure, and `replace_data` replaces that.
#[tokio::test]
async fn a_takeover_never_keeps_the_dead_holders_data_only_a_kept_rows() {
    let (config, client) = super::setup().await;
    let table = LeaseTable::new(&config);
    let short = Duration::from_millis(50);
    for name in ["single", "batched"] {
        let dead = table.owner("dead").unwrap();
        let request = AcquireRequest::new(name).data(b"dead's");
        assert!(matches!(
            dead.try_acquire(&client, &request, short).await.unwrap(),
            Attempt::Granted(_)
        ));
    }
    tokio::time::sleep(short * 3).await;
    let next = table.owner("next").unwrap();
    let Attempt::Granted(single) =
        (next.try_acquire(&client, &AcquireRequest::new("single").data(b"mine"), LEASE))
            .await
            .unwrap()
    else {
        panic!("expired: taken over")
    };
    assert_eq!(single.data.as_deref(), Some(&b"mine"[..]));
    let batch = [AcquireRequest::new("batched"), AcquireRequest::new("other")];
    let granted = next.try_acquire_many(&client, &batch, LEASE).await.unwrap();
    assert_eq!(granted["batched"].data, None, "no data asked, none kept");
    let info = table.get(&client, "single").await.unwrap();
    assert_eq!(info.data.as_deref(), Some(&b"mine"[..]));
    // Kept on release, the data waits for the next holder, unless it replaces it.
    let release = ReleaseRequest {
        name: "single",
        token: single.token,
        keep: true,
        announce_always: false,
    };
    next.release(&client, &release).await.unwrap();
    let third = table.owner("third").unwrap();
    let kept = AcquireRequest::new("single").data(b"third's");
    let Attempt::Granted(g) = third.try_acquire(&client, &kept, LEASE).await.unwrap() else {
        panic!("free")
    };
    assert_eq!(
        g.data.as_deref(),
        Some(&b"mine"[..]),
        "a kept row's data stays"
    );
    let release = ReleaseRequest {
        name: "single",
        token: g.token,
        keep: true,
        announce_always: false,
    };
    third.release(&client, &release).await.unwrap();
    let Attempt::Granted(g) = third
        .try_acquire(&client, &kept.replace_data(), LEASE)
        .await
        .unwrap()
    else {
        panic!("free")
    };
    assert_eq!(g.data.as_deref(), Some(&b"third's"[..]));
}

/// After an attempt whose outcome is unknown, `release_orphans` frees whatever of its names
/// the owner holds, whatever the token — and nothing of anyone else's.
#[tokio::test]
async fn release_orphans_frees_the_owners_grants_among_the_names_and_nothing_else() {
    let (config, client) = super::setup().await;
    let table = LeaseTable::new(&config);
    let mine = grant(&table, &client, "mine", "me", LEASE).await;
    grant(&table, &client, "theirs", "them", LEASE).await;
    grant(&table, &client, "elsewhere", "me", LEASE).await;
    let me = table.owner("me").unwrap();
    let names = ["mine", "theirs", "missing"];
    assert!(me.release_orphans(&client, &names, false).await.unwrap());
    assert_eq!(
        table.get(&client, "mine").await.unwrap_err().kind(),
        ErrorKind::NotFound
    );
    assert_eq!(
        table.get(&client, "theirs").await.unwrap().owner.as_deref(),
        Some("them")
    );
    assert!(table.get(&client, "elsewhere").await.unwrap().is_held());
    // Nothing left: true again, and nothing sent but the look.
    assert!(me.release_orphans(&client, &names, false).await.unwrap());
    // The token that was freed is lost for good.
    let err = me.fence(&client, "mine", mine.token).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::LockLost);
}

#[tokio::test]
async fn notify_holder_reaches_the_holders_channel_as_computed_here_and_nobody_else() {
    let (config, client) = super::setup().await;
    let table = LeaseTable::new(&config);
    // A non-ASCII owner: the server hashes its UTF-8 bytes, as `holder_channel` does.
    let (owner, scope) = ("hôte-1", "lock table 7:pool");
    let (listening, mut heard) = pgcoord::__private::connect(&config).await.unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Some(Ok(m)) = futures_util::future::poll_fn(|cx| heard.poll_message(cx)).await {
            if let tokio_postgres::AsyncMessage::Notification(n) = m {
                let _ = tx.send((n.channel().to_owned(), n.payload().to_owned()));
            }
        }
    });
    let channel = pgcoord::lease::holder_channel(scope, owner);
    listening
        .batch_execute(&format!("LISTEN \"{channel}\""))
        .await
        .unwrap();
    // Nobody holds it yet: nothing sent.
    assert_eq!(
        table
            .notify_holder(&client, "k", scope, "early")
            .await
            .unwrap(),
        None
    );
    let g = grant(&table, &client, "k", owner, LEASE).await;
    let sent = table
        .notify_holder(&client, "k", scope, "hello")
        .await
        .unwrap();
    assert_eq!(sent.as_deref(), Some(owner));
    let got = tokio::time::timeout(Duration::from_secs(5), rx.recv())
        .await
        .unwrap();
    assert_eq!(got, Some((channel.clone(), "hello".to_owned())));
    // Many in one statement: each to its holder, in order; nothing for a lease nobody holds.
    let items = [
        ("k", scope, "b1"),
        ("nobody", scope, "b2"),
        ("k", scope, "b3"),
    ];
    let sent = table.notify_holders(&client, &items).await.unwrap();
    assert_eq!(
        sent,
        vec![Some(owner.to_owned()), None, Some(owner.to_owned())]
    );
    for text in ["b1", "b3"] {
        let got = tokio::time::timeout(Duration::from_secs(5), rx.recv())
            .await
            .unwrap();
        assert_eq!(got, Some((channel.clone(), text.to_owned())));
    }
    // Another scope is another channel: sent, but not here.
    assert!(
        table
            .notify_holder(&client, "k", "other", "x")
            .await
            .unwrap()
            .is_some()
    );
    // Released: nobody holds it, nothing sent.
    table
        .owner(owner)
        .unwrap()
        .release(
            &client,
            &ReleaseRequest {
                name: "k",
                token: g.token,
                keep: false,
                announce_always: false,
            },
        )
        .await
        .unwrap();
    assert_eq!(
        table
            .notify_holder(&client, "k", scope, "late")
            .await
            .unwrap(),
        None
    );
    // An expired lease has no holder either.
    grant(&table, &client, "short", owner, Duration::from_millis(20)).await;
    tokio::time::sleep(Duration::from_millis(60)).await;
    assert_eq!(
        table
            .notify_holder(&client, "short", scope, "late")
            .await
            .unwrap(),
        None
    );
    // The marker on our channel comes next: nothing else was heard in between.
    listening
        .execute("SELECT pg_notify($1, 'marker')::text", &[&channel])
        .await
        .unwrap();
    let got = tokio::time::timeout(Duration::from_secs(5), rx.recv())
        .await
        .unwrap();
    assert_eq!(got, Some((channel, "marker".to_owned())));
}

#[tokio::test]
async fn keep_free_records_a_name_without_granting_it_and_never_touches_a_held_one() {
    let (config, client) = super::setup().await;
    let table = LeaseTable::new(&config);
    assert!(table.keep_free(&client, "pool/keys/new").await.unwrap());
    assert!(
        !table.keep_free(&client, "pool/keys/new").await.unwrap(),
        "once"
    );
    let info = table.get(&client, "pool/keys/new").await.unwrap();
    assert_eq!((info.owner, info.token, info.remaining), (None, None, None));
    let listed = table.list_prefix(&client, "pool/keys/").await.unwrap();
    assert_eq!(listed.len(), 1);
    // Free: anyone is granted it.
    let g = grant(&table, &client, "pool/keys/new", "me", LEASE).await;
    // Held: recording it again changes nothing.
    assert!(!table.keep_free(&client, "pool/keys/new").await.unwrap());
    let info = table.get(&client, "pool/keys/new").await.unwrap();
    assert_eq!(
        (info.owner.as_deref(), info.token),
        (Some("me"), Some(g.token))
    );
    assert_eq!(
        table.keep_free(&client, "").await.unwrap_err().kind(),
        ErrorKind::InvalidName
    );
}

#[tokio::test]
async fn poll_only_statements_notify_nothing_and_reaching_a_holder_is_refused() {
    let (config, client) = super::setup().await;
    let config = pgcoord::Config::builder()
        .pg_config(config.pg_config())
        .lock_table(config.lock_table().to_string().trim_matches('"'))
        .poll_only(true)
        .build()
        .unwrap();
    let table = LeaseTable::new(&config);
    grant(&table, &client, "held", "me", LEASE).await;
    let err = table
        .notify_holder(&client, "held", "scope", "hello")
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unsupported, "{err}");
    let err = table
        .notify_holders(&client, &[("held", "scope", "hello")])
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unsupported);
}

/// An attempt on a name whose row another transaction holds answers `Busy` without raising an
/// error: a contended name puts no ERROR line in the server's log, and an attempt run in the
/// caller's own transaction leaves that transaction usable — also for a waiter's attempt, which
/// then writes nothing (not even its place in line).
#[tokio::test]
async fn a_busy_row_answers_busy_without_an_error() {
    let (config, mut client) = super::setup().await;
    let table = LeaseTable::new(&config);
    let mut other = super::connect(&config).await;
    let g = grant(&table, &client, "busy", "me", LEASE).await;
    let locker = client.transaction().await.unwrap();
    table
        .owner("me")
        .unwrap()
        .fence(&locker, "busy", g.token)
        .await
        .unwrap();
    let theirs = other.transaction().await.unwrap();
    let thief = table.owner("thief").unwrap();
    let request = AcquireRequest::new("busy");
    assert_eq!(
        thief.try_acquire(&theirs, &request, LEASE).await.unwrap(),
        Attempt::Busy
    );
    assert_eq!(
        (thief.try_acquire_or_queue(&theirs, &request, LEASE, LEASE))
            .await
            .unwrap(),
        Attempt::Busy
    );
    // The caller's transaction goes on, and nothing was written for the busy attempts.
    let places: i64 = theirs
        .query_one(
            &format!(
                "SELECT count(*) FROM {} WHERE name = 'busy'",
                config.lock_queue().quoted()
            ),
            &[],
        )
        .await
        .expect("the caller's transaction is not aborted")
        .get(0);
    assert_eq!(places, 0, "a busy attempt takes no place in line");
    theirs.commit().await.unwrap();
    locker.commit().await.unwrap();
}

/// An attempt that can only be refused — another waiter is first in line for the free lease —
/// takes nothing the first waiter's attempt needs: run in a transaction left open (alone, in
/// line, or in a batch), it leaves the name's grant lock to that waiter, whose attempt is granted rather than busy. (The
/// releaser asking again at once, while the waiter it announced comes for the lease, made that
/// waiter's attempt busy half the time, a tick each.)
#[tokio::test]
async fn an_attempt_that_cannot_be_granted_leaves_the_grant_lock_to_the_first_waiter() {
    use super::{in_line, release};
    let (config, mut client) = super::setup().await;
    let table = LeaseTable::new(&config);
    let other = super::connect(&config).await;
    let g = grant(&table, &client, "handoff", "releaser", LEASE).await;
    in_line(&table, &client, "handoff", "first", LEASE).await;
    release(&table, &client, "handoff", "releaser", g.token, false).await;
    // The releaser asks again, in its own transaction, kept open.
    let releaser = table.owner("releaser").unwrap();
    let request = AcquireRequest::new("handoff");
    let open = client.transaction().await.unwrap();
    let answer = releaser.try_acquire_or_queue(&open, &request, LEASE, LEASE);
    assert_eq!(answer.await.unwrap(), Attempt::Held(None), "another first");
    let plain = releaser.try_acquire(&open, &request, LEASE).await.unwrap();
    assert_eq!(plain, Attempt::Held(None));
    let requests = [AcquireRequest::new("handoff"), AcquireRequest::new("free")];
    let batch = releaser.try_acquire_many(&open, &requests, LEASE);
    let granted = batch.await.unwrap();
    assert!(granted.contains_key("free") && !granted.contains_key("handoff"));
    // Meanwhile the first waiter's attempt is granted.
    let first = table.owner("first").unwrap();
    let answer = first.try_acquire_or_queue(&other, &request, LEASE, LEASE);
    assert!(
        matches!(answer.await.unwrap(), Attempt::Granted(_)),
        "the first waiter's attempt found the name busy"
    );
    open.commit().await.unwrap();
    let holder = table.holder(&other, "handoff").await.unwrap();
    assert_eq!(holder.map(|h| h.owner).as_deref(), Some("first"));
    // An attempt that may be granted still takes the grant lock: granted in a transaction left
    // open, another attempt of the name meanwhile is busy, and waits for nothing.
    let open = client.transaction().await.unwrap();
    let request = AcquireRequest::new("fresh");
    let answer = releaser.try_acquire(&open, &request, LEASE).await.unwrap();
    assert!(matches!(answer, Attempt::Granted(_)), "{answer:?}");
    let answer = first.try_acquire_or_queue(&other, &request, LEASE, LEASE);
    assert_eq!(answer.await.unwrap(), Attempt::Busy);
    open.rollback().await.unwrap();
}

/// A place in line whose waiter stopped asking (its process gone without leaving the line)
/// lapses, and `reap_lapsed_places` deletes it; a place still in time stays.
#[tokio::test]
async fn lapsed_places_in_line_are_reaped_and_live_ones_stay() {
    let (config, client) = super::setup().await;
    let table = LeaseTable::new(&config);
    grant(&table, &client, "line", "holder", LEASE).await;
    let request = AcquireRequest::new("line");
    let queue = |owner: &'static str, wait: Duration| {
        let (table, client, request) = (&table, &client, &request);
        async move {
            let owner = table.owner(owner).unwrap();
            owner
                .try_acquire_or_queue(client, request, LEASE, wait)
                .await
                .unwrap()
        }
    };
    assert!(matches!(
        queue("gone", Duration::from_millis(50)).await,
        Attempt::Held(_)
    ));
    assert!(matches!(queue("alive", LEASE).await, Attempt::Held(_)));
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(table.reap_lapsed_places(&client).await.unwrap(), 1);
    let waiters: Vec<String> = client
        .query(
            &format!("SELECT waiter FROM {}", config.lock_queue().quoted()),
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(waiters, ["alive"]);
    assert_eq!(
        table.reap_lapsed_places(&client).await.unwrap(),
        0,
        "safe to repeat"
    );
}
