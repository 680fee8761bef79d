//! Handing a page of events to the handler: one at a time, in order, until one fails, the
//! lease is lost or the consumer stops; a panic is an error.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use pgcoord::topic::{Cursor, Event};
use tracing::warn;

use super::{Acker, ConsumeHandler, ConsumeResult, Delivery};
use super::{Run, stats};
use crate::leases::Lease;

/// How handing over a page ended.
pub(super) enum PageEnd {
    /// Every event was handled.
    Done,
    /// The handler failed: the event after `handled` comes again.
    Failed,
    /// The lease was lost before an event.
    Lost,
    /// The actor is stopping.
    Stopping,
}

/// What handing over a page did.
pub(super) struct Page {
    /// The last event handled, or the cursor before the page.
    pub(super) handled: Cursor,
    pub(super) end: PageEnd,
}

/// Hands `events` to the handler one at a time, in order, until one fails, the lease is lost
/// or the consumer stops.
pub(super) async fn deliver(
    run: &Run,
    lease: &Arc<Lease>,
    events: Vec<Event>,
    from: Cursor,
    errors: &mut u32,
) -> Page {
    let (topic, consumer): (Arc<str>, Arc<str>) = (
        run.consume.topic.as_str().into(),
        run.consume.consumer.as_str().into(),
    );
    let mut page = Page {
        handled: from,
        end: PageEnd::Done,
    };
    for event in events {
        // A handler that never waits would hold this thread for the whole page: the read
        // ahead, the ack and the runtime's other actors (the heartbeat) get a turn now and
        // then.
        tokio::task::consume_budget().await;
        if lease.loss().is_some() {
            page.end = PageEnd::Lost;
            return page;
        }
        if run.stop_requested.load(Ordering::Relaxed) {
            page.end = PageEnd::Stopping;
            return page;
        }
        let at = event.cursor;
        if let Ok(lag) = event.appended_at.elapsed() {
            run.metrics.lag.record(lag.as_secs_f64());
        }
        let delivery = Delivery {
            event,
            topic: topic.clone(),
            consumer: consumer.clone(),
            acker: Acker::Table(run.table.clone()),
            lease: lease.clone(),
        };
        let again = {
            let mut through = run.handed_through.lock().expect("cursor lock");
            let again = at <= *through;
            *through = (*through).max(at);
            again
        };
        if again {
            run.metrics.redelivered.increment(1);
        }
        stats(run, |s| {
            s.delivered += 1;
            s.redelivered += u64::from(again);
        });
        match handle(&run.consume.handler, delivery).await {
            Ok(()) => {
                run.metrics.handled.increment(1);
                page.handled = at;
                *errors = 0;
            }
            Err(why) => {
                run.metrics.failed.increment(1);
                *errors += 1;
                stats(run, |s| s.handler_errors += 1);
                if errors.is_power_of_two() {
                    warn!(cursor = %at, error = %why, errors = *errors, "the handler failed; handing the event over again");
                }
                page.end = PageEnd::Failed;
                return page;
            }
        }
    }
    page
}

/// Runs the handler, catching a panic: it is an error (the event comes again), not the end of
/// the consumer.
pub(crate) async fn handle(handler: &ConsumeHandler, delivery: Delivery) -> ConsumeResult {
    use futures_util::FutureExt;
    let handled = std::panic::AssertUnwindSafe(handler(delivery));
    match handled.catch_unwind().await {
        Ok(result) => result,
        Err(_) => Err("the handler panicked".to_owned()),
    }
}
