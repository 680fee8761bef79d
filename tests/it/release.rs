//! Releasing leases, what releases announce on the lease channel, and the waiters' line.

use std::time::Duration;

use pgcoord::lease::{AcquireRequest, Attempt, ReleaseRequest};
use pgcoord::{ErrorKind, LeaseTable};

use super::{LEASE, grant};

#[tokio::test]
async fn release_needs_the_current_token_and_wakes_listeners() {
    let (config, client) = super::setup().await;
    let table = LeaseTable::new(&config);
    let g = grant(&table, &client, "job", "me", LEASE).await;
    let err = table
        .owner("me")
        .unwrap()
        .release(
            &client,
            &ReleaseRequest {
                name: "job",
                token: g.token + 1,
                keep: false,
                announce_always: false,
            },
        )
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::LockLost);
    assert!(table.get(&client, "job").await.unwrap().is_held());
    // With someone in line, the release announces the name and the waiter first in line on the
    // lease channel (see `Released`).
    let (listening, mut announced) = announcements(&config).await;
    super::in_line(&table, &client, "job", "waiter", LEASE).await;
    super::release(&table, &client, "job", "me", g.token, false).await;
    assert_eq!(next(&mut announced).await, "3:jobwaiter");
    // With nobody in line, nothing: the first notification to arrive is one sent after it.
    let g = grant(&table, &client, "job", "waiter", LEASE).await;
    super::release(&table, &client, "job", "waiter", g.token, false).await;
    ring_marker(&config, &listening).await;
    assert_eq!(next(&mut announced).await, MARKER);
    // Unless announced always (a permit, an election's term).
    let g = grant(&table, &client, "job", "me", LEASE).await;
    let always = ReleaseRequest {
        name: "job",
        token: g.token,
        keep: false,
        announce_always: true,
    };
    table
        .owner("me")
        .unwrap()
        .release(&client, &always)
        .await
        .unwrap();
    assert_eq!(next(&mut announced).await, "3:job");
}

/// What [`ring_marker`] sends: a payload no announcement can be.
pub const MARKER: &str = "marker";

/// Sends [`MARKER`] on the lease channel: notifications on one channel from one session arrive
/// in commit order, so whatever arrives before it was sent before it.
pub async fn ring_marker(config: &pgcoord::Config, client: &tokio_postgres::Client) {
    client
        .execute(
            "SELECT pg_notify($1, $2)",
            &[&config.lease_channel().as_str(), &MARKER],
        )
        .await
        .unwrap();
}

#[tokio::test]
async fn a_place_committed_while_the_release_waited_for_the_row_is_announced() {
    let (config, client) = super::setup().await;
    let table = LeaseTable::new(&config);
    let (listening, mut announced) = announcements(&config).await;
    for keep in [false, true] {
        let name = format!("job-{keep}");
        let g = grant(&table, &client, &name, "holder", LEASE).await;
        // The waiter's attempt, in a transaction left open: it holds the lease's row locked and
        // its place in line is not committed yet.
        let mut waiter = super::connect(&config).await;
        let tx = waiter.transaction().await.unwrap();
        super::in_line(&table, &tx, &name, "waiter", LEASE).await;
        // The release takes its snapshot, then waits for the row.
        let releaser = super::connect(&config).await;
        let releaser_pid: i32 = (releaser.query_one("SELECT pg_backend_pid()", &[]).await)
            .unwrap()
            .get(0);
        let release = {
            let (table, name) = (table.clone(), name.clone());
            tokio::spawn(async move {
                let request = ReleaseRequest {
                    name: &name,
                    token: g.token,
                    keep,
                    announce_always: false,
                };
                let owner = table.owner("holder").unwrap();
                owner.release(&releaser, &request).await
            })
        };
        let waiting_for_the_row = "SELECT coalesce(wait_event_type = 'Lock', false)
                                   FROM pg_stat_activity WHERE pid = $1";
        let started = std::time::Instant::now();
        while !(client
            .query_one(waiting_for_the_row, &[&releaser_pid])
            .await)
            .unwrap()
            .get::<_, bool>(0)
        {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "the release never waited for the row"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        tx.commit().await.unwrap();
        release.await.unwrap().unwrap();
        // Its snapshot has no place in line, but the row it ended carries the waiter's mark:
        // announced, free for whoever is first (the snapshot cannot name the waiter).
        let payload = next(&mut announced).await;
        assert_eq!(payload, format!("{}:{name}", name.len()), "keep {keep}");
        grant(&table, &client, &name, "waiter", LEASE).await;
    }
    ring_marker(&config, &listening).await;
    assert_eq!(next(&mut announced).await, MARKER);
}

/// A connection listening on the lease channel (it listens while the client lives), and its
/// payloads in order.
pub async fn announcements(
    config: &pgcoord::Config,
) -> (
    tokio_postgres::Client,
    tokio::sync::mpsc::UnboundedReceiver<String>,
) {
    let (client, mut conn) = pgcoord::__private::connect(config).await.unwrap();
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Some(Ok(m)) = futures_util::future::poll_fn(|cx| conn.poll_message(cx)).await {
            if let tokio_postgres::AsyncMessage::Notification(n) = m {
                let _ = tx.send(n.payload().to_owned());
            }
        }
    });
    client
        .batch_execute(&format!("LISTEN {}", config.lease_channel().quoted()))
        .await
        .unwrap();
    (client, rx)
}

