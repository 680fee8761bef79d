//! Quickstart: connect, apply pgcoord's schema, and show what it created.
//!
//! Run with `cargo run --example quickstart`. It uses `DATABASE_URL` when set, and otherwise
//! starts a throwaway PostgreSQL from the locally installed server binaries (removed on exit).

use pgcoord::{Config, schema};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Keep the throwaway server (if one was started) alive until the end of main.
    let (server, pg) = pgcoord::embedded::from_env_or_start()?;
    if let Some(server) = &server {
        println!("started a throwaway PostgreSQL on port {}", server.port());
    }
    let config = Config::builder().pg_config(&pg).build()?;
    println!("owner identity: {}", config.owner());

    let client = pgcoord::db::connect_spawned(&config).await?;
    schema::migrate(&client, &config).await?;
    let rows = client
        .query(
            "SELECT c.relname::text, CASE c.relkind WHEN 'r' THEN 'table' WHEN 'S' THEN 'sequence'
             ELSE 'index' END FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
             WHERE n.nspname = current_schema() AND c.relname LIKE 'pgcoord%' ORDER BY 1",
            &[],
        )
        .await?;
    println!("schema applied; pgcoord's objects:");
    for row in rows {
        println!(
            "  {:<28} {}",
            row.get::<_, String>(0),
            row.get::<_, String>(1)
        );
    }
    Ok(())
}
