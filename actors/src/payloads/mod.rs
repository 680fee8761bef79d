//! [`PayloadStoreActor`]: the owner of the process's payload store — the large payloads that do
//! not fit in a notification. Publishers put through it, the listener fetches through it, and
//! it deletes expired rows on a timer.
//!
//! Each put and fetch runs on a task of its own (a message is answered when its statement is),
//! so the mailbox never waits for a query. Fetches wait in line (first come, first served) for
//! one of a bounded number of places — half the pool by default — so a burst of large messages
//! cannot take every connection from the process's leases and publishes, nor start an
//! unbounded number of queries; a waiting fetch holds only its key. Puts are not bounded here:
//! each comes from a caller who waits for it.
//!
//! [`PayloadStoreActor::store`] makes its address a [`PayloadStore`], which is what the
//! listener (or anything else taking a store) is handed.

use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use pgcoord::BoxFuture;
use pgcoord::payload::{PayloadStore, PayloadTable};
use pgcoord::{Error, ErrorKind, Result};
use tokio::sync::Semaphore;
use tracing::{debug, warn};

/// Owns a payload store; see the module docs. A `Coordinator` starts one over the payload table.
pub struct PayloadStoreActor {
    store: Arc<dyn PayloadStore>,
    fetches: Arc<Semaphore>,
    expiry: Option<(PayloadTable, Duration)>,
}

impl PayloadStoreActor {
    /// An actor over `store`, running at most `fetches_at_once` fetches at a time (at least 1).
    pub fn new(store: Arc<dyn PayloadStore>, fetches_at_once: usize) -> PayloadStoreActor {
        PayloadStoreActor {
            store,
            fetches: Arc::new(Semaphore::new(fetches_at_once.max(1))),
            expiry: None,
        }
    }

    /// Over the payload table: fetches bounded to half of `config`'s pool, expired rows deleted
    /// every tenth of the time-to-live (at least every second).
    pub fn for_table(table: PayloadTable, config: &pgcoord::Config) -> PayloadStoreActor {
        let every = (config.payload_ttl() / 10).max(Duration::from_secs(1));
        PayloadStoreActor::new(Arc::new(table.clone()), config.pool_size() as usize / 2)
            .expiring(table, every)
    }

    /// Deletes `table`'s expired rows every `every`.
    pub fn expiring(self, table: PayloadTable, every: Duration) -> PayloadStoreActor {
        PayloadStoreActor {
            expiry: Some((table, every)),
            ..self
        }
    }
}

impl Actor for PayloadStoreActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        let Some((table, every)) = self.expiry.clone() else {
            return;
        };
        ctx.run_interval(every, move |_, _| {
            let table = table.clone();
            tokio::spawn(async move {
                match table.delete_expired().await {
                    Ok(n) => debug!(deleted = n, "expired payloads deleted"),
                    Err(e) => warn!(error = %e, "cannot delete expired payloads"),
                }
            });
        });
    }
}

/// Stores a payload; answers its key.
#[derive(Debug, Clone, Message)]
#[rtype(result = "Result<String>")]
pub struct Put(pub Vec<u8>);

/// Fetches the payload stored under a key; [`ErrorKind::NotFound`] when it expired or never was.
#[derive(Debug, Clone, Message)]
#[rtype(result = "Result<Vec<u8>>")]
pub struct Fetch(pub String);

/// Fetches the payloads stored under several keys, in one place of the bound (one statement
/// for the payload table): each key's payload or error, in order.
#[derive(Debug, Clone, Message)]
#[rtype(result = "Vec<Result<Vec<u8>>>")]
pub(crate) struct FetchMany(pub(crate) Vec<String>);

impl Handler<Put> for PayloadStoreActor {
    type Result = ResponseFuture<Result<String>>;

    fn handle(&mut self, Put(payload): Put, _: &mut Context<Self>) -> Self::Result {
        let store = self.store.clone();
        Box::pin(async move { store.put(payload).await })
    }
}

impl Handler<Fetch> for PayloadStoreActor {
    type Result = ResponseFuture<Result<Vec<u8>>>;

    fn handle(&mut self, Fetch(key): Fetch, _: &mut Context<Self>) -> Self::Result {
        let (store, fetches) = (self.store.clone(), self.fetches.clone());
        Box::pin(async move {
            // The semaphore is never closed.
            let _place = fetches.acquire().await;
            store.get(&key).await
        })
    }
}

impl Handler<FetchMany> for PayloadStoreActor {
    type Result = ResponseFuture<Vec<Result<Vec<u8>>>>;

    fn handle(&mut self, FetchMany(keys): FetchMany, _: &mut Context<Self>) -> Self::Result {
        let (store, fetches) = (self.store.clone(), self.fetches.clone());
        Box::pin(async move {
            let _place = fetches.acquire().await;
            store.get_many(&keys).await
        })
    }
}

impl Handler<crate::RunNow> for PayloadStoreActor {
    type Result = ResponseFuture<Result<u64>>;

    fn handle(&mut self, _: crate::RunNow, _: &mut Context<Self>) -> Self::Result {
        let table = self.expiry.as_ref().map(|(table, _)| table.clone());
        Box::pin(async move {
            match table {
                Some(table) => table.delete_expired().await,
                None => Err(Error::new(
                    ErrorKind::InvalidConfig,
                    "this payload store has no table to expire",
                )),
            }
        })
    }
}

impl Handler<crate::losses::Shutdown> for PayloadStoreActor {
    type Result = ();

    fn handle(&mut self, _: crate::losses::Shutdown, ctx: &mut Context<Self>) {
        ctx.stop();
    }
}

/// Puts and fetches through the actor: what the listener and publishers are handed.
struct Through(Addr<PayloadStoreActor>);

impl PayloadStore for Through {
    fn put(&self, payload: Vec<u8>) -> BoxFuture<'_, Result<String>> {
        Box::pin(crate::Call::call(&self.0, Put(payload)))
    }

    fn get<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Vec<u8>>> {
        Box::pin(crate::Call::call(&self.0, Fetch(key.to_owned())))
    }

    fn get_many<'a>(&'a self, keys: &'a [String]) -> BoxFuture<'a, Vec<Result<Vec<u8>>>> {
        Box::pin(async move {
            match self.0.send(FetchMany(keys.to_vec())).await {
                Ok(found) => found,
                Err(_) => (keys.iter())
                    .map(|_| {
                        Err(Error::new(
                            ErrorKind::Unavailable,
                            "the payload store stopped",
                        ))
                    })
                    .collect(),
            }
        })
    }
}

impl PayloadStoreActor {
    /// The store as the listener takes it: every put and fetch a message to `actor`.
    pub fn store(actor: Addr<PayloadStoreActor>) -> Arc<dyn PayloadStore> {
        Arc::new(Through(actor))
    }
}