pub async fn next(announced: &mut tokio::sync::mpsc::UnboundedReceiver<String>) -> String {
    tokio::time::timeout(Duration::from_secs(5), announced.recv())
        .await
        .expect("an announcement")
        .expect("listening")
}

#[tokio::test]
async fn a_reserved_grant_goes_to_the_waiter_not_back_to_the_releaser() {
    let (config, client) = super::setup().await;
    let table = LeaseTable::new(&config);
    for keep in [false, true] {
        let name = format!("job-{keep}");
        let g = grant(&table, &client, &name, "releaser", LEASE).await;
        let holder = super::in_line(&table, &client, &name, "waiter", LEASE).await;
        assert_eq!(holder.map(|h| h.owner), Some("releaser".into()));
        // A second waiter is in line behind the first.
        super::in_line(&table, &client, &name, "late", LEASE).await;
        table
            .owner("releaser")
            .unwrap()
            .release(
                &client,
                &ReleaseRequest {
                    name: &name,
                    token: g.token,
                    keep,
                    announce_always: false,
                },
            )
            .await
            .unwrap();
        for other in ["releaser", "late"] {
            let attempt = table
                .owner(other)
                .unwrap()
                .try_acquire(&client, &AcquireRequest::new(&name), LEASE)
                .await
                .unwrap();
            assert!(
                matches!(attempt, Attempt::Held(_)),
                "{other} must not jump the queue ({name})"
            );
        }
        let g = grant(&table, &client, &name, "waiter", LEASE).await;
        table
            .owner("waiter")
            .unwrap()
            .release(
                &client,
                &ReleaseRequest {
                    name: &name,
                    token: g.token,
                    keep,
                    announce_always: false,
                },
            )
            .await
            .unwrap();
        // Nobody left in line: a deleted lock is gone, a kept one stays.
        assert_eq!(table.get(&client, &name).await.is_ok(), keep, "{name}");
    }
}

