//! The `actix_web` example's application, started here twice and driven with a real HTTP client:
//! one invalidation clears a key on every instance, one instance at a time runs the leader's
//! job, and the other takes over at once when it stops.

use std::sync::atomic::Ordering;
use std::time::Duration;

#[path = "../../examples/actix_web/app.rs"]
#[allow(dead_code)]
mod app;

#[actix_rt::test]
async fn instances_share_invalidations_and_one_runs_the_leaders_job() {
    let builder = super::builder();
    let setup = builder.owner("setup").build().unwrap();
    pgcoord::schema::migrate(&super::connect(&setup).await, &setup)
        .await
        .unwrap();
    let config = |owner: &str| {
        pgcoord::Config::builder()
            .pg_config(setup.pg_config())
            .lock_table(setup.lock_table().to_string())
            .payload_table(setup.payload_table().to_string())
            .owner(owner)
            .build()
            .unwrap()
    };
    let (a, a_url, a_server) = app::start(config("a"), "a").await.unwrap();
    let (b, b_url, b_server) = app::start(config("b"), "b").await.unwrap();
    let http = awc::Client::default();

    for url in [&a_url, &b_url] {
        let put = http
            .put(format!("{url}/cache/k"))
            .send_body("v")
            .await
            .unwrap();
        assert_eq!(put.status(), 204);
        let mut got = http.get(format!("{url}/cache/k")).send().await.unwrap();
        assert_eq!(got.body().await.unwrap(), "v");
    }
    let posted = http
        .post(format!("{b_url}/invalidate/k"))
        .send()
        .await
        .unwrap();
    assert_eq!(posted.status(), 202);
    for url in [&a_url, &b_url] {
        pgcoord_testkit::eventually(
            Duration::from_secs(2),
            "the key cleared everywhere",
            async || {
                let got = http.get(format!("{url}/cache/k")).send().await.unwrap();
                got.status() == 404
            },
        )
        .await;
    }

    // One leader, whose job runs; the other's does not.
    pgcoord_testkit::eventually(Duration::from_secs(2), "a leader", async || {
        a.leading.load(Ordering::SeqCst) || b.leading.load(Ordering::SeqCst)
    })
    .await;
    let (leader, leader_server, other, other_server) = if a.leading.load(Ordering::SeqCst) {
        (a, a_server, b, b_server)
    } else {
        (b, b_server, a, a_server)
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!other.leading.load(Ordering::SeqCst), "two leaders");
    assert!(leader.job_runs.load(Ordering::SeqCst) > 0);
    assert_eq!(other.job_runs.load(Ordering::SeqCst), 0);
    let status: serde_json::Value = http
        .get(format!(
            "{}/status",
            if leader.name == "a" { &a_url } else { &b_url }
        ))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(status["leading"], true);

    // The leader stops: the other takes over at once (its lease is released, not left to
    // expire: 20 s).
    app::stop(&leader, leader_server).await;
    pgcoord_testkit::eventually(Duration::from_secs(2), "the other takes over", async || {
        other.leading.load(Ordering::SeqCst)
    })
    .await;
    app::stop(&other, other_server).await;
}
