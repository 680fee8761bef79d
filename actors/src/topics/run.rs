//! The consumer's loop: take the lease, open the cursor, read, hand over, ack; wait for the
//! doorbell; start over when the lease is lost.

use std::sync::Arc;
use std::time::{Duration, Instant};

use pgcoord::__private::Failures;
use pgcoord::topic::{Batch, Cursor};
use pgcoord::{ErrorKind, Result};
use tracing::{Instrument, debug, info_span, warn};

use super::behind::{HELD_BACK_LOOK, Lag, look_for_held_back, note_lag};
use super::delivery::DeliveryContext;
use super::handover::{PageEnd, deliver};
use super::{Run, stats};
use crate::Call;
use crate::leases::{Acquire, Lease};
use crate::signals::doorbell::Reader;

/// How the loop ended a tenure.
enum Ended {
    /// The lease was lost: wait for it again.
    Lost,
    /// The actor is stopping.
    Stopping,
    /// For good: the cursor is behind retention.
    Failed(pgcoord::Error),
}

/// Runs the consumer until its actor stops or it fails for good.
pub(super) async fn run(run: Arc<Run>) {
    let span =
        info_span!("topic_consumer", topic = %run.consume.topic, consumer = %run.consume.consumer);
    async move {
        let mut failures = Failures::default();
        loop {
            // Waits in line for the lease as long as it takes: a second instance waits here.
            let acquire = run.locks.call(Acquire::new(run.lease_name.clone()));
            let lease = tokio::select! {
                lease = acquire => lease,
                () = run.stopping.notified() => return,
            };
            let lease = match lease {
                Ok(lease) => Arc::new(lease),
                Err(e) => {
                    // Another consumer of the name in this process holds it: wait quietly.
                    if e.kind() == ErrorKind::AlreadyHeld {
                        debug!("the consumer's lease is held by this process; waiting");
                    } else {
                        warn_every(&mut failures, &e, "cannot take the consumer's lease");
                    }
                    if pause(&run, run.consume.poll).await {
                        return;
                    }
                    continue;
                }
            };
            failures.succeeded();
            stats(&run, |s| {
                s.tenures += 1;
                s.active = true;
            });
            let ended = tenure(&run, &lease).await;
            stats(&run, |s| s.active = false);
            match ended {
                // Released by a graceful stop of the process (`Coordinator::shutdown`).
                Ended::Lost if lease.loss() == Some(crate::LossReason::Shutdown) => {
                    debug!("the consumer's lease ended with the shutdown; the consumer stops");
                    return;
                }
                Ended::Lost => continue,
                Ended::Stopping => {
                    release(lease).await;
                    return;
                }
                Ended::Failed(e) => {
                    warn!(error = %e, "the consumer stops");
                    stats(&run, |s| s.failed = Some(e.to_string()));
                    release(lease).await;
                    return;
                }
            }
            // The lease (its last clone) is dropped here: released unless lost.
        }
    }
    .instrument(span)
    .await
}

/// Releases the consumer's lease before the run ends, so that a stop answers with it free and
/// the next instance takes over at once. A delivery a handler kept holds it on: released when
/// the last is dropped.
async fn release(lease: Arc<Lease>) {
    if let Ok(lease) = Arc::try_unwrap(lease)
        && let Err(e) = lease.release().await
    {
        // Lost meanwhile, or the database is away: the lease expires.
        debug!(error = %e, "the consumer's lease was not released");
    }
}