#[tokio::test]
async fn waiters_are_served_in_arrival_order_and_one_leaving_the_line_makes_room() {
    let (config, client) = super::setup().await;
    let table = LeaseTable::new(&config);
    let g = grant(&table, &client, "job", "holder", LEASE).await;
    for waiter in ["first", "second", "third"] {
        super::in_line(&table, &client, "job", waiter, LEASE).await;
        // Each arrives after the previous one.
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    // The holder refreshing its place does not move it; a waiter refreshing keeps its own.
    super::in_line(&table, &client, "job", "first", LEASE).await;
    super::release(&table, &client, "job", "holder", g.token, false).await;
    // The row is gone, yet nobody but the first in line can take it: not the releaser, not a
    // newcomer, not the second.
    for other in ["holder", "newcomer", "second"] {
        let attempt = table
            .owner(other)
            .unwrap()
            .try_acquire(&client, &AcquireRequest::new("job"), LEASE)
            .await
            .unwrap();
        assert!(
            matches!(attempt, Attempt::Held(_)),
            "{other} jumped the line"
        );
    }
    let g = grant(&table, &client, "job", "first", LEASE).await;
    super::release(&table, &client, "job", "first", g.token, false).await;
    // The second leaves the line: the third is first now.
    table
        .owner("second")
        .unwrap()
        .leave_line(&client, "job")
        .await
        .unwrap();
    let attempt = table
        .owner("newcomer")
        .unwrap()
        .try_acquire(&client, &AcquireRequest::new("job"), LEASE)
        .await
        .unwrap();
    assert!(matches!(attempt, Attempt::Held(_)), "the third is in line");
    let g = grant(&table, &client, "job", "third", LEASE).await;
    super::release(&table, &client, "job", "third", g.token, false).await;
    // Nobody waits any more: anyone may take it, and no row was left behind.
    assert_eq!(
        table.get(&client, "job").await.unwrap_err().kind(),
        ErrorKind::NotFound
    );
    grant(&table, &client, "job", "newcomer", LEASE).await;
}

#[tokio::test]
async fn announcements_name_the_reserved_waiter_and_a_waiter_giving_up_announces_too() {
    let (config, client) = super::setup().await;
    let table = LeaseTable::new(&config);
    let (listening, mut announced) = announcements(&config).await;
    let g = grant(&table, &client, "job", "holder", LEASE).await;
    super::in_line(&table, &client, "job", "waiter", LEASE).await;
    super::release(&table, &client, "job", "holder", g.token, false).await;
    let payload = next(&mut announced).await;
    let released = pgcoord::lease::Released::parse(&payload).unwrap();
    assert_eq!(
        (released.name, released.first_in_line),
        ("job", Some("waiter"))
    );
    // The waiter gives up while the row is free: the others may try now, so it is announced.
    table
        .owner("waiter")
        .unwrap()
        .leave_line(&client, "job")
        .await
        .unwrap();
    assert_eq!(next(&mut announced).await, "3:job");
    // A lapsed place is nobody waiting: nothing is announced (and anyone may take the lock).
    let g = grant(&table, &client, "job", "holder", LEASE).await;
    super::in_line(&table, &client, "job", "waiter", Duration::from_millis(1)).await;
    tokio::time::sleep(Duration::from_millis(5)).await;
    super::release(&table, &client, "job", "holder", g.token, true).await;
    ring_marker(&config, &listening).await;
    assert_eq!(next(&mut announced).await, MARKER);
    grant(&table, &client, "job", "newcomer", LEASE).await;
}

#[tokio::test]
async fn a_waiting_attempt_that_loses_puts_its_owner_in_line_in_the_same_statement() {
    let (config, client) = super::setup().await;
    let table = LeaseTable::new(&config);
    let wait = |owner: &'static str| {
        let (table, client) = (&table, &client);
        async move {
            table
                .owner(owner)
                .unwrap()
                .try_acquire_or_queue(client, &AcquireRequest::new("job"), LEASE, LEASE)
                .await
                .unwrap()
        }
    };
    // Free: granted, as try_acquire would.
    let Attempt::Granted(g) = wait("holder").await else {
        panic!("a free lease is granted")
    };
    // Held: refused with the holder, and in line.
    match wait("waiter").await {
        Attempt::Held(Some(holder)) => {
            assert_eq!((holder.owner.as_str(), holder.token), ("holder", g.token))
        }
        other => panic!("{other:?}"),
    }
    super::release(&table, &client, "job", "holder", g.token, false).await;
    // Free now, and the waiter is first in line: the releaser asking again is refused, and
    // lines up behind it; a newcomer's plain attempt is refused too.
    assert!(matches!(wait("holder").await, Attempt::Held(None)));
    assert!(matches!(
        table
            .owner("newcomer")
            .unwrap()
            .try_acquire(&client, &AcquireRequest::new("job"), LEASE)
            .await
            .unwrap(),
        Attempt::Held(None)
    ));
    // The waiter's own attempt takes it, and takes it out of the line.
    let Attempt::Granted(heir) = wait("waiter").await else {
        panic!("the first in line is granted")
    };
    assert!(heir.token > g.token);
    super::release(&table, &client, "job", "waiter", heir.token, false).await;
    // Next in line: the releaser, whose refused attempt put it there.
    assert!(matches!(
        table
            .owner("newcomer")
            .unwrap()
            .try_acquire(&client, &AcquireRequest::new("job"), LEASE)
            .await
            .unwrap(),
        Attempt::Held(None)
    ));
    let Attempt::Granted(last) = wait("holder").await else {
        panic!("the releaser, next in line, is granted")
    };
    assert!(last.token > heir.token);
}

