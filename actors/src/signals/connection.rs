//! The listening connection's life: connecting, LISTENing on every channel before announcing
//! it, confirming channels to the callers that wait for them, pings, and failing over to a new
//! connection (the supervisor restarts the actor; its state survives).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use actix::prelude::*;
use futures_util::stream::poll_fn;
use pgcoord::ident::Ident;
use tokio::sync::oneshot;
use tokio_postgres::Client;
use tracing::{debug, info, warn};

use super::ListenerActor;
use super::messages::ConnState;

impl ListenerActor {
    pub(super) fn open(&mut self, ctx: &mut Context<Self>) {
        let config = self.config.clone();
        let connect = async move { pgcoord::__private::connect_as(&config, "listener").await };
        ctx.spawn(
            connect
                .into_actor(self)
                .map(|result, act, ctx| match result {
                    Ok((client, mut connection)) => {
                        act.stats.connections += 1;
                        act.count(|m| m.connections.increment(1));
                        ctx.add_stream(poll_fn(move |cx| connection.poll_message(cx)));
                        act.client = Some(Arc::new(client));
                        act.listen_all(ctx);
                    }
                    Err(e) => act.fail(
                        ctx,
                        ConnState::Disconnected {
                            error: e.to_string(),
                        },
                    ),
                }),
        );
    }

    /// LISTENs on every channel in one batch, then announces the connection.
    fn listen_all(&mut self, ctx: &mut Context<Self>) {
        let Some(client) = self.client.clone() else {
            return;
        };
        // The channels registered now; one registered while this batch is on its way is
        // LISTENed on its own once the batch is confirmed.
        let listed: Vec<String> = self.channels.keys().cloned().collect();
        let batch: String = std::iter::once(self.reply_channel.quoted())
            .chain(
                listed
                    .iter()
                    .map(|c| Ident::channel(c).expect("validated on entry").quoted()),
            )
            .map(|c| format!("LISTEN {c};"))
            .collect();
        let bound = self.config.statement_timeout();
        let listen = async move { listen_on(&client, &batch, bound).await };
        ctx.spawn(
            listen
                .into_actor(self)
                .map(move |result, act, ctx| match result {
                    Ok(()) => {
                        act.ready = true;
                        let state = if act.ever_connected {
                            ConnState::Reconnected
                        } else {
                            ConnState::Connected
                        };
                        act.ever_connected = true;
                        info!(channels = act.channels.len(), ?state, "listener ready");
                        act.broadcast(state);
                        for waiter in act.ready_waiters.drain(..) {
                            let _ = waiter.send(());
                        }
                        for channel in &listed {
                            act.confirmed(channel);
                        }
                        let late: Vec<String> = act.confirm_waiters.keys().cloned().collect();
                        for channel in late {
                            act.listen_channel(Ident::channel(&channel).expect("validated"), ctx);
                        }
                        // At once: a connection that delivers nothing (a pooler) is found now.
                        act.ping(ctx);
                    }
                    Err(error) => act.fail(ctx, ConnState::Disconnected { error }),
                }),
        );
    }

