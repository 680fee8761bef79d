//! [`Runtime`]: the whole runtime on a thread of its own, for services that are not actix
//! (axum, tonic: a plain `#[tokio::main]`).
//!
//! actix actors run on a single-threaded System; `Coordinator::connect` outside one answers
//! `Unsupported`.
//! Their addresses, though, are `Send`: a message sent from any thread or executor reaches the
//! actor, and its answer comes back to the sender's task. So the runtime starts an actix System
//! on a thread it owns and hands back the [`Coordinator`], whose methods and streams the
//! service's tokio tasks use as an actix service would (`coordinator.acquire(Acquire::new("job"))`).
//! A [`Lease`](crate::Lease) is `Send`: it may be held, fenced and released on any task.

use std::thread::JoinHandle;
use std::time::Duration;

use actix::prelude::*;
use pgcoord::{Config, Error, ErrorKind, Result};
use tokio::sync::oneshot;

use crate::Coordinator;
use crate::streams::Subscription;

/// The runtime on a thread of its own: an actix System running a [`Coordinator`]'s actors,
/// usable from any tokio runtime. Stop it with [`shutdown`](Self::shutdown), which releases
/// what the process holds; dropping it stops the thread without releasing (leases then expire).
#[derive(Debug)]
pub struct Runtime {
    coordinator: Coordinator,
    system: System,
    thread: Option<JoinHandle<()>>,
}

impl Runtime {
    /// Starts an actix System on a new thread and connects a [`Coordinator`] in it, as
    /// [`Coordinator::connect`] does: its errors (server unreachable, read-only, tables missing),
    /// and the thread ended at once. Callable from any async context.
    pub async fn connect(config: Config) -> Result<Runtime> {
        let (started, connected) = oneshot::channel();
        let thread = std::thread::Builder::new()
            .name("pgcoord-actix".into())
            .spawn(move || {
                let system = System::new();
                let result = system.block_on(Coordinator::connect(config));
                let failed = result.is_err();
                let _ = started.send(result.map(|coordinator| (coordinator, System::current())));
                if !failed {
                    // Until `System::stop`: shutdown, or the Runtime dropped.
                    let _ = system.run();
                }
            })
            .map_err(|e| Error::new(ErrorKind::Other, format!("cannot start a thread: {e}")))?;
        let (coordinator, system) = connected
            .await
            .map_err(|_| Error::new(ErrorKind::Other, "the runtime's thread ended at start"))??;
        Ok(Runtime {
            coordinator,
            system,
            thread: Some(thread),
        })
    }

    /// The coordinator: `Send + Sync + Clone`, for the service's tasks and handlers.
    pub fn coordinator(&self) -> &Coordinator {
        &self.coordinator
    }

    /// Every message published on `channel` from now on, and a [`Heard::Gap`](crate::Heard)
    /// wherever some may have been missed ([`Coordinator::subscribe`]).
    pub async fn subscribe(&self, channel: &str) -> Result<Subscription> {
        self.coordinator.subscribe(channel).await
    }

    /// Stops gracefully within `within`: [`Coordinator::shutdown`] (every lease and advisory
    /// lock released on the server, the listener stopped; the count of leases released), then
    /// the System and its thread.
    /// [`ErrorKind::Timeout`] when the release did not finish in time, or the thread did not
    /// end within `within` (an actor or a handler blocks it: it ends when that returns); the
    /// thread is told to stop all the same.
    pub async fn shutdown(mut self, within: Duration) -> Result<usize> {
        let deadline = tokio::time::Instant::now() + within;
        let released = self.coordinator.shutdown(within).await;
        self.system.stop();
        if let Some(thread) = self.thread.take() {
            // The join blocks, so off this task; and only as long as the caller gave.
            let joined = tokio::task::spawn_blocking(move || thread.join());
            if tokio::time::timeout_at(deadline, joined).await.is_err() {
                return Err(pgcoord::Error::new(
                    ErrorKind::Timeout,
                    format!(
                        "the runtime's thread did not end within {within:?}: something on it \
                         blocks; it ends when that returns"
                    ),
                ));
            }
        }
        released
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        // Without shutdown: stop the thread; held leases expire on the server.
        self.system.stop();
    }
}
