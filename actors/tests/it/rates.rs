//! Rate limits through the runtime: a fleet of takers held to the limit, a wait bounded by its
//! timeout, also when the server is unreachable.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pgcoord::ErrorKind;
use pgcoord::rate::RateLimit;
use pgcoord_actors::*;
use pgcoord_testkit::Proxy;

use super::Setup;

/// When a grant's take was sent and answered: the server granted it in between.
type Grants = Arc<Mutex<Vec<(Instant, Instant)>>>;

#[actix_rt::test]
async fn eight_coordinators_taking_at_100_per_second_get_the_limit_and_no_burst_beyond_it() {
    let (setup, _admin) = Setup::new(Duration::from_secs(10), Duration::from_secs(2)).await;
    let (per_second, burst) = (100u32, 20u32);
    let rate = RateLimit::per_second(per_second)
        .unwrap()
        .burst(burst)
        .unwrap();
    let grants = Grants::default();
    let run = Duration::from_secs(10);
    let started = Instant::now();
    let mut takers = Vec::new();
    for i in 0..8 {
        let coordinator = Coordinator::start(setup.builder(&format!("taker-{i}")).build().unwrap());
        let limiter = coordinator.rate_limiter(rate);
        let grants = grants.clone();
        takers.push(tokio::spawn(async move {
            while started.elapsed() < run {
                let sent = Instant::now();
                match limiter.take("hot", 1, Duration::from_secs(1)).await {
                    Ok(()) => grants.lock().unwrap().push((sent, Instant::now())),
                    Err(e) => assert_eq!(e.kind(), ErrorKind::Timeout, "{e}"),
                }
            }
            coordinator
        }));
    }
    let mut coordinators = Vec::new();
    for taker in takers {
        coordinators.push(taker.await.unwrap());
    }
    let elapsed = started.elapsed();
    for coordinator in coordinators {
        coordinator.shutdown(Duration::from_secs(5)).await.unwrap();
    }
    let grants = grants.lock().unwrap().clone();
    // The observed rate, beyond the first burst, within 5% of the limit.
    let observed = (grants.len() as f64 - f64::from(burst)) / elapsed.as_secs_f64();
    eprintln!("{} granted in {elapsed:?}: {observed:.2}/s", grants.len());
    assert!(
        (observed - f64::from(per_second)).abs() <= f64::from(per_second) * 0.05,
        "{} granted in {elapsed:?}: {observed:.1}/s against {per_second}/s",
        grants.len()
    );
    // No burst beyond the configured one: in any second, the grants whose take was sent and
    // answered within it number at most the burst plus a second's worth (and one for rounding).
    for &(from, _) in &grants {
        let to = from + Duration::from_secs(1);
        let within = grants
            .iter()
            .filter(|(s, a)| *s >= from && *a <= to)
            .count();
        assert!(
            within as u32 <= burst + per_second + 1,
            "{within} granted within one second"
        );
    }
}

#[actix_rt::test]
async fn a_take_answers_within_its_timeout_with_nothing_taken() {
    let (setup, admin) = Setup::new(Duration::from_secs(10), Duration::from_secs(2)).await;
    let coordinator = Coordinator::start(setup.builder("one").build().unwrap());
    // One per 10 s: after the first, nothing fits within a short timeout.
    let slow = coordinator.rate_limiter(RateLimit::new(1, Duration::from_secs(10)).unwrap());
    slow.take("k", 1, Duration::from_secs(1)).await.unwrap();
    let started = Instant::now();
    let e = slow
        .take("k", 1, Duration::from_millis(300))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Timeout, "{e}");
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(290) && took < Duration::from_millis(800),
        "answered at its deadline: {took:?}"
    );
    // A wait that fits is waited: 10 per second, a burst of 1.
    let fast = coordinator.rate_limiter(RateLimit::per_second(10).unwrap().burst(1).unwrap());
    fast.take("f", 1, Duration::from_secs(1)).await.unwrap();
    let started = Instant::now();
    fast.take("f", 1, Duration::from_secs(5)).await.unwrap();
    assert!(
        started.elapsed() >= Duration::from_millis(50),
        "it waited for room"
    );
    // A refused take took nothing: the slow key's bucket still has what it had.
    let sql = format!("SELECT granted FROM \"{}_rl\" WHERE key = 'k'", setup.table);
    let granted: i64 = admin.query_one(&sql, &[]).await.unwrap().get(0);
    assert_eq!(granted, 0, "the last take got nothing");
    coordinator.shutdown(Duration::from_secs(5)).await.unwrap();
}

#[actix_rt::test]
async fn a_take_answers_within_its_timeout_when_the_server_is_unreachable() {
    let (setup, _admin) = Setup::new(Duration::from_secs(10), Duration::from_secs(2)).await;
    let proxy = Proxy::start(&setup.pg).await.unwrap();
    let config = setup
        .builder("cut")
        .pg_config(&proxy.pg_config(&setup.pg))
        .build()
        .unwrap();
    let coordinator = Coordinator::connect(config).await.unwrap();
    let limiter = coordinator.rate_limiter(RateLimit::per_second(10).unwrap());
    limiter.try_take("k", 1).await.unwrap();
    proxy.refuse(true);
    proxy.cut();
    for timeout in [Duration::from_millis(200), Duration::from_secs(1)] {
        let started = Instant::now();
        let e = limiter.take("k", 1, timeout).await.unwrap_err();
        let took = started.elapsed();
        assert!(
            matches!(e.kind(), ErrorKind::Timeout | ErrorKind::Unavailable),
            "{e}"
        );
        // The deadline is the caller's: a little over it for the cancel, never the statement
        // timeout or the TCP timeout.
        assert!(
            took < timeout + Duration::from_millis(500),
            "{took:?} for {timeout:?}"
        );
    }
}
