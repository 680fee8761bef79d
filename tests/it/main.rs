//! Integration tests of the core against a real PostgreSQL: the shared throwaway cluster, or
//! `DATABASE_URL` when it is set.

mod actix_web;
mod batch;
mod batch_plans;
mod config;
mod election;
mod embedded;
mod errors;
mod example_signals;
mod ident;
mod inspect;
mod isolation;
mod lease;
mod limit;
mod rate;
mod release;

mod schema;
mod sql_functions;
#[cfg(feature = "sqlx")]
mod sqlx;
mod standby;
mod tls;
mod tokens;
mod topic;
mod topic_pending;
mod topic_retention;

use std::time::Duration;

use pgcoord::LeaseTable;
use pgcoord::lease::{AcquireRequest, Attempt, Grant};
use pgcoord::{Config, ConfigBuilder};
use pgcoord_testkit::{test_pg_config, unique_name};
use tokio_postgres::Client;

/// A builder pointed at the test database, with its own tables and lease channel.
pub fn builder() -> ConfigBuilder {
    let pg = test_pg_config().expect("test database");
    let table = unique_name("locks");
    Config::builder()
        .pg_config(&pg)
        .lock_table(&table)
        .payload_table(unique_name("payloads"))
        .topic_table(unique_name("topics"))
}

/// A dedicated client for `config`, driven on its own task.
pub async fn connect(config: &Config) -> Client {
    pgcoord::db::connect_spawned(config).await.expect("connect")
}

/// A configuration with its own, migrated tables, and a client to inspect them.
pub async fn setup() -> (Config, Client) {
    let config = builder().build().expect("config");
    let client = connect(&config).await;
    pgcoord::schema::migrate(&client, &config)
        .await
        .expect("migrate");
    (config, client)
}

/// The lease of the lease tests' grants.
pub const LEASE: Duration = Duration::from_secs(30);

/// Grants `name` to `owner`, which must succeed.
pub async fn grant(
    table: &LeaseTable,
    client: &(impl pgcoord::Statements + ?Sized),
    name: &str,
    owner: &str,
    lease: Duration,
) -> Grant {
    match table
        .owner(owner)
        .unwrap()
        .try_acquire(client, &AcquireRequest::new(name), lease)
        .await
        .unwrap()
    {
        Attempt::Granted(grant) => grant,
        Attempt::Held(holder) => panic!("{name} held by {holder:?}"),
        Attempt::Busy => panic!("{name}'s row is locked"),
    }
}

/// Puts `waiter` in line for `name`, which someone else holds, for `wait_for`: a refused
/// attempt in line. Returns the holder.
pub async fn in_line(
    table: &LeaseTable,
    client: &(impl pgcoord::Statements + ?Sized),
    name: &str,
    waiter: &str,
    wait_for: Duration,
) -> Option<pgcoord::Holder> {
    let owner = table.owner(waiter).unwrap();
    let request = AcquireRequest::new(name);
    match owner
        .try_acquire_or_queue(client, &request, LEASE, wait_for)
        .await
        .unwrap()
    {
        Attempt::Held(holder) => holder,
        other => panic!("{waiter} was not refused {name:?}: {other:?}"),
    }
}

/// Releases `owner`'s tenure `token` of `name`, which must succeed.
pub async fn release(
    table: &LeaseTable,
    client: &(impl pgcoord::Statements + ?Sized),
    name: &str,
    owner: &str,
    token: i64,
    keep: bool,
) {
    let request = pgcoord::lease::ReleaseRequest {
        name,
        token,
        keep,
        announce_always: false,
    };
    (table.owner(owner).unwrap())
        .release(client, &request)
        .await
        .unwrap();
}
