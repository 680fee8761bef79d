//! `Coordinator::health`: a readiness answer within the caller's bound, whatever the
//! connections do.

use std::time::{Duration, Instant};

use pgcoord_actors::*;
use pgcoord_testkit::{Proxy, unique_name};

use super::Setup;

#[actix_rt::test]
async fn health_answers_within_its_bound_and_says_what_is_not_well() {
    // A lease long enough that the outage below is reported by health, not by a loss.
    let (setup, _admin) = Setup::new(Duration::from_secs(20), Duration::from_secs(1)).await;
    let proxy = Proxy::start(&setup.pg).await.unwrap();
    let config = setup
        .builder("health")
        .pg_config(&proxy.pg_config(&setup.pg))
        .build()
        .unwrap();
    let coordinator = Coordinator::connect(config).await.unwrap();
    let _lease = coordinator
        .locks()
        .unwrap()
        .call(Acquire::new(unique_name("health")))
        .await
        .unwrap();
    let ready_within = |limit: Duration| {
        let coordinator = coordinator.clone();
        async move {
            let deadline = Instant::now() + limit;
            loop {
                let health = coordinator.health(Duration::from_secs(1)).await;
                if health.is_ready() {
                    return health;
                }
                assert!(Instant::now() < deadline, "never ready: {health:?}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    let health = ready_within(Duration::from_secs(10)).await;
    assert_eq!(health.renewals_failing, Some(0));
    // A readiness endpoint's JSON body: `ready` beside the parts.
    assert_eq!(
        serde_json::to_value(&health).unwrap(),
        serde_json::json!({"ready": true, "listening": true, "renewals_failing": 0, "database": null})
    );

    // Every connection black-holed and new ones refused: the answer still comes in its bound,
    // and says the database does not answer; soon the heartbeat says so too.
    proxy.refuse(true);
    proxy.cut();
    let bound = Duration::from_millis(500);
    let asked = Instant::now();
    let health = coordinator.health(bound).await;
    let took = asked.elapsed();
    // The bound is a deadline; the slack is only this machine's scheduling.
    assert!(
        took < bound + Duration::from_secs(1),
        "answered after {took:?}"
    );
    assert!(!health.is_ready(), "{health:?}");
    assert!(health.database.is_some(), "{health:?}");
    let body = serde_json::to_value(&health).unwrap();
    assert_eq!(body["ready"], false, "{body}");
    assert!(body["database"].is_string(), "{body}");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let health = coordinator.health(bound).await;
        if health.renewals_failing.is_some_and(|n| n > 0) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "renewals never said failing: {health:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Back: ready again, by itself.
    proxy.refuse(false);
    proxy.reset();
    ready_within(Duration::from_secs(15)).await;
}
