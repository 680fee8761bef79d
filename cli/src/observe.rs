//! `elect observe`: who leads an election, and each change of leader, until interrupted.
//!
//! The runtime's observer does the watching (`Election::changes`): what it reports is read from
//! the lock table, a notification only makes it read sooner, so a forged or replayed one prints
//! nothing new. A resync that finds the same leader again prints nothing either: one line per
//! change.

use std::time::Duration;

use futures_util::StreamExt;
use pgcoord::{Config, Error, ErrorKind, Result};
use pgcoord_actors::{LeaderChanged, Runtime};
use serde_json::{Value, json};
use tokio::signal::unix::{SignalKind, signal};

use crate::output;

/// Watches election `name` and prints its leader at each change, `count` lines at most.
/// `within` bounds the start (connecting).
pub async fn run(
    config: Config,
    name: &str,
    count: Option<usize>,
    within: Duration,
    json: bool,
) -> Result<u8> {
    // A name no lease could have: a usage error before connecting.
    pgcoord::lease::check_name(name)?;
    let io = |e: std::io::Error| Error::new(ErrorKind::Other, format!("signal handler: {e}"));
    let mut terminate = signal(SignalKind::terminate()).map_err(io)?;
    let mut interrupt = signal(SignalKind::interrupt()).map_err(io)?;
    let mut hangup = signal(SignalKind::hangup()).map_err(io)?;
    let runtime = match tokio::time::timeout(within, Runtime::connect(config)).await {
        Ok(runtime) => runtime?,
        Err(_) => {
            return Err(Error::new(
                ErrorKind::Timeout,
                format!("no connection to the database within {within:?} (--timeout)"),
            ));
        }
    };
    let watched = async {
        let mut changes = runtime.coordinator().election(name)?.changes();
        let mut last = None;
        let mut printed = 0;
        while count.is_none_or(|count| printed < count) {
            let Some(change) = changes.next().await else {
                return Err(Error::new(
                    ErrorKind::Unavailable,
                    "the runtime stopped watching the election",
                ));
            };
            if last.as_ref() == Some(&change.leader) {
                continue;
            }
            println!("{}", line(&change, json));
            last = Some(change.leader);
            printed += 1;
        }
        Ok(())
    };
    let watched = tokio::select! {
        watched = watched => watched,
        _ = terminate.recv() => Ok(()),
        _ = interrupt.recv() => Ok(()),
        _ = hangup.recv() => Ok(()),
    };
    // Nothing is held: the shutdown only stops the actors and closes the connections.
    let _ = runtime.shutdown(Duration::from_secs(5)).await;
    watched.map(|()| 0)
}

/// A change as printed: `OWNER leads (term TOKEN): VALUE`, `no leader`, or a JSON object.
fn line(change: &LeaderChanged, json: bool) -> String {
    let leader = change.leader.as_ref();
    if json {
        let leader = leader.map_or(Value::Null, |l| {
            json!({
                "owner": l.owner,
                "token": l.token,
                "value": output::data(Some(&l.value)),
            })
        });
        return json!({
            "election": change.election,
            "leader": leader,
            "resync": change.resync,
        })
        .to_string();
    }
    match leader {
        None => "no leader".to_owned(),
        Some(l) => format!(
            "{} leads (term {}): {}",
            l.owner,
            l.token,
            output::text(&output::data(Some(&l.value)))
        ),
    }
}
