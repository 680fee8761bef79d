//! Integration tests of the actix runtime against a real PostgreSQL: the shared throwaway
//! cluster, or `DATABASE_URL` when it is set.

mod advisory;
mod leases;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix::prelude::*;
use pgcoord::embedded::{test_pg_config, unique_name};
use pgcoord::{Config, ConfigBuilder};
use pgcoord_actors::{LockLost, LockManager, SubscribeLockLost};
use tokio_postgres::Client;

/// Names shared by the managers of one test: its own lock table and channel.
#[derive(Clone)]
pub struct Setup {
    pub pg: tokio_postgres::Config,
    pub table: String,
    pub lease: Duration,
    pub heartbeat: Duration,
}

impl Setup {
    /// A fresh, migrated lock table with this lease and heartbeat, and an inspecting client.
    pub async fn new(lease: Duration, heartbeat: Duration) -> (Setup, Client) {
        let setup = Setup {
            pg: test_pg_config().expect("test database"),
            table: unique_name("locks"),
            lease,
            heartbeat,
        };
        let config = setup.builder("admin").build().unwrap();
        let client = pgcoord::db::connect_spawned(&config).await.unwrap();
        pgcoord::schema::migrate(&client, &config).await.unwrap();
        (setup, client)
    }

    pub fn builder(&self, owner: &str) -> ConfigBuilder {
        Config::builder()
            .pg_config(&self.pg)
            .lock_table(&self.table)
            .payload_table(format!("{}_p", self.table))
            .owner(owner)
            .lease(self.lease)
            .heartbeat(self.heartbeat)
    }

    /// A started manager whose owner identity is `owner`.
    pub fn manager(&self, owner: &str) -> Addr<LockManager> {
        LockManager::new(self.builder(owner).build().unwrap()).start()
    }

    pub fn quoted_table(&self) -> String {
        format!("\"{}\"", self.table)
    }
}

/// Collects the `LockLost` broadcasts it receives.
#[derive(Default, Clone)]
pub struct Collector(pub Arc<Mutex<Vec<LockLost>>>);

impl Actor for Collector {
    type Context = Context<Self>;
}

impl Handler<LockLost> for Collector {
    type Result = ();
    fn handle(&mut self, lost: LockLost, _: &mut Context<Self>) {
        self.0.lock().unwrap().push(lost);
    }
}

impl Collector {
    /// A started collector subscribed to `manager`.
    pub async fn subscribe(manager: &Addr<LockManager>) -> Collector {
        let collector = Collector::default();
        let addr = collector.clone().start();
        manager
            .send(SubscribeLockLost(addr.recipient()))
            .await
            .unwrap();
        collector
    }

    pub fn received(&self) -> Vec<LockLost> {
        self.0.lock().unwrap().clone()
    }
}
