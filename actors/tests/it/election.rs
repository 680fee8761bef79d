//! Leader election: one leader at a time, resign hands over at once, observers told of every
//! term in token order, of a dead leader at its expiry, and resynced after a reconnect.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pgcoord::LeaseTable;
use pgcoord::lease::{AcquireRequest, Attempt};
use pgcoord_actors::*;
use pgcoord_testkit::unique_name;

use super::{Collector, Setup};

/// One term as its leader saw it: token, start, end, proclaimed value.
type Term = (i64, Instant, Instant, Vec<u8>);

#[actix_rt::test]
async fn one_leader_at_a_time_resign_hands_over_and_observers_see_every_term_in_order() {
    let (setup, _admin) = Setup::new(Duration::from_secs(10), Duration::from_secs(2)).await;
    let coordinator = |owner: &str| Coordinator::start(setup.builder(owner).build().unwrap());
    let watcher = coordinator("watcher");
    let (observed, recipient) = Collector::<LeaderChanged>::start_new();
    watcher.election("leader").unwrap().observe(recipient);
    let first = observed.wait_for(1, Duration::from_secs(5)).await;
    assert_eq!(first[0].leader, None, "nobody leads yet");
    assert!(first[0].resync, "the first report is the state read");

    let terms: Arc<Mutex<Vec<Term>>> = Arc::default();
    let resigned: Arc<Mutex<Option<Instant>>> = Arc::default();
    let handovers: Arc<Mutex<Vec<Duration>>> = Arc::default();
    let stop = Instant::now() + Duration::from_secs(2);
    let candidates: Vec<_> = (0..3)
        .map(|c| {
            let election = coordinator(&format!("candidate-{c}"))
                .election("leader")
                .unwrap();
            let (terms, resigned, handovers) = (terms.clone(), resigned.clone(), handovers.clone());
            let observed = observed.clone();
            actix_rt::spawn(async move {
                while Instant::now() < stop {
                    let mut term = election
                        .campaign(format!("c{c}"), Some(Duration::from_secs(10)))
                        .await
                        .unwrap();
                    let start = Instant::now();
                    if let Some(at) = resigned.lock().unwrap().take() {
                        handovers.lock().unwrap().push(start - at);
                    }
                    // A new value within the term, without a new election.
                    let value = format!("c{c}-{}", term.token()).into_bytes();
                    term.proclaim(value.clone()).await.unwrap();
                    assert_eq!(term.value(), value.as_slice());
                    // Observers report what they read when a proclamation rings: a term must
                    // outlast a read to be seen, so it lasts until the observer has it.
                    let deadline = Instant::now() + Duration::from_secs(5);
                    while !observed.received().iter().any(|c| {
                        c.leader
                            .as_ref()
                            .is_some_and(|l| l.token == term.token() && l.value == value)
                    }) {
                        assert!(
                            Instant::now() < deadline,
                            "term {} unobserved",
                            term.token()
                        );
                        tokio::time::sleep(Duration::from_millis(2)).await;
                    }
                    let end = Instant::now();
                    terms
                        .lock()
                        .unwrap()
                        .push((term.token(), start, end, value));
                    *resigned.lock().unwrap() = Some(Instant::now());
                    term.resign().await.unwrap();
                }
            })
        })
        .collect();
    for candidate in candidates {
        candidate.await.unwrap();
    }
    let mut terms = terms.lock().unwrap().clone();
    terms.sort_by_key(|t| t.1);
    assert!(terms.len() >= 4, "{} terms", terms.len());
    for pair in terms.windows(2) {
        assert!(pair[0].2 <= pair[1].1, "two leaders at once: {pair:?}");
        assert!(pair[0].0 < pair[1].0, "tokens order the terms");
    }
    // Resigning hands over at once (the next candidate is woken by the release); without the
    // announcement it would wait for its poll, a quarter lease (2.5 s).
    let mut handovers = handovers.lock().unwrap().clone();
    handovers.sort();
    let worst = *handovers.last().unwrap();
    assert!(worst < Duration::from_secs(1), "handover took {worst:?}");
    eprintln!(
        "{} terms; handover p50 {:?}, max {worst:?}",
        terms.len(),
        handovers[handovers.len() / 2]
    );

    // The observer: never an older term after a newer one, and every term's proclaimed value.
    let deadline = Instant::now() + Duration::from_secs(5);
    while observed
        .received()
        .last()
        .is_none_or(|c| c.leader.is_some())
    {
        assert!(Instant::now() < deadline, "nobody leads at the end");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let changes = observed.received();
    let mut highest = i64::MIN;
    for change in &changes {
        if let Some(leader) = &change.leader {
            assert!(leader.token >= highest, "older term after a newer one");
            highest = leader.token;
        }
    }
    for (token, _, _, value) in &terms {
        assert!(
            changes.iter().any(|c| c
                .leader
                .as_ref()
                .is_some_and(|l| l.token == *token && &l.value == value)),
            "term {token} with its value was not observed"
        );
    }
    assert_eq!(
        changes.last().unwrap().leader,
        None,
        "nobody leads at the end"
    );
    assert_eq!(
        watcher.election("leader").unwrap().leader().await.unwrap(),
        None
    );
}

#[actix_rt::test]
async fn an_observer_learns_of_a_dead_leader_at_its_expiry_and_is_resynced_after_a_reconnect() {
    // A 20 s lease: the observer's poll is 5 s apart.
    let (setup, admin) = Setup::new(Duration::from_secs(20), Duration::from_secs(4)).await;
    let app = unique_name("observer");
    let watcher = Coordinator::start(
        setup
            .builder("watcher")
            .application_name(&app)
            .build()
            .unwrap(),
    );
    let (observed, recipient) = Collector::<LeaderChanged>::start_new();
    watcher.election("job").unwrap().observe(recipient);
    observed.wait_for(1, Duration::from_secs(5)).await;

    // A leader that never renews (its process died): granted and proclaimed by hand.
    let config = setup.builder("dead").build().unwrap();
    let table = LeaseTable::new(&config);
    // Long enough for the observer to read it (a proclamation only makes it read).
    let short = Duration::from_millis(1500);
    let granted = Instant::now();
    let Attempt::Granted(grant) = table
        .owner("dead")
        .unwrap()
        .try_acquire(
            &admin,
            &AcquireRequest::new("job").data(b"addr-1").replace_data(),
            short,
        )
        .await
        .unwrap()
    else {
        panic!("free")
    };
    table
        .owner("dead")
        .unwrap()
        .proclaim(&admin, "job", grant.token, b"addr-1")
        .await
        .unwrap();
    let changes = observed.wait_for(3, Duration::from_secs(4)).await;
    let leader = changes[1]
        .leader
        .clone()
        .expect("the dead leader, announced");
    assert_eq!((leader.owner.as_str(), leader.token), ("dead", grant.token));
    assert_eq!(leader.value, b"addr-1");
    // Its expiry is noticed on the server's clock, before the first poll (5 s).
    assert_eq!(changes[2].leader, None);
    let noticed = granted.elapsed();
    assert!(
        noticed >= short && noticed < Duration::from_secs(4),
        "{noticed:?}"
    );

    // The listener's session is killed; meanwhile a new leader is announced, which the observer
    // cannot hear. After the reconnect it is read and reported as a resync.
    let killed = pgcoord_testkit::terminate_backends(&admin, &format!("{app} listener"))
        .await
        .unwrap();
    assert_eq!(killed, 1);
    let Attempt::Granted(next) = table
        .owner("next")
        .unwrap()
        .try_acquire(
            &admin,
            &AcquireRequest::new("job").data(b"addr-2").replace_data(),
            Duration::from_secs(30),
        )
        .await
        .unwrap()
    else {
        panic!("free")
    };
    table
        .owner("next")
        .unwrap()
        .proclaim(&admin, "job", next.token, b"addr-2")
        .await
        .unwrap();
    // The reconnect is followed by a resync. When the new session was listening before the
    // new leader was announced (a fast reconnect), the resync finds no leader and the
    // announcement follows it; otherwise the resync itself reports the new leader. Either way
    // the observer ends up knowing it, after a resync.
    let deadline = Instant::now() + Duration::from_secs(5);
    let leader = loop {
        let changes = observed.received();
        let resynced = changes[3..].iter().position(|c| c.resync);
        let latest = changes.last().and_then(|c| c.leader.clone());
        if let (Some(_), Some(leader)) = (resynced, latest)
            && leader.owner == "next"
        {
            break leader;
        }
        assert!(
            Instant::now() < deadline,
            "no resync to the new leader after the reconnect: {changes:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert_eq!((leader.owner.as_str(), leader.token), ("next", next.token));
    assert!(leader.token > grant.token);
}

#[actix_rt::test]
async fn a_term_that_ended_cannot_proclaim_and_bad_names_are_refused() {
    let (setup, admin) = Setup::new(Duration::from_secs(10), Duration::from_secs(2)).await;
    let coordinator = Coordinator::start(setup.builder("me").build().unwrap());
    let err = coordinator.election("").expect_err("an empty name");
    assert_eq!(err.kind(), pgcoord::ErrorKind::InvalidName);
    let election = coordinator.election("solo").unwrap();
    let mut term = election.campaign("v1", None).await.unwrap();
    let token = term.token();
    assert_eq!(
        election.leader().await.unwrap().map(|l| (l.token, l.value)),
        Some((token, b"v1".to_vec()))
    );
    // The term ends behind its leader's back (its row gone, as after an expiry and a
    // takeover's end); the next renewal finds it lost, and a late proclamation is refused.
    admin
        .execute(
            &format!("DELETE FROM {} WHERE name = 'solo'", setup.quoted_table()),
            &[],
        )
        .await
        .unwrap();
    coordinator.locks().unwrap().call(RunNow).await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), term.lost())
        .await
        .expect("the loss is reported");
    let err = term.proclaim(b"late".to_vec()).await.unwrap_err();
    assert_eq!(err.kind(), pgcoord::ErrorKind::LockLost);
    drop(term);
    assert_eq!(election.leader().await.unwrap(), None);
    // A second candidate times out while the first leads, naming it.
    let term = election.campaign("v2", None).await.unwrap();
    let other = Coordinator::start(setup.builder("other").build().unwrap());
    let err = other
        .election("solo")
        .unwrap()
        .campaign("v3", Some(Duration::from_millis(200)))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), pgcoord::ErrorKind::NotAcquired);
    drop(term);
}

