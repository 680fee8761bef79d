//! Tokens follow the order of grants even when a grant's statement stalls between drawing its
//! token and writing its row. A trigger stands in for a server backend that the scheduler, a
//! lock wait or a page fault holds there: PostgreSQL evaluates an `INSERT`'s values, the token
//! among them, before it looks for a conflicting row, and it keeps them through the waits of
//! `ON CONFLICT`.

use std::time::{Duration, Instant};

use pgcoord::lease::{AcquireRequest, Attempt, SlotAttempt};
use pgcoord::{Config, LeaseTable};
use tokio_postgres::Client;

use super::{LEASE, release};

/// How a stalled owner asks for the lease: each grant statement.
#[derive(Debug, Clone, Copy)]
enum Statement {
    Acquire,
    AcquireOrQueue,
    AcquireMany,
    AcquireAny,
}

/// Makes every row insert by owner `stalled` sleep a second before the row is written.
async fn stall_inserts_of_stalled(config: &Config, client: &Client) {
    let table = config.lock_table().quoted();
    let function = pgcoord_testkit::unique_name("stall");
    client
        .batch_execute(&format!(
            "CREATE FUNCTION {function}() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN
                 IF NEW.owner = 'stalled' THEN PERFORM pg_sleep(1); END IF;
                 RETURN NEW;
             END $$;
             CREATE TRIGGER stall BEFORE INSERT ON {table}
                 FOR EACH ROW EXECUTE FUNCTION {function}();"
        ))
        .await
        .unwrap();
}

/// Waits until a statement on `config`'s lock table sleeps in the trigger.
async fn until_stalled(config: &Config, client: &Client) {
    let table = config.lock_table().quoted();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let row = client
            .query_one(
                "SELECT count(*) FROM pg_stat_activity
                 WHERE wait_event = 'PgSleep' AND position($1 in query) > 0",
                &[&table],
            )
            .await
            .unwrap();
        if row.get::<_, i64>(0) > 0 {
            return;
        }
        assert!(Instant::now() < deadline, "the stalled grant never started");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// One attempt of `owner` at `name` through `statement`: the token, when granted.
async fn attempt(
    table: &LeaseTable,
    client: &Client,
    statement: Statement,
    owner: &str,
    name: &str,
) -> Option<i64> {
    let owner = table.owner(owner).unwrap();
    let request = AcquireRequest::new(name);
    let attempt = match statement {
        Statement::Acquire => owner.try_acquire(client, &request, LEASE).await,
        Statement::AcquireOrQueue => {
            let wait = Duration::from_secs(5);
            owner
                .try_acquire_or_queue(client, &request, LEASE, wait)
                .await
        }
        Statement::AcquireMany => {
            let grants = owner.try_acquire_many(client, &[request], LEASE).await;
            return grants.unwrap().get(name).map(|g| g.token);
        }
        Statement::AcquireAny => {
            let slots = [name.to_owned()];
            return match owner.try_acquire_any(client, &slots, LEASE).await.unwrap() {
                SlotAttempt::Granted { grant, .. } => Some(grant.token),
                SlotAttempt::Full | SlotAttempt::Busy => None,
            };
        }
    };
    match attempt.unwrap() {
        Attempt::Granted(grant) => Some(grant.token),
        Attempt::Held(_) | Attempt::Busy => None,
    }
}

/// `stalled` asks for `name` through `statement` and stalls after drawing its token; `other`
/// meanwhile takes the lease, writes nothing, and releases it (keeping the row with `keep`).
/// Returns each grant's token and when its caller learned of it, in that order.
async fn grants_around_a_stall(statement: Statement, keep: bool) -> Vec<(Instant, i64)> {
    let (config, admin) = super::setup().await;
    stall_inserts_of_stalled(&config, &admin).await;
    let table = LeaseTable::new(&config);
    let name = "n#0";
    let stalled = {
        let (config, table) = (config.clone(), table.clone());
        tokio::spawn(async move {
            let client = super::connect(&config).await;
            let token = attempt(&table, &client, statement, "stalled", name).await;
            let token = token.expect("the stalled owner was granted the lease");
            let granted = Instant::now();
            release(&table, &client, name, "stalled", token, keep).await;
            (granted, token)
        })
    };
    until_stalled(&config, &admin).await;
    let other = super::connect(&config).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut grants = Vec::new();
    while grants.is_empty() {
        assert!(Instant::now() < deadline, "`other` was never granted");
        if let Some(token) = attempt(&table, &other, Statement::Acquire, "other", name).await {
            grants.push((Instant::now(), token));
            release(&table, &other, name, "other", token, keep).await;
        } else {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    grants.push(stalled.await.unwrap());
    grants.sort();
    grants
}

async fn check(statement: Statement, keeps: &[bool]) {
    for &keep in keeps {
        let grants = grants_around_a_stall(statement, keep).await;
        let tokens: Vec<i64> = grants.iter().map(|(_, token)| *token).collect();
        assert!(
            tokens[0] < tokens[1],
            "{statement:?} (keep {keep}): the later grant has the smaller token: {tokens:?}"
        );
    }
}

#[tokio::test]
async fn a_stalled_acquire_is_never_granted_below_a_later_tenure() {
    check(Statement::Acquire, &[false, true]).await;
}

#[tokio::test]
async fn a_stalled_acquire_in_line_is_never_granted_below_a_later_tenure() {
    check(Statement::AcquireOrQueue, &[false, true]).await;
}

#[tokio::test]
async fn a_stalled_batch_acquire_is_never_granted_below_a_later_tenure() {
    check(Statement::AcquireMany, &[false, true]).await;
}

#[tokio::test]
async fn a_stalled_semaphore_acquire_is_never_granted_below_a_later_tenure() {
    check(Statement::AcquireAny, &[false]).await;
}
