//! Limited semaphores: a stored limit, changed at run time, never exceeded in fenced critical
//! sections — as it is lowered, and past a holder that froze — and waiters woken when it is
//! raised.

use std::time::{Duration, Instant};

use pgcoord::ErrorKind;
use pgcoord::lease::{LimitedAttempt, slot_names};
use pgcoord_actors::*;
use tokio_postgres::Client;

use super::Setup;

/// A client of its own, as each contender's process would have.
async fn client(setup: &Setup) -> Client {
    let config = setup.builder("writer").build().unwrap();
    pgcoord::db::connect_spawned(&config).await.unwrap()
}

/// One critical section under `permit`: fenced, recorded with the server's clock at its start
/// and end. False when the fence refused it.
async fn write_under(
    client: &mut Client,
    slot: &str,
    token: i64,
    fence: impl AsyncFnOnce(&tokio_postgres::Transaction<'_>) -> pgcoord::Result<()>,
) -> bool {
    let tx = client.transaction().await.unwrap();
    if let Err(e) = fence(&tx).await {
        assert_eq!(e.kind(), ErrorKind::LockLost, "{e}");
        return false;
    }
    tx.execute(
        "INSERT INTO limited_history (slot, token, started) VALUES ($1, $2, clock_timestamp())",
        &[&slot, &token],
    )
    .await
    .unwrap();
    tx.batch_execute("SELECT pg_sleep(0.005)").await.unwrap();
    tx.execute(
        "UPDATE limited_history SET ended = clock_timestamp() WHERE token = $1 AND ended IS NULL",
        &[&token],
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
    true
}

#[actix_rt::test]
async fn twenty_contenders_never_exceed_the_limit_as_it_is_lowered_and_a_holder_freezes() {
    let (setup, admin) = Setup::new(Duration::from_secs(2), Duration::from_millis(500)).await;
    admin
        .batch_execute(
            "DROP TABLE IF EXISTS limited_history;
             CREATE TABLE limited_history (slot text, token bigint, started timestamptz,
                                           ended timestamptz)",
        )
        .await
        .unwrap();
    let managers: Vec<_> = (0..4)
        .map(|m| setup.manager(&format!("process-{m}")))
        .collect();
    let change = managers[0]
        .call(SetLimit::new("tenant:42", 3))
        .await
        .unwrap();
    assert_eq!(change.previous, None);
    let stop = Instant::now() + Duration::from_secs(4);

    // A holder that freezes: it takes a permit for 500 ms and writes under it only after 1.5 s,
    // as a paused process would. Its slot is someone else's by then; its write must be refused.
    let config = setup.builder("frozen").build().unwrap();
    let table = pgcoord::LeaseTable::new(&config);
    let mut frozen_client = client(&setup).await;
    let frozen = match (table.owner("frozen").unwrap())
        .try_acquire_limited(
            &frozen_client,
            "tenant:42",
            &slot_names("tenant:42", 3).unwrap(),
            3,
            Duration::from_millis(500),
        )
        .await
        .unwrap()
    {
        LimitedAttempt::Granted { slot, grant } => (slot, grant.token),
        other => panic!("the frozen holder's permit: {other:?}"),
    };

    let mut tasks = Vec::new();
    for (m, manager) in managers.iter().enumerate() {
        for c in 0..5 {
            let (manager, setup_client) = (manager.clone(), client(&setup).await);
            tasks.push(actix_rt::spawn(async move {
                let mut client = setup_client;
                let (mut written, mut refused, mut lost) = (0, 0, 0);
                while Instant::now() < stop {
                    let Ok(permit) = manager
                        .call(AcquirePermit::limited("tenant:42").timeout(Duration::from_secs(1)))
                        .await
                    else {
                        continue;
                    };
                    let (slot, token) = (permit.name().to_owned(), permit.token());
                    // A few sections under each permit: a holder whose permit is taken back
                    // meanwhile must be refused from then on.
                    for _ in 0..4 {
                        if write_under(&mut client, &slot, token, async |tx| permit.fence(tx).await)
                            .await
                        {
                            written += 1;
                        } else {
                            refused += 1;
                            break;
                        }
                    }
                    if permit.loss().is_some() {
                        lost += 1;
                    }
                    let _ = permit.release().await;
                }
                eprintln!("process-{m}/{c}: {written} written, {refused} refused, {lost} lost");
                written
            }));
        }
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let refused = !write_under(&mut frozen_client, &frozen.0, frozen.1, async |tx| {
        table
            .owner("frozen")
            .unwrap()
            .fence(tx, &frozen.0, frozen.1)
            .await
    })
    .await;
    assert!(refused, "the frozen holder wrote after its lease");
    let lowered: std::time::SystemTime = {
        let change = managers[1]
            .call(SetLimit::new("tenant:42", 1))
            .await
            .unwrap();
        assert_eq!(change.previous, Some(3));
        admin
            .query_one("SELECT clock_timestamp()", &[])
            .await
            .unwrap()
            .get(0)
    };
    assert_eq!(setup.table().limit("tenant:42").await.unwrap(), Some(1));
    let mut written = 0;
    for task in tasks {
        written += task.await.unwrap();
    }

    // At the start of each critical section, how many were under way (its own included), and
    // whether it started after the limit was lowered.
    let rows = admin
        .query(
            "SELECT a.started > $1, count(*) FROM limited_history a JOIN limited_history b
               ON b.started <= a.started AND b.ended > a.started
             GROUP BY a.token, a.started",
            &[&lowered],
        )
        .await
        .unwrap();
    let (mut most_before, mut most_after, mut after) = (0, 0, 0);
    for row in &rows {
        let (is_after, under_way): (bool, i64) = (row.get(0), row.get(1));
        if is_after {
            most_after = most_after.max(under_way);
            after += 1;
        } else {
            most_before = most_before.max(under_way);
        }
    }
    eprintln!(
        "{written} sections: at most {most_before} at once under 3, {most_after} under 1 ({after} after)"
    );
    assert_eq!(rows.len(), written as usize, "each section recorded once");
    assert!(most_before <= 3, "{most_before} under a limit of 3");
    assert_eq!(most_before, 3, "the permits were used side by side");
    assert!(
        after > 10,
        "sections went on after the limit was lowered: {after}"
    );
    assert_eq!(most_after, 1, "{most_after} under a limit of 1");
}

#[actix_rt::test]
async fn a_waiter_is_admitted_when_the_limit_is_raised_and_without_a_limit_is_refused() {
    // Polls 2.5 s apart: a wake-up sooner is the raise's doing.
    let (setup, _admin) = Setup::new(Duration::from_secs(10), Duration::from_secs(2)).await;
    let (a, b) = (setup.manager("a"), setup.manager("b"));
    let err = a.call(AcquirePermit::limited("exports")).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound, "{err}");
    assert_eq!(setup.table().limit("exports").await.unwrap(), None);

    a.call(SetLimit::new("exports", 1)).await.unwrap();
    let first = a.call(AcquirePermit::limited("exports")).await.unwrap();
    let full = b
        .call(AcquirePermit::limited("exports").timeout(Duration::from_millis(300)))
        .await
        .unwrap_err();
    assert_eq!(full.kind(), ErrorKind::NotAcquired);
    let waiting =
        actix_rt::spawn(b.call(AcquirePermit::limited("exports").timeout(Duration::from_secs(10))));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let raised = Instant::now();
    let change = a.call(SetLimit::new("exports", 2)).await.unwrap();
    assert_eq!((change.previous, change.revoked), (Some(1), 0));
    let second = waiting.await.unwrap().unwrap();
    assert!(
        raised.elapsed() < Duration::from_secs(1),
        "{:?}",
        raised.elapsed()
    );
    assert_ne!(second.name(), first.name());

    // Released, a limited permit's row stays (free): lowering to 0 then takes back the other.
    let slot = first.name().to_owned();
    first.release().await.unwrap();
    let info = setup.table().get(&slot).await.unwrap();
    assert!(!info.is_held());
    let change = a.call(SetLimit::new("exports", 0)).await.unwrap();
    assert_eq!((change.previous, change.revoked), (Some(2), 1));
    b.call(RunNow).await.unwrap();
    assert_eq!(second.lost().await, Some(LossReason::TakenOver));
    let err = a
        .call(SetLimit::new("exports", pgcoord::lease::MAX_PERMITS + 1))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidConfig);
}