/// A term's `lost()` taken while it lasts ends without a loss when the leader resigns: a
/// watcher written the natural way does not report a loss that never happened.
#[actix_rt::test]
async fn a_resignation_is_no_loss() {
    let (setup, _admin) = Setup::new(Duration::from_secs(10), Duration::from_secs(2)).await;
    let coordinator = Coordinator::start(setup.builder("leader").build().unwrap());
    let election = coordinator.election(unique_name("quiet")).unwrap();
    let term = election.campaign("v1", None).await.unwrap();
    let lost = term.lost();
    term.resign().await.unwrap();
    let ended = tokio::time::timeout(Duration::from_secs(5), lost).await;
    assert_eq!(ended, Ok(None));
}

#[actix_rt::test]
async fn a_leader_asked_to_resign_hears_of_it_within_a_heartbeat_and_hands_over() {
    // Heartbeat 500 ms: the leader looks for a request that often.
    let (setup, _admin) = Setup::new(Duration::from_secs(10), Duration::from_millis(500)).await;
    let coordinator = |owner: &str| Coordinator::start(setup.builder(owner).build().unwrap());
    let (a, b, ops) = (coordinator("a"), coordinator("b"), coordinator("ops"));
    let name = unique_name("resign");
    // No leader: nothing to ask.
    let election = ops.election(&name).unwrap();
    assert_eq!(election.request_resign().await.unwrap(), None);

    let first = a
        .election(&name)
        .unwrap()
        .campaign("a", None)
        .await
        .unwrap();
    let asked = first.resign_requested();
    let second = actix_rt::spawn({
        let election = b.election(&name).unwrap();
        async move { election.campaign("b", None).await.unwrap() }
    });
    // Not asked yet: two heartbeats pass without a word.
    let quiet = tokio::time::timeout(Duration::from_millis(1100), first.resign_requested());
    assert!(quiet.await.is_err(), "heard a request nobody made");
    let sent = Instant::now();
    let term = election.request_resign().await.unwrap();
    assert_eq!(term, Some(first.token()));
    assert!(asked.await, "the term ended before the request was heard");
    let heard = sent.elapsed();
    // Within a heartbeat and its statement; a second of slack for a busy machine.
    assert!(
        heard < Duration::from_millis(500 + 1000),
        "heard after {heard:?}"
    );
    // Asked, not released: the leader still leads until it resigns.
    assert!(first.lease().loss().is_none());
    let leader = election.leader().await.unwrap().unwrap();
    assert_eq!(leader.token, first.token());
    first.resign().await.unwrap();
    let next = tokio::time::timeout(Duration::from_secs(5), second)
        .await
        .expect("the next candidate elected")
        .unwrap();
    assert!(next.token() > term.unwrap());
    // The request was for the last term: the new leader is not asked, and hears of the end of
    // its own term as `false`.
    let quiet = tokio::time::timeout(Duration::from_millis(1100), next.resign_requested());
    assert!(
        quiet.await.is_err(),
        "the new term heard the old term's request"
    );
    let ended = next.resign_requested();
    next.resign().await.unwrap();
    assert!(!ended.await, "a term that ended was not asked");
}