    /// Pings the connection (it answers: alive), then probes it: a NOTIFY on its reply channel
    /// sent from a pooled connection, which must be heard back (it delivers what other sessions
    /// send). Each within the ping timeout, a timeout that restarts while other notifications
    /// are being read (busy, not dead). A probe that cannot be sent proves nothing either way.
    ///
    /// Why from another session: a session hears its own NOTIFY at the end of the statement,
    /// even through a transaction-mode pooler, which drops only what arrives between
    /// transactions — everything others send.
    pub(super) fn ping(&mut self, ctx: &mut Context<Self>) {
        let pending = self.pending.lock().expect("pending").len();
        self.count(|m| m.pending.set(pending as f64));
        let (Some(client), true) = (self.client.clone(), self.ready) else {
            return;
        };
        // Unguessable, and answered only by itself: see `dispatch`.
        let probe = pgcoord::signal::new_id();
        let (back, heard_back) = oneshot::channel();
        self.probes.insert(probe, back);
        let channel = self.reply_channel.clone();
        let (pool, timeout) = (self.pool.clone(), self.config.ping_timeout());
        let heard = self.heard.clone();
        let ping = async move {
            ping_or_hear(&client, timeout, &heard).await?;
            let text = format!("{PROBE}{probe}");
            let sent = pgcoord::signal::notify(&pool.statements(None), &channel, &text).await;
            if let Err(e) = sent {
                debug!(error = %e, "cannot send the listener's probe; not judged");
                return Ok(true);
            }
            let back = while_hearing(heard_back, timeout, &heard).await;
            pgcoord::Result::Ok(back.is_some_and(|back| back.is_ok()))
        };
        let ping = ping.into_actor(self).map(move |result, act, _| {
            // Heard or not, this probe is over.
            act.probes.remove(&probe);
            result
        });
        ctx.spawn(
            ping.map(|result: pgcoord::Result<bool>, act, ctx| match result {
                Err(e) if e.is_timeout() => act.fail(ctx, ConnState::Stalled),
                // The socket broke under the ping (no SQLSTATE): the connection's own stream
                // is about to end with the server's words ("terminating connection …"), which
                // tell an operator more. It reports first when it can (and this timer goes with
                // the restart); otherwise this does, a ping timeout later.
                Err(e) if e.code().is_none() => {
                    let error = e.to_string();
                    let grace = act.config.ping_timeout();
                    ctx.run_later(grace, move |act, ctx| {
                        act.fail(ctx, ConnState::Disconnected { error })
                    });
                }
                Err(e) => act.fail(
                    ctx,
                    ConnState::Disconnected {
                        error: e.to_string(),
                    },
                ),
                Ok(false) => act.fail(ctx, ConnState::Deaf),
                // Heard back: an outage, if there was one, is over.
                Ok(true) => act.failures.succeeded(),
            }),
        );
    }

    /// Reports `state` and stops, so the supervisor restarts the actor on a new connection.
    /// During an outage only the first failure is broadcast and warned about, then every power
    /// of two: a listener retrying every half second must not flood its subscribers or the log.
    /// An outage ends when a probe is heard back, so connections that come up deaf, one after
    /// another, are one outage.
    pub(super) fn fail(&mut self, ctx: &mut Context<Self>, state: ConnState) {
        if ctx.state() != ActorState::Running {
            return;
        }
        if self.failures.failed() {
            warn!(
                ?state,
                failures = self.failures.in_a_row(),
                "listener connection lost; reconnecting"
            );
        }
        if self.failures.in_a_row() == 1 {
            self.broadcast(state);
        }
        ctx.stop();
    }

    pub(crate) fn broadcast(&mut self, state: ConnState) {
        match state {
            ConnState::Connected | ConnState::Reconnected => self.count(|m| m.connected.set(1.0)),
            ConnState::Disconnected { .. } | ConnState::Stalled | ConnState::Deaf => {
                self.count(|m| m.connected.set(0.0))
            }
            ConnState::MessageLost { .. } => {}
        }
        if !matches!(state, ConnState::MessageLost { .. }) {
            self.conn_state = Some(state.clone());
        }
        // Rare and important ("Reconnected" means resync): never dropped for a full mailbox.
        self.conn_subscribers.retain(|s| {
            s.do_send(state.clone());
            s.connected()
        });
    }

    /// Makes sure `channel` is listened on: at once on the current connection, or by the next
    /// connection's LISTENs when there is none (the channel is registered already). The
    /// receiver resolves once a LISTEN on `channel` is confirmed; it fails only when the
    /// listener stopped for good.
    pub(crate) fn confirm(
        &mut self,
        channel: Ident,
        ctx: &mut Context<Self>,
    ) -> oneshot::Receiver<()> {
        let (tx, rx) = oneshot::channel();
        self.confirm_waiters
            .entry(channel.as_str().to_owned())
            .or_default()
            .push(tx);
        if self.ready {
            self.listen_channel(channel, ctx);
        }
        rx
    }