/// One tenure: deliver from the stored cursor while the lease is held.
async fn tenure(run: &Run, lease: &Arc<Lease>) -> Ended {
    let (topic, consumer) = (&run.consume.topic, &run.consume.consumer);
    // A statement's bound starts when it is made: one per statement, never one per tenure (a
    // tenure outlives the statement timeout).
    let mut failures = Failures::default();
    let mut cursor = loop {
        match run
            .table
            .open_consumer(
                &run.pool.idempotent(None),
                topic,
                consumer,
                run.consume.start,
            )
            .await
        {
            Ok(cursor) => break cursor,
            Err(e) => {
                warn_every(&mut failures, &e, "cannot open the consumer's cursor");
                if pause(run, backoff(&failures, run.consume.poll)).await {
                    return Ended::Stopping;
                }
            }
        }
        if lease.loss().is_some() {
            return Ended::Lost;
        }
    };
    // `cursor`: handled through; `acked`: stored through (as far as this tenure knows). What
    // was handled is acked however the tenure ends, so a stopped consumer's successor starts
    // after it.
    let mut acked = cursor;
    let ended = read_on(run, lease, &mut cursor, &mut acked).await;
    ack(run, acked, cursor).await;
    // Another instance, if any, tells the lag from now on.
    run.metrics.lag_events.set(0.0);
    ended
}

/// What a tenure's reading carries from one page to the next.
struct Reading {
    tenure: Arc<DeliveryContext>,
    /// Failed reads, and failed deliveries, in a row.
    failures: Failures,
    errors: Failures,
    /// The next page, read while the last one was handled.
    prefetched: Option<Result<Batch>>,
    lag: Lag,
    /// When the held-back transaction was last looked for, and last warned of.
    last_look: Instant,
    warned: Option<Instant>,
    /// The doorbell's side of the loop: a ring's read that found nothing puts off the next.
    reader: Reader,
}

/// Reads and hands over pages from `cursor` on until the lease is lost, the consumer stops or
/// fails for good.
async fn read_on(run: &Run, lease: &Arc<Lease>, cursor: &mut Cursor, acked: &mut Cursor) -> Ended {
    let (topic, consumer) = (&run.consume.topic, &run.consume.consumer);
    let lost = lease.lost();
    tokio::pin!(lost);
    let mut reading = Reading {
        tenure: Arc::new(DeliveryContext {
            topic: topic.clone(),
            consumer: consumer.clone(),
            acker: run.table.clone(),
            lease: lease.clone(),
        }),
        failures: Failures::default(),
        errors: Failures::default(),
        prefetched: None,
        lag: Lag::new(),
        last_look: Instant::now(),
        warned: None,
        reader: Reader::default(),
    };
    loop {
        let batch = match reading.prefetched.take() {
            Some(batch) => batch,
            None => tokio::select! {
                batch = read(run, *cursor) => batch,
                _ = &mut lost => return Ended::Lost,
                () = run.stopping.notified() => return Ended::Stopping,
            },
        };
        let batch = match batch {
            Ok(batch) => {
                reading.failures.succeeded();
                reading.reader.read(!batch.events.is_empty());
                batch
            }
            Err(e) if e.kind() == ErrorKind::Compacted => return Ended::Failed(e),
            Err(e) => {
                reading.reader.read(false);
                warn_every(&mut reading.failures, &e, "cannot read the topic");
                if pause(run, backoff(&reading.failures, run.consume.poll)).await {
                    return Ended::Stopping;
                }
                continue;
            }
        };
        note_lag(run, *cursor, batch.events.len(), &mut reading.lag).await;
        if batch.events.is_empty() {
            ack(run, *acked, *cursor).await;
            *acked = *cursor;
            look_now_and_then(run, &mut reading).await;
            tokio::select! {
                // Now, or at the end of the doorbell's gap: anyone can NOTIFY.
                () = reading.reader.rung(&run.doorbell) => {}
                () = tokio::time::sleep(run.consume.poll) => {}
                _ = &mut lost => return Ended::Lost,
                () = run.stopping.notified() => return Ended::Stopping,
            }
            continue;
        }
        if let Some(ended) = hand_over(run, &mut reading, batch, cursor, acked).await {
            return ended;
        }
    }
}

