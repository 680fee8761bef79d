//! Handing a page of events to the handler: one at a time, in order, until one fails, the
//! lease is lost or the consumer stops; a panic is an error.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::SystemTime;

use pgcoord::__private::Failures;
use pgcoord::topic::{Cursor, Event};
use tracing::warn;

use super::delivery::DeliveryContext;
use super::{ConsumeHandler, ConsumeResult, Delivery};
use super::{Run, stats};

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
/// or the consumer stops. The stats and the redelivery mark are read and written once a page,
/// not once an event.
pub(super) async fn deliver(
    run: &Run,
    tenure: &Arc<DeliveryContext>,
    events: Vec<Event>,
    from: Cursor,
    errors: &mut Failures,
) -> Page {
    let mut page = Page {
        handled: from,
        end: PageEnd::Done,
    };
    // Events at or before the furthest this process handed over come again.
    let handed_through = *run.handed_through.lock().expect("cursor lock");
    let (mut delivered, mut redelivered, mut failed) = (0u64, 0u64, 0u64);
    let mut furthest = handed_through;
    for event in events {
        // A handler that never waits would hold this thread for the whole page: the read
        // ahead, the ack and the runtime's other actors (the heartbeat) get a turn now and
        // then.
        tokio::task::consume_budget().await;
        if tenure.lease.loss().is_some() {
            page.end = PageEnd::Lost;
            break;
        }
        if run.stop_requested.load(Ordering::Relaxed) {
            page.end = PageEnd::Stopping;
            break;
        }
        let at = event.cursor;
        // The clock at each handover: a slow handler's later events waited longer.
        if let Ok(lag) = SystemTime::now().duration_since(event.appended_at) {
            run.metrics.lag.record(lag.as_secs_f64());
        }
        let again = at <= handed_through;
        furthest = furthest.max(at);
        delivered += 1;
        if again {
            redelivered += 1;
            run.metrics.redelivered.increment(1);
        }
        let delivery = Delivery {
            event,
            tenure: tenure.clone(),
        };
        match handle(&run.consume.handler, delivery).await {
            Ok(()) => {
                run.metrics.handled.increment(1);
                page.handled = at;
                errors.succeeded();
            }
            Err(why) => {
                run.metrics.failed.increment(1);
                failed += 1;
                if errors.failed() {
                    warn!(cursor = %at, error = %why, errors = errors.in_a_row(), "the handler failed; handing the event over again");
                }
                page.end = PageEnd::Failed;
                break;
            }
        }
    }
    {
        let mut through = run.handed_through.lock().expect("cursor lock");
        *through = (*through).max(furthest);
    }
    stats(run, |s| {
        s.delivered += delivered;
        s.redelivered += redelivered;
        s.handler_errors += failed;
    });
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
