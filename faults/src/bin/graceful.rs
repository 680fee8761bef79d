//! A process that holds a lease until SIGTERM, then stops gracefully through
//! `Coordinator::shutdown`, as a service should.
//!
//! `graceful --dsn D --lock-table L --name N --owner O` prints `HELD <token>` once it holds
//! lease `N`, and `STOPPED <released>` after its shutdown on SIGTERM (or `ERROR <message>`).

use std::time::Duration;

use pgcoord::Config;
use pgcoord_actors::{Acquire, Call, Coordinator};

fn say(line: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

#[actix::main]
async fn main() {
    let argv: Vec<String> = std::env::args().collect();
    let get = |name: &str| {
        argv.iter()
            .position(|a| a == name)
            .and_then(|i| argv.get(i + 1))
            .cloned()
            .unwrap_or_else(|| panic!("{name} is required"))
    };
    let config = Config::builder()
        .dsn(get("--dsn"))
        .lock_table(get("--lock-table"))
        .owner(get("--owner"))
        .lease(Duration::from_secs(60))
        .build()
        .expect("valid configuration");
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("a SIGTERM handler");
    let coordinator = match Coordinator::connect(config).await {
        Ok(coordinator) => coordinator,
        Err(e) => return say(&format!("ERROR {e}")),
    };
    let lease = match coordinator.locks.call(Acquire::new(get("--name"))).await {
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
