//! Handing one key's mail to its worker, off the pool's actor: the events of one read, one at a
//! time and in order, then one ack through the last one handled (see `mail`).

use std::rc::Rc;
use std::sync::Arc;

use actix::prelude::*;
use pgcoord::topic::{Cursor, Event, Start, TopicTable};
use tracing::{debug, warn};

use futures_util::future::LocalBoxFuture;

use super::Mail;
use crate::metrics::MailMetrics;
use crate::topics::{Delivery, DeliveryContext};

/// Hands one [`Mail`] to a worker: made where the worker's `Handler<Mail>` is known.
pub(super) type SendMail<W> =
    Rc<dyn Fn(&Addr<W>, Mail) -> LocalBoxFuture<'static, std::result::Result<(), String>>>;

/// How one key's delivery ended.
pub(super) enum Delivered {
    /// Every event handed over was handled (and acked): read on.
    Done,
    /// The worker answered `Err`, or stopped: the event comes again after a pause.
    Failed,
    /// Another process stored the key's cursor first: read again from it.
    Moved,
}

/// What one key's delivery needs, off the actor.
pub(super) struct Handing<W: Actor> {
    pub(super) table: Arc<TopicTable>,
    pub(super) db: pgcoord::Pool,
    pub(super) send: SendMail<W>,
    pub(super) worker: Addr<W>,
    pub(super) tenure: Arc<DeliveryContext>,
    pub(super) key: String,
    pub(super) metrics: MailMetrics,
    /// Where this read began, when this process has not made sure of the key's cursor row yet.
    pub(super) open: Option<Cursor>,
}

/// Hands `events` over, one at a time, and acks through the last one handled; also whether the
/// key's cursor row is known to exist.
pub(super) async fn hand_over<W: Actor>(
    handing: Handing<W>,
    events: Vec<Event>,
) -> (Delivered, bool) {
    let Handing {
        table,
        db,
        send,
        worker,
        tenure,
        key,
        metrics,
        open,
    } = handing;
    let (topic, pool) = (&tenure.topic, &tenure.consumer);
    if let Some(from) = open {
        // The cursor row first, where this read began: an ack moves only a row.
        let at = (table.open_consumer(&db.idempotent(None), topic, pool, Start::After(from))).await;
        match at {
            Ok(at) if at == from => {}
            Ok(_) => return (Delivered::Moved, true),
            Err(e) => {
                debug!(error = %e, "opening a key's mail cursor");
                return (Delivered::Failed, false);
            }
        }
    }
    let mut handled = None;
    let mut ended = Delivered::Done;
    for event in events {
        if tenure.lease.loss().is_some() {
            break;
        }
        let cursor = event.cursor;
        if let Ok(lag) = std::time::SystemTime::now().duration_since(event.appended_at) {
            metrics.lag.record(lag.as_secs_f64());
        }
        let delivery = Delivery {
            event,
            tenure: tenure.clone(),
        };
        let mail = Mail {
            key: key.clone(),
            delivery,
        };
        match send(&worker, mail).await {
            Ok(()) => {
                metrics.handled.increment(1);
                handled = Some(cursor);
            }
            Err(why) => {
                metrics.failed.increment(1);
                debug!(worker.key = %key, %cursor, error = %why, "mail not handled; it comes again");
                ended = Delivered::Failed;
                break;
            }
        }
    }
    if let Some(cursor) = handled {
        // A failed ack only means the handled mail comes again.
        let acked = table.ack(&db.idempotent(None), topic, pool, cursor).await;
        if let Err(e) = acked {
            warn!(worker.key = %key, error = %e, "cannot ack the key's mail; it comes again");
        }
    }
    (ended, true)
}