/// One page of the topic after `cursor`, counted.
async fn read(run: &Run, cursor: Cursor) -> Result<Batch> {
    stats(run, |s| s.reads += 1);
    let statements = run.pool.idempotent(None);
    (run.table)
        .read(&statements, &run.consume.topic, cursor, run.consume.window)
        .await
}

/// Looks for the transaction holding readers back every ten polls, at most every 10 s.
async fn look_now_and_then(run: &Run, reading: &mut Reading) {
    if reading.last_look.elapsed() >= (run.consume.poll * 10).min(HELD_BACK_LOOK) {
        reading.last_look = Instant::now();
        look_for_held_back(run, &mut reading.warned).await;
    }
}

/// Hands `batch` over from `cursor`, reading the next page meanwhile when it is full. `None`:
/// read on.
async fn hand_over(
    run: &Run,
    reading: &mut Reading,
    batch: Batch,
    cursor: &mut Cursor,
    acked: &mut Cursor,
) -> Option<Ended> {
    // A full page means more may follow: the next page is read while this one is handled,
    // and the last page's ack is written meanwhile (two more statements in flight, at most
    // two windows in memory). A page that ends early discards the next one unused.
    let read_on = batch.events.len() == run.consume.window as usize;
    let last = batch.events.last().map_or(*cursor, |e| e.cursor);
    let next = async {
        match read_on {
            true => Some(read(run, last).await),
            false => None,
        }
    };
    // The statements first, so they are on their way before the handler runs.
    let (next, (), page) = tokio::join!(
        biased;
        next,
        ack(run, *acked, *cursor),
        deliver(run, &reading.tenure, batch.events, *cursor, &mut reading.errors),
    );
    *acked = (*cursor).max(*acked);
    *cursor = page.handled;
    match page.end {
        PageEnd::Done => reading.prefetched = next,
        PageEnd::Lost => return Some(Ended::Lost),
        PageEnd::Stopping => return Some(Ended::Stopping),
        PageEnd::Failed => {
            if pause(run, backoff(&reading.errors, run.consume.poll)).await {
                return Some(Ended::Stopping);
            }
            // Read on from what the database holds: a handler that acked in its own
            // transaction and then failed has its event behind the cursor already.
            let (topic, consumer) = (&run.consume.topic, &run.consume.consumer);
            let statements = run.pool.idempotent(None);
            if let Ok(stored) = run.table.cursor(&statements, topic, consumer).await {
                *cursor = (*cursor).max(stored);
            }
        }
    }
    None
}

/// Acks through `cursor` when it moved past `from`. A failed ack is only logged: the events
/// since the stored cursor are delivered again (at least once), never skipped.
async fn ack(run: &Run, from: Cursor, cursor: Cursor) {
    if cursor <= from {
        return;
    }
    let (topic, consumer) = (&run.consume.topic, &run.consume.consumer);
    let statements = run.pool.idempotent(None);
    match run.table.ack(&statements, topic, consumer, cursor).await {
        Ok(true) => {
            run.metrics.acks.increment(1);
            stats(run, |s| s.acks += 1);
        }
        Ok(false) => {}
        Err(e) => {
            warn!(error = %e, %cursor, "cannot ack; the events since the last ack come again")
        }
    }
}

/// Sleeps `how_long` unless the consumer stops first (true then).
async fn pause(run: &Run, how_long: Duration) -> bool {
    tokio::select! {
        () = tokio::time::sleep(how_long) => false,
        () = run.stopping.notified() => true,
    }
}

/// The project's jittered backoff after `failures`, at most the poll.
pub(crate) fn backoff(failures: &Failures, poll: Duration) -> Duration {
    failures.delay(pgcoord::db::Backoff::DEFAULT, 0).min(poll)
}

/// Counts a failure, warned of at the rate every repeated failure is.
fn warn_every(failures: &mut Failures, error: &pgcoord::Error, what: &str) {
    if failures.failed() {
        warn!(error = %error, failures = failures.in_a_row(), "{what}; trying again");
    }
}