    /// LISTENs on `channel` on the current connection, then answers its waiters.
    fn listen_channel(&mut self, channel: Ident, ctx: &mut Context<Self>) {
        let Some(client) = self.client.clone() else {
            return;
        };
        let bound = self.config.statement_timeout();
        let listen = async move {
            listen_on(&client, &format!("LISTEN {};", channel.quoted()), bound)
                .await
                .map(|()| channel)
        };
        ctx.spawn(
            listen
                .into_actor(self)
                .map(|result, act, ctx| match result {
                    Ok(channel) => act.confirmed(channel.as_str()),
                    // The connection failed: the next one LISTENs on every registered channel and
                    // answers the waiters then.
                    Err(error) => act.fail(ctx, ConnState::Disconnected { error }),
                }),
        );
    }

    /// Answers everyone waiting for `channel` to be listened on.
    fn confirmed(&mut self, channel: &str) {
        for waiter in self.confirm_waiters.remove(channel).into_iter().flatten() {
            let _ = waiter.send(());
        }
    }

    /// Waits until the reply channel is listened on (every LISTEN of the current connection
    /// confirmed); requests must not go out before.
    pub(crate) fn replies_ready(&mut self) -> impl Future<Output = ()> + 'static {
        let (tx, ready) = oneshot::channel();
        if self.ready {
            let _ = tx.send(());
        } else {
            self.ready_waiters.push(tx);
        }
        async move {
            let _ = ready.await;
        }
    }
}

/// What a probe's payload starts with, before its number.
const PROBE: &str = "pgcoord-probe ";

/// The number of a probe's payload; `None` for anything else.
pub(super) fn probe_number(payload: &str) -> Option<u64> {
    payload.strip_prefix(PROBE)?.parse().ok()
}

/// Pings the session; an answer that takes longer than `timeout` is a stall only when nothing
/// was heard on the connection meanwhile. A connection busy delivering a burst answers
/// after the notifications queued before it, and reading them proves it alive: replacing it
/// would throw them away.
async fn ping_or_hear(
    client: &Client,
    timeout: Duration,
    heard: &AtomicU64,
) -> pgcoord::Result<()> {
    match while_hearing(client.simple_query(""), timeout, heard).await {
        Some(answer) => answer.map(drop).map_err(pgcoord::Error::from),
        None => Err(pgcoord::Error::new(
            pgcoord::ErrorKind::Timeout,
            format!(
                "the listening session heard nothing and did not answer a ping within {timeout:?}"
            ),
        )),
    }
}

/// `answer`, once it comes within `timeout` of the last message read (a connection still
/// reading the notifications queued before it is given the time to); `None` after a whole
/// `timeout` in which nothing was read.
async fn while_hearing<T>(
    answer: impl Future<Output = T>,
    timeout: Duration,
    heard: &AtomicU64,
) -> Option<T> {
    tokio::pin!(answer);
    let mut seen = heard.load(Ordering::Relaxed);
    loop {
        if let Ok(answer) = tokio::time::timeout(timeout, &mut answer).await {
            return Some(answer);
        }
        let now = heard.load(Ordering::Relaxed);
        if now == seen {
            return None;
        }
        seen = now;
    }
}

/// Runs LISTEN statements on the listening session, bounded: a session that does not confirm
/// them in time is replaced like one that fails (pings only start once it is ready).
async fn listen_on(
    client: &Client,
    batch: &str,
    bound: Duration,
) -> std::result::Result<(), String> {
    match tokio::time::timeout(bound, client.batch_execute(batch)).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!("LISTEN not confirmed within {bound:?}")),
    }
}
