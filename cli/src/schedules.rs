//! `schedules`: what each schedule last did, or one schedule's last runs.

use std::time::SystemTime;

use pgcoord::schedule::{RunInfo, ScheduleTable};
use pgcoord::{Config, Result};
use serde_json::Value;
use tokio_postgres::Client;

use crate::output::Listing;

/// `schedules [NAME] [--count N]`.
pub async fn list(
    config: &Config,
    client: &Client,
    name: Option<&str>,
    count: u32,
    json: bool,
) -> Result<()> {
    let table = ScheduleTable::new(config);
    let runs = match name {
        Some(name) => table.runs(client, name, count).await?,
        None => table.latest(client).await?,
    };
    let mut listing = Listing::new(
        &[
            "SCHEDULE", "TICK", "STATE", "ATTEMPTS", "OWNER", "TOKEN", "NEXT", "ERROR",
        ],
        "run(s)",
    );
    for run in &runs {
        listing.push(row(run));
    }
    listing.print(json);
    Ok(())
}

fn row(run: &RunInfo) -> Vec<Value> {
    vec![
        run.schedule.clone().into(),
        time(Some(run.tick)),
        run.state.as_str().into(),
        run.attempts.into(),
        run.owner.clone().into(),
        run.token.into(),
        time(run.next_tick),
        run.error.clone().map_or(Value::Null, Value::from),
    ]
}

/// An instant as RFC 3339 in UTC (ticks are the server's instants); null when none.
fn time(at: Option<SystemTime>) -> Value {
    at.map_or(Value::Null, |t| {
        humantime::format_rfc3339_micros(t).to_string().into()
    })
}
