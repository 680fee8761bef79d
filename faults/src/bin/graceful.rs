//! A process that holds a lease until SIGTERM, then stops gracefully through
//! `Coordinator::shutdown`, as a service should.
//!
//! `graceful --dsn D --lock-table L --name N --owner O` prints `HELD <token>` once it holds
//! lease `N`, and `STOPPED <released>` after its shutdown on SIGTERM (or `ERROR <message>`).

use std::time::Duration;

use pgcoord::Config;
use pgcoord_actors::{Acquire, Coordinator};
use pgcoord_faults::program::{need, say};

#[actix::main]
async fn main() {
    let config = Config::builder()
        .dsn(need("--dsn"))
        .lock_table(need("--lock-table"))
        .owner(need("--owner"))
        .lease(Duration::from_secs(60))
        .build()
        .expect("valid configuration");
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("a SIGTERM handler");
    let coordinator = match Coordinator::connect(config).await {
        Ok(coordinator) => coordinator,
        Err(e) => return say(&format!("ERROR {e}")),
    };
    let lease = match coordinator.acquire(Acquire::new(need("--name"))).await {
        Ok(lease) => lease,
        Err(e) => return say(&format!("ERROR {e}")),
    };
    say(&format!("HELD {}", lease.token()));
    terminate.recv().await;
    match coordinator.shutdown(Duration::from_secs(5)).await {
        Ok(released) => say(&format!("STOPPED {released}")),
        Err(e) => say(&format!("ERROR {e}")),
    }
}
