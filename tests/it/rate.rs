//! Rate limits: the bucket's arithmetic on the server's clock, concurrent takes never above the
//! limit, and bad input refused before anything is written.

use std::time::{Duration, Instant};

use pgcoord::ErrorKind;
use pgcoord::RateTable;
use pgcoord::rate::RateLimit;

use super::{connect, setup};

#[tokio::test]
async fn a_full_bucket_gives_its_burst_then_one_per_interval() {
    let (config, client) = setup().await;
    let table = RateTable::new(&config);
    let rate = RateLimit::new(10, Duration::from_secs(1))
        .unwrap()
        .burst(3)
        .unwrap();
    assert_eq!(rate.interval(), Duration::from_millis(100));
    for _ in 0..3 {
        let taken = table.try_take(&client, "k", 1, &rate).await.unwrap();
        assert_eq!((taken.granted, taken.retry_after), (1, Duration::ZERO));
    }
    let refused = table.try_take(&client, "k", 1, &rate).await.unwrap();
    assert_eq!(refused.granted, 0);
    assert!(
        refused.retry_after > Duration::ZERO && refused.retry_after <= rate.interval(),
        "{refused:?}"
    );
    // After the wait it names the bucket has room again: the wait is never too short.
    tokio::time::sleep(refused.retry_after).await;
    let again = table.try_take(&client, "k", 1, &rate).await.unwrap();
    assert_eq!(again.granted, 1, "{again:?}");
    // Another key has a bucket of its own.
    let other = table.try_take(&client, "other", 3, &rate).await.unwrap();
    assert_eq!(other.granted, 3);
}

#[tokio::test]
async fn all_or_nothing_and_up_to_differ_only_on_a_partial_bucket() {
    let (config, client) = setup().await;
    let table = RateTable::new(&config);
    let rate = RateLimit::new(5, Duration::from_secs(50)).unwrap(); // one per 10 s: nothing refills
    let some = table.try_take(&client, "k", 3, &rate).await.unwrap();
    assert_eq!(some.granted, 3);
    let all = table.try_take(&client, "k", 3, &rate).await.unwrap();
    assert_eq!(all.granted, 0, "3 do not fit in 2: none taken");
    // 3 need one more token: about one interval (10 s), less what passed since.
    assert!(all.retry_after > Duration::from_secs(9), "{all:?}");
    assert!(all.retry_after <= Duration::from_secs(10), "{all:?}");
    let up_to = table.take_up_to(&client, "k", 3, &rate).await.unwrap();
    assert_eq!(up_to.granted, 2, "the 2 left");
    assert!(up_to.retry_after > Duration::from_secs(9), "{up_to:?}");
    let empty = table.take_up_to(&client, "k", 1, &rate).await.unwrap();
    assert_eq!(empty.granted, 0);
}

#[tokio::test]
async fn concurrent_takes_never_admit_more_than_the_limit() {
    let (config, _client) = setup().await;
    let table = RateTable::new(&config);
    // 200 per second, a burst of 20: over the run at most 20 + 200 × its length (in seconds).
    let rate = RateLimit::per_second(200).unwrap().burst(20).unwrap();
    let started = Instant::now();
    let mut takers = Vec::new();
    for _ in 0..8 {
        let (config, table) = (config.clone(), table.clone());
        takers.push(tokio::spawn(async move {
            let client = connect(&config).await;
            let mut granted = 0u32;
            let until = Instant::now() + Duration::from_secs(1);
            while Instant::now() < until {
                granted += table
                    .try_take(&client, "hot", 1, &rate)
                    .await
                    .unwrap()
                    .granted;
            }
            granted
        }));
    }
    let mut granted = 0;
    for taker in takers {
        granted += taker.await.unwrap();
    }
    // The server's time between the first take and the last is within the local run's.
    let elapsed = started.elapsed();
    let most = 20 + (elapsed.as_secs_f64() * 200.0).ceil() as u32;
    assert!(
        granted <= most,
        "{granted} granted in {elapsed:?}: at most {most}"
    );
    assert!(granted >= 20, "at least the burst: {granted}");
}

#[tokio::test]
async fn bad_rates_and_takes_are_refused_and_write_nothing() {
    let (config, client) = setup().await;
    let table = RateTable::new(&config);
    let kind = |r: pgcoord::Result<RateLimit>| r.unwrap_err().kind();
    assert_eq!(kind(RateLimit::per_second(0)), ErrorKind::InvalidConfig);
    assert_eq!(
        kind(RateLimit::new(1, Duration::ZERO)),
        ErrorKind::InvalidConfig
    );
    assert_eq!(
        kind(RateLimit::new(2_000_000, Duration::from_secs(1))),
        ErrorKind::InvalidConfig
    );
    assert_eq!(
        kind(RateLimit::per_second(5).unwrap().burst(0)),
        ErrorKind::InvalidConfig
    );
    // A bucket whose arithmetic would overflow the server's int8 is refused, not sent.
    let yearly = RateLimit::new(1, Duration::from_secs(365 * 86_400)).unwrap();
    assert_eq!(kind(yearly.burst(u32::MAX)), ErrorKind::InvalidConfig);
    let rate = RateLimit::per_second(5).unwrap();
    let refused = [
        (
            table.try_take(&client, "k", 0, &rate).await,
            ErrorKind::InvalidConfig,
        ),
        (
            table.try_take(&client, "k", 6, &rate).await,
            ErrorKind::InvalidConfig,
        ),
        (
            table.take_up_to(&client, "k", 0, &rate).await,
            ErrorKind::InvalidConfig,
        ),
        (
            table.try_take(&client, "", 1, &rate).await,
            ErrorKind::InvalidName,
        ),
        (
            table.try_take(&client, &"k".repeat(256), 1, &rate).await,
            ErrorKind::InvalidName,
        ),
        (
            table.try_take(&client, "nul\0", 1, &rate).await,
            ErrorKind::InvalidName,
        ),
    ];
    for (r, kind) in refused {
        let e = r.unwrap_err();
        assert_eq!(e.kind(), kind, "{e}");
    }
    let sql = format!("SELECT count(*) FROM {}", config.rate_table().quoted());
    let rows: i64 = client.query_one(&sql, &[]).await.unwrap().get(0);
    assert_eq!(rows, 0, "nothing written");
}