/// A preferred candidate (a higher priority) is elected at the end of the term even though
/// another candidate waited longer; the other is elected after it.
#[actix_rt::test]
async fn a_preferred_candidate_wins_the_next_term_when_it_is_waiting() {
    let (setup, admin) = Setup::new(Duration::from_secs(10), Duration::from_millis(500)).await;
    let coordinator = |owner: &str| Coordinator::start(setup.builder(owner).build().unwrap());
    let (a, b, c) = (coordinator("a"), coordinator("b"), coordinator("c"));
    let name = unique_name("preferred");
    let first = a
        .election(&name)
        .unwrap()
        .campaign("a", None)
        .await
        .unwrap();
    let waiting = async |n: i64| super::in_line(&setup, &admin, &name, n).await;
    let campaign = |coordinator: &Coordinator, value: &'static str, priority: i32| {
        let election = coordinator.election(&name).unwrap().priority(priority);
        actix_rt::spawn(async move { election.campaign(value, None).await.unwrap() })
    };
    // `b` waits first, with the default priority; `c`, preferred, comes after it.
    let b_elected = campaign(&b, "b", 0);
    waiting(1).await;
    let c_elected = campaign(&c, "c", 10);
    waiting(2).await;
    first.resign().await.unwrap();
    let second = tokio::time::timeout(Duration::from_secs(5), c_elected)
        .await
        .expect("the preferred candidate elected")
        .unwrap();
    assert!(!b_elected.is_finished(), "b must wait for the preferred");
    assert_eq!(second.value(), b"c");
    let token = second.token();
    second.resign().await.unwrap();
    let third = tokio::time::timeout(Duration::from_secs(5), b_elected)
        .await
        .expect("then the other")
        .unwrap();
    assert!(third.token() > token);
}

