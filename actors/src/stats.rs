//! [`GetStats`]: one message that asks any pgcoord actor for its counters.

use std::marker::PhantomData;

use actix::Message;

/// Ask an actor for its counters: [`ManagerStats`](crate::ManagerStats) from a `LockManager`,
/// [`ListenerStats`](crate::ListenerStats) from a `ListenerActor`, [`ConsumerStats`](crate::ConsumerStats) from a
/// consumer actor (through [`TopicConsumer::stats`](crate::TopicConsumer::stats)),
/// [`ScheduleStats`](crate::ScheduleStats) from a `ScheduleRunner`,
/// [`AdvisoryStats`](crate::AdvisoryStats) from `AdvisoryLocks`,
/// [`Assignment`](crate::Assignment) from a `WorkerPool`. The actor decides the type, so the
/// caller does not name it:
///
/// ```no_run
/// # async fn example(coordinator: pgcoord_actors::Coordinator) -> Result<(), Box<dyn std::error::Error>> {
/// use pgcoord_actors::GetStats;
///
/// let leases = coordinator.locks()?.send(GetStats::new()).await?;
/// let listener = coordinator.signals()?.send(GetStats::new()).await?;
/// println!("{} leases held, {} messages delivered", leases.held, listener.delivered);
/// # Ok(()) }
/// ```
pub struct GetStats<S>(PhantomData<fn() -> S>);

impl<S> GetStats<S> {
    /// The request; the actor it is sent to decides `S`.
    pub fn new() -> GetStats<S> {
        GetStats(PhantomData)
    }
}

impl<S> Default for GetStats<S> {
    fn default() -> GetStats<S> {
        GetStats::new()
    }
}

impl<S> std::fmt::Debug for GetStats<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("GetStats")
    }
}

impl<S: 'static> Message for GetStats<S> {
    type Result = S;
}
