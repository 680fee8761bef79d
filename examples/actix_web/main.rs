//! An actix-web service on pgcoord: two instances (standing in for two processes) share a
//! cache-invalidation event and a leader-elected background job. One `POST /invalidate/{key}`
//! clears the key on every instance; exactly one instance runs the job, and when it stops the
//! other takes over at once.
//!
//! On SIGTERM (what systemd and Kubernetes send) or ctrl-c, and when the demo is done, each
//! instance stops its HTTP server and then pgcoord, whose shutdown releases every lease (the
//! leadership too) at once rather than leaving them to expire.
//!
//! Run with `cargo run --example actix_web`. It uses `DATABASE_URL` when set, and otherwise
//! starts a throwaway PostgreSQL from the locally installed server binaries (removed on exit).
//! With `-- --serve` it skips the demo and serves until SIGTERM or ctrl-c.

use std::time::Duration;

use pgcoord::Config;

mod app;

#[path = "../common/stop_signal.rs"]
mod stop_signal;
use stop_signal::StopSignal;

#[actix_web::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // First of all: from here on SIGTERM and ctrl-c stop the instances the orderly way below,
    // instead of killing the process with its leases held until they expire. (The HTTP
    // servers leave signals to this: see `app::start`.)
    let mut stop_signal = StopSignal::install()?;
    let serve = std::env::args().skip(1).any(|arg| arg == "--serve");
    let (_server, pg) = pgcoord_testkit::from_env_or_start()?;
    let config = |owner: &str| Config::builder().pg_config(&pg).owner(owner).build();
    pgcoord::schema::migrate(
        &pgcoord::db::connect_spawned(&config("setup")?).await?,
        &config("setup")?,
    )
    .await?;
    let mut instances = vec![
        app::start(config("instance-a")?, "instance-a").await?,
        app::start(config("instance-b")?, "instance-b").await?,
    ];
    for (instance, url, _) in &instances {
        println!("{} serving on {url}", instance.name);
    }

    let outcome = tokio::select! {
        outcome = demo(&instances), if !serve => outcome,
        signal = stop_signal.received() => {
            println!("{signal}: stopping");
            Ok(None)
        }
    };
    let outcome = match outcome {
        // The demo's end: the leader stops, and the other takes over at once.
        Ok(Some(at)) => {
            let (leader, _, server) = instances.remove(at);
            app::stop(&leader, server).await;
            tokio::time::sleep(Duration::from_millis(300)).await;
            let other = &instances[0].0;
            let leads = other.leading.load(std::sync::atomic::Ordering::SeqCst);
            println!("{} stopped; {} leads now: {leads}", leader.name, other.name);
            Ok(())
        }
        Ok(None) => Ok(()),
        Err(e) => Err(e),
    };
    // The candidates first, then the leader: resigning, it would hand its leadership to a
    // candidate about to stop, in the middle of stopping.
    let leading = |i: &app::Instance| i.leading.load(std::sync::atomic::Ordering::SeqCst);
    instances.sort_by_key(|(instance, _, _)| leading(instance));
    for (instance, _, server) in instances {
        app::stop(&instance, server).await;
    }
    outcome
}

/// The demo: an invalidation through one instance clears the key on both; one of them leads.
/// Returns which one.
async fn demo(
    instances: &[(app::Instance, String, actix_web::dev::ServerHandle)],
) -> Result<Option<usize>, Box<dyn std::error::Error>> {
    let http = awc::Client::default();
    let (a_url, b_url) = (&instances[0].1, &instances[1].1);
    for url in [a_url, b_url] {
        http.put(format!("{url}/cache/user-7"))
            .send_body("Ada")
            .await?;
    }
    http.post(format!("{a_url}/invalidate/user-7"))
        .send()
        .await?;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let on_b = http
        .get(format!("{b_url}/cache/user-7"))
        .send()
        .await?
        .status();
    println!("invalidated through instance A; instance B now answers {on_b} for user-7");

    tokio::time::sleep(Duration::from_millis(300)).await;
    for url in [a_url, b_url] {
        let status: serde_json::Value = http
            .get(format!("{url}/status"))
            .send()
            .await?
            .json()
            .await?;
        println!("{status}");
    }
    let leading = |i: &app::Instance| i.leading.load(std::sync::atomic::Ordering::SeqCst);
    let at = (instances.iter())
        .position(|(i, _, _)| leading(i))
        .ok_or("nobody leads")?;
    Ok(Some(at))
}