#[tokio::test]
async fn a_waiter_that_vanishes_holds_up_the_line_only_until_its_place_lapses() {
    let (config, client) = super::setup().await;
    let table = LeaseTable::new(&config);
    // A waiter that will never come back (its process died without leaving the line), in
    // line behind a holder that has released since.
    let g = grant(&table, &client, "job", "holder", LEASE).await;
    super::in_line(&table, &client, "job", "ghost", Duration::from_millis(300)).await;
    let release = ReleaseRequest {
        name: "job",
        token: g.token,
        keep: false,
        announce_always: false,
    };
    let holder = table.owner("holder").unwrap();
    holder.release(&client, &release).await.unwrap();
    let attempt = table
        .owner("me")
        .unwrap()
        .try_acquire(&client, &AcquireRequest::new("job"), LEASE)
        .await
        .unwrap();
    assert!(matches!(attempt, Attempt::Held(None)), "the ghost is first");
    tokio::time::sleep(Duration::from_millis(350)).await;
    grant(&table, &client, "job", "me", LEASE).await;
    // The lapsed place is pruned when someone queues next.
    super::in_line(&table, &client, "job", "next", LEASE).await;
    let left: i64 = client
        .query_one(
            &format!(
                "SELECT count(*) FROM {} WHERE waiter = 'ghost'",
                config.lock_queue().quoted()
            ),
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(left, 0);
}

/// The line goes by priority, then arrival: a waiter with a higher priority, though it came
/// last, is announced and granted first at a release; among equals, the first to come.
#[tokio::test]
async fn the_line_goes_by_priority_then_arrival() {
    let (config, client) = super::setup().await;
    let table = LeaseTable::new(&config);
    let (_listening, mut announced) = announcements(&config).await;
    let name = "preferred";
    let g = grant(&table, &client, name, "holder", LEASE).await;
    for (waiter, priority) in [("early", 0), ("later", 0), ("preferred", 5)] {
        let request = AcquireRequest::new(name).priority(priority);
        let attempt = (table.owner(waiter).unwrap())
            .try_acquire_or_queue(&client, &request, LEASE, LEASE)
            .await
            .unwrap();
        assert!(matches!(attempt, Attempt::Held(_)), "{waiter}: {attempt:?}");
    }
    // Listed as it will be served (what `pgcoord lock show` and the live view show).
    let line = table.line(&client).await.unwrap();
    let listed: Vec<(&str, i32)> = (line.iter().filter(|p| p.name == name))
        .map(|p| (p.waiter.as_str(), p.priority))
        .collect();
    assert_eq!(listed, [("preferred", 5), ("early", 0), ("later", 0)]);
    assert!(
        line.iter()
            .all(|p| p.left > Duration::ZERO && p.waited < LEASE)
    );
    let release = async |owner: &str, token: i64| {
        let request = ReleaseRequest {
            name,
            token,
            keep: false,
            announce_always: false,
        };
        table
            .owner(owner)
            .unwrap()
            .release(&client, &request)
            .await
            .unwrap();
    };
    release("holder", g.token).await;
    assert_eq!(
        next(&mut announced).await,
        format!("{}:{name}preferred", name.len())
    );
    for other in ["early", "later"] {
        let attempt = (table.owner(other).unwrap())
            .try_acquire(&client, &AcquireRequest::new(name), LEASE)
            .await
            .unwrap();
        assert!(
            matches!(attempt, Attempt::Held(_)),
            "{other} must wait for the preferred"
        );
    }
    let g = grant(&table, &client, name, "preferred", LEASE).await;
    release("preferred", g.token).await;
    // Then the earliest of the rest.
    assert_eq!(
        next(&mut announced).await,
        format!("{}:{name}early", name.len())
    );
    let g = grant(&table, &client, name, "early", LEASE).await;
    release("early", g.token).await;
    assert_eq!(
        next(&mut announced).await,
        format!("{}:{name}later", name.len())
    );
}

/// An operator's release (`pgcoord lock release --force`, the live view's) ends the tenure it
/// names and no other: with a token that is no longer the holder's, nothing is released.
#[tokio::test]
async fn a_forced_release_ends_only_the_tenure_it_names() {
    let (config, client) = super::setup().await;
    let table = LeaseTable::new(&config);
    let name = "stuck";
    let first = grant(&table, &client, name, "a", LEASE).await;
    let stale = table
        .force_release(&client, name, Some(first.token + 1))
        .await
        .unwrap_err();
    assert_eq!(stale.kind(), ErrorKind::FailedPrecondition, "{stale}");
    assert_eq!(
        table.get(&client, name).await.unwrap().token,
        Some(first.token)
    );
    let (owner, token) = table
        .force_release(&client, name, Some(first.token))
        .await
        .unwrap();
    assert_eq!((owner.as_str(), token), ("a", first.token));
    let gone = table.get(&client, name).await.unwrap_err();
    assert_eq!(gone.kind(), ErrorKind::NotFound);
    // Nothing held: nothing to release.
    let none = table.force_release(&client, name, None).await.unwrap_err();
    assert_eq!(none.kind(), ErrorKind::NotFound);
}
