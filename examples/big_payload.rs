//! A 1 MiB event between two processes: too large for a notification (8,000 bytes), so the
//! payload goes through the payload store and only its key is notified; the subscriber gets the
//! bytes as they were sent.
//!
//! Run with `cargo run --example big_payload`. It uses `DATABASE_URL` when set, and otherwise
//! starts a throwaway PostgreSQL from the locally installed server binaries (removed on exit).

use std::time::Instant;

use pgcoord::{Config, schema};
use pgcoord_actors::{Coordinator, Heard, Publish};

#[actix::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (_server, pg) = pgcoord_testkit::from_env_or_start()?;
    let config = |owner: &str| Config::builder().pg_config(&pg).owner(owner).build();
    let client = pgcoord::db::connect_spawned(&config("setup")?).await?;
    schema::migrate(&client, &config("setup")?).await?;
    // Two coordinators stand for two processes.
    let (sender, receiver) = (
        Coordinator::connect(config("sender")?).await?,
        Coordinator::connect(config("receiver")?).await?,
    );
    // Listening once this answers.
    let mut reports = receiver.subscribe("reports").await?;

    let report: Vec<u8> = (0..1u32 << 20).map(|i| (i % 251) as u8).collect();
    let sent = Instant::now();
    sender
        .signals()
        .unwrap()
        .send(Publish::new("reports", report.clone()))
        .await??;
    let Some(Heard::Signal(received)) = reports.next().await else {
        return Err("the report was missed".into());
    };
    println!(
        "{} bytes received in {:.1} ms, identical: {}",
        received.payload.len(),
        sent.elapsed().as_secs_f64() * 1000.0,
        received.payload[..] == report[..]
    );
    let stored: i64 = client
        .query_one(
            &format!(
                "SELECT count(*) FROM {}",
                config("setup")?.payload_table().quoted()
            ),
            &[],
        )
        .await?
        .get(0);
    println!("rows in the payload store: {stored} (expired rows are deleted on a timer)");
    assert!(received.payload[..] == report[..]);
    Ok(())
}