#[actix_rt::test]
async fn an_observer_reports_what_it_reads_not_what_a_notification_says() {
    let (setup, _admin) = Setup::new(Duration::from_secs(10), Duration::from_secs(2)).await;
    let config = setup.builder("watcher").build().unwrap();
    let watcher = Coordinator::start(config.clone());
    let (observed, recipient) = Collector::<LeaderChanged>::start_new();
    watcher.election("replayed").unwrap().observe(recipient);
    observed.wait_for(1, Duration::from_secs(5)).await;
    let (listening, mut heard) = super::listen_on(&config, &[config.election_channel()]).await;

    // A term proclaimed and ended: its proclamation, as anyone listening heard it.
    let leader = Coordinator::start(setup.builder("leader").build().unwrap());
    let term = (leader.election("replayed").unwrap())
        .campaign("v1", None)
        .await
        .unwrap();
    let proclamation = tokio::time::timeout(Duration::from_secs(5), heard.recv())
        .await
        .unwrap()
        .unwrap();
    let (channel, text) = proclamation.split_once(": ").unwrap();
    let changes = observed.wait_for(2, Duration::from_secs(5)).await;
    assert_eq!(changes[1].leader.as_ref().unwrap().value, b"v1");
    term.resign().await.unwrap();
    let changes = observed.wait_for(3, Duration::from_secs(5)).await;
    assert_eq!(changes[2].leader, None);

    // Replayed by anyone who can connect: the observer reads the table, which says nobody
    // leads, and reports nothing (it reported the resigned leader again when it trusted it).
    (listening.execute("SELECT pg_notify($1, $2)", &[&channel, &text]))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(observed.received().len(), 3, "{:?}", observed.received());
    leader.shutdown(Duration::from_secs(5)).await.unwrap();
    watcher.shutdown(Duration::from_secs(5)).await.unwrap();
}

