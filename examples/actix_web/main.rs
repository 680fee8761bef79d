//! An actix-web service on pgcoord: two instances (standing in for two processes) share a
//! cache-invalidation event and a leader-elected background job. One `POST /invalidate/{key}`
//! clears the key on every instance; exactly one instance runs the job, and when it stops the
//! other takes over at once.
//!
//! Run with `cargo run --example actix_web`. It uses `DATABASE_URL` when set, and otherwise
//! starts a throwaway PostgreSQL from the locally installed server binaries (removed on exit).

use std::time::Duration;

use pgcoord::Config;

mod app;

#[actix_web::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (_server, pg) = pgcoord_testkit::from_env_or_start()?;
    let config = |owner: &str| Config::builder().pg_config(&pg).owner(owner).build();
    pgcoord::schema::migrate(
        &pgcoord::db::connect_spawned(&config("setup")?).await?,
        &config("setup")?,
    )
    .await?;
    let (a, a_url, a_server) = app::start(config("instance-a")?, "instance-a").await?;
    let (b, b_url, b_server) = app::start(config("instance-b")?, "instance-b").await?;
    let http = awc::Client::default();

    for url in [&a_url, &b_url] {
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
    for url in [&a_url, &b_url] {
        let status: serde_json::Value = http
            .get(format!("{url}/status"))
            .send()
            .await?
            .json()
            .await?;
        println!("{status}");
    }
    let mut instances = vec![(a, a_server), (b, b_server)];
    let leading = |i: &app::Instance| i.leading.load(std::sync::atomic::Ordering::SeqCst);
    let at = instances
        .iter()
        .position(|(i, _)| leading(i))
        .ok_or("nobody leads")?;
    let (leader, server) = instances.remove(at);
    app::stop(&leader, server).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (other, server) = instances.remove(0);
    println!(
        "{} stopped; {} leads now: {}",
        leader.name,
        other.name,
        leading(&other)
    );
    app::stop(&other, server).await;
    Ok(())
}