/// A flood of proclamations (anyone who can connect can NOTIFY one) costs an observer a read
/// per doorbell gap (50 ms), not one each, and a real change is still reported.
#[actix_rt::test]
async fn a_flood_of_proclamations_costs_an_observer_a_read_per_gap() {
    let (setup, _admin) = Setup::new(Duration::from_secs(10), Duration::from_secs(2)).await;
    let config = setup.builder("watcher").build().unwrap();
    let watcher = Coordinator::start(config.clone());
    let (observed, recipient) = Collector::<LeaderChanged>::start_new();
    watcher.election("flooded").unwrap().observe(recipient);
    observed.wait_for(1, Duration::from_secs(5)).await;
    let (listening, mut heard) = super::listen_on(&config, &[config.election_channel()]).await;
    let leader = Coordinator::start(setup.builder("leader").build().unwrap());
    let term = (leader.election("flooded").unwrap())
        .campaign("v1", None)
        .await
        .unwrap();
    observed.wait_for(2, Duration::from_secs(5)).await;
    // The term's own proclamation, replayed.
    let heard = tokio::time::timeout(Duration::from_secs(5), heard.recv())
        .await
        .unwrap()
        .unwrap();
    let (channel, text) = heard.split_once(": ").unwrap();
    let reads = async || {
        let stats: ManagerStats = watcher
            .locks()
            .unwrap()
            .send(GetStats::new())
            .await
            .unwrap();
        stats.read_statements
    };
    let (sent, read, most) = super::flood(&listening, channel, text, reads).await;
    assert!(read <= most, "{read} reads for {sent} proclamations");
    assert_eq!(observed.received().len(), 2, "{:?}", observed.received());

    term.resign().await.unwrap();
    let changes = observed.wait_for(3, Duration::from_secs(5)).await;
    assert_eq!(changes[2].leader, None);
    leader.shutdown(Duration::from_secs(5)).await.unwrap();
    watcher.shutdown(Duration::from_secs(5)).await.unwrap();
}
