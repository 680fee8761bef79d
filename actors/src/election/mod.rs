//! [`Election`]: leader election on leases, with terms ordered by fencing tokens.
//!
//! The leader is the holder of the lease named after the election; a candidate campaigns by
//! waiting for that lease ([`Election::campaign`]) and then proclaims its value, stored as the
//! lease's data and announced on the election channel in the same transaction
//! (`pgcoord::election`). A [`Leadership`] is the term: its token, its value, [`Leadership::lost`],
//! [`Leadership::proclaim`] (a new value without a new election) and [`Leadership::resign`], which
//! releases the lease so the next candidate — woken by the release's announcement — takes over
//! within one handoff. [`Election::leader`] asks who leads now; [`Election::observe`] starts a
//! `LeaderObserver` that tells a recipient of every change (see `observe`).

use std::time::Duration;

use actix::prelude::*;
use pgcoord::lease::check_name;
use pgcoord::{Config, ErrorKind, Result};
use tracing::warn;

use crate::Call;
use crate::leases::{Acquire, Get, Lease, LockManager};
use crate::losses::LossReason;
use crate::signals::ListenerActor;

mod observe;
mod proclaim;
mod resign;

pub use observe::LeaderChanged;
use observe::LeaderObserver;
use proclaim::Proclaim;
pub use resign::RequestResign;
pub(crate) use resign::ResignRequested;

/// One election: a name, and the actors that run it. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Election {
    name: String,
    locks: Addr<LockManager>,
    signals: Addr<ListenerActor>,
    config: Config,
    /// Where observers start: the coordinator's thread, or else the caller's.
    arbiter: Option<ArbiterHandle>,
    /// This process's candidacy's priority (see [`Election::priority`]).
    priority: i32,
    /// A term's lease, when not the manager's (see [`Election::lease`]).
    lease: Option<Duration>,
}

/// Who leads an election.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Leader {
    /// The leader's owner identity.
    pub owner: String,
    /// Its term's fencing token: a later term's is greater.
    pub token: i64,
    /// What it proclaims.
    pub value: Vec<u8>,
}

impl Election {
    /// The election `name` among the processes whose `LockManager`s share `config`'s lock table;
    /// `signals` hears the announcements (the process's listener). [`ErrorKind::InvalidName`] for
    /// a name a lease could not have.
    pub fn new(
        config: &Config,
        name: impl Into<String>,
        locks: Addr<LockManager>,
        signals: Addr<ListenerActor>,
    ) -> Result<Election> {
        let name = name.into();
        check_name(&name)?;
        Ok(Election {
            name,
            locks,
            signals,
            config: config.clone(),
            arbiter: None,
            priority: 0,
            lease: None,
        })
    }

    /// Campaigns with `priority` (default 0): of the candidates waiting when a term ends, the
    /// one with the highest priority is elected next, then the others in the order they came —
    /// a preferred holder (Kubernetes' coordinated election) is the candidate with the higher
    /// priority. It does not unseat a leader: ask one to step down with
    /// [`request_resign`](Self::request_resign) when the preferred candidate is waiting.
    pub fn priority(mut self, priority: i32) -> Election {
        self.priority = priority;
        self
    }

    /// Holds each term for `lease` at a time instead of the manager's lease, as
    /// [`Acquire::lease`] does: at least the manager's. A longer term's lease rides out longer
    /// pauses of its leader; the next leader is elected that much later when the leader dies.
    pub fn lease(mut self, lease: Duration) -> Election {
        self.lease = Some(lease);
        self
    }

    /// Observers of this election start on `arbiter`.
    pub(crate) fn on(self, arbiter: ArbiterHandle) -> Election {
        Election {
            arbiter: Some(arbiter),
            ..self
        }
    }

    /// The election's name (its lease's name).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Waits until elected, then proclaims `value`: the term is yours until you resign or lose
    /// it. With `timeout`, [`ErrorKind::NotAcquired`] (naming the leader) when it passes first.
    /// Dropping the returned future withdraws the candidacy.
    pub async fn campaign(
        &self,
        value: impl Into<Vec<u8>>,
        timeout: Option<Duration>,
    ) -> Result<Leadership> {
        let value = value.into();
        // A term's end is announced even when no candidate waits: observers do not line up.
        let mut acquire = Acquire::new(self.name.as_str())
            .data(value.clone())
            .replace_data()
            .announce_always()
            .priority(self.priority);
        if let Some(timeout) = timeout {
            acquire = acquire.timeout(timeout);
        }
        if let Some(lease) = self.lease {
            acquire = acquire.lease(lease);
        }
        let lease = self.locks.call(acquire).await?;
        let leadership = Leadership {
            lease,
            value,
            locks: self.locks.clone(),
            // Heartbeats off (renewed by hand): as often as a heartbeat would be.
            look_every: self.config.heartbeat().unwrap_or(self.config.lease() / 4),
        };
        // The value is stored already (the grant's data); this announces it.
        match leadership.send_proclamation(leadership.value.clone()).await {
            Err(e) if e.is_lock_lost() => Err(e),
            Err(e) => {
                warn!(election.name = %self.name, error = %e, "elected, but the announcement failed; observers learn at their next poll");
                Ok(leadership)
            }
            Ok(()) => Ok(leadership),
        }
    }

    /// Asks the leader to step down (River's `RequestResign`; `pgcoord resign NAME`): a request
    /// for the term leading now, which its leader finds within a heartbeat
    /// ([`Leadership::resign_requested`]) and honours by resigning once its work is wound down.
    /// The term asked (its token), `None` when no one leads. Not a release: the term lasts until
    /// its leader resigns (or loses it), so two leaders' work never overlaps.
    pub async fn request_resign(&self) -> Result<Option<i64>> {
        self.locks
            .call(RequestResign {
                name: self.name.clone(),
            })
            .await
    }

    /// Who leads now, as far as the database says; `None` between terms.
    pub async fn leader(&self) -> Result<Option<Leader>> {
        let term = term_of(&self.locks, &self.name).await?;
        Ok(term.map(|(leader, _)| leader))
    }

    /// Tells `recipient` of each change of leader as read from the table (a term shorter than a
    /// read may go unseen), until the recipient is gone: an observer runs on the coordinator's
    /// thread for an election from [`Coordinator::election`](crate::Coordinator::election), else
    /// in the current actix System.
    pub fn observe(&self, recipient: Recipient<LeaderChanged>) {
        let observer = LeaderObserver::new(self, recipient);
        match &self.arbiter {
            Some(arbiter) => {
                Actor::start_in_arbiter(arbiter, |_| observer);
            }
            None => {
                observer.start();
            }
        }
    }

    /// Each change of leader, as [`observe`](Self::observe) tells it, as a stream: the first
    /// item the leader now (`resync` set). Dropping it stops the observer.
    pub fn changes(
        &self,
    ) -> impl futures_util::Stream<Item = LeaderChanged> + Send + Unpin + use<> {
        let arbiter = self.arbiter.clone().unwrap_or_else(Arbiter::current);
        let (forwarder, feed) = crate::streams::forward(&arbiter, None);
        self.observe(forwarder.recipient());
        feed
    }
}

/// The leader of `name` and the time left on its lease, by the server's clock.
pub(crate) async fn term_of(
    locks: &Addr<LockManager>,
    name: &str,
) -> Result<Option<(Leader, Duration)>> {
    match locks.call(Get(name.to_owned())).await {
        Ok(info) if info.is_held() => Ok(Some((
            Leader {
                owner: info.owner.unwrap_or_default(),
                token: info.token.unwrap_or_default(),
                value: info.data.unwrap_or_default(),
            },
            info.remaining.unwrap_or_default(),
        ))),
        Ok(_) => Ok(None),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// A term as leader: a held lease and the value proclaimed with it. Dropping it resigns (in the
/// background).
#[must_use = "dropping a Leadership resigns at once"]
pub struct Leadership {
    lease: Lease,
    value: Vec<u8>,
    locks: Addr<LockManager>,
    /// How often [`resign_requested`](Self::resign_requested) looks: the heartbeat.
    look_every: Duration,
}

impl Leadership {
    /// The term's fencing token: pass it along with the leader's writes, or fence them with
    /// [`Leadership::lease`]'s guard.
    pub fn token(&self) -> i64 {
        self.lease.token()
    }

    /// What this leader proclaims now.
    pub fn value(&self) -> &[u8] {
        &self.value
    }

    /// The lease behind the term (its fencing guard, its name).
    pub fn lease(&self) -> &Lease {
        &self.lease
    }

    /// Resolves when the term ends: `Some(reason)` when it is lost, `None` after a
    /// [`resign`](Self::resign) (no loss). Pending while it lasts.
    pub fn lost(&self) -> impl Future<Output = Option<LossReason>> + Send + 'static {
        self.lease.lost()
    }

    /// Resolves `true` once someone asked this term to step down ([`Election::request_resign`],
    /// `pgcoord resign`), `false` when the term ended first. It looks every heartbeat (one small
    /// statement), so a request is seen within a heartbeat. Select on it beside the leader's work;
    /// wind the work down, then [`resign`](Self::resign):
    ///
    /// ```ignore
    /// tokio::select! {
    ///     _ = lead(&leadership) => {}
    ///     true = leadership.resign_requested() => {} // stop the work first
    /// }
    /// leadership.resign().await?;
    /// ```
    pub fn resign_requested(&self) -> impl Future<Output = bool> + Send + 'static {
        let (locks, every, ended) = (self.locks.clone(), self.look_every, self.lease.lost());
        let asked = ResignRequested {
            name: self.lease.name().to_owned(),
            token: self.token(),
        };
        async move {
            tokio::pin!(ended);
            let mut failures = pgcoord::__private::Failures::default();
            loop {
                tokio::select! {
                    _ = &mut ended => return false,
                    () = tokio::time::sleep(every) => {}
                }
                match locks.call(asked.clone()).await {
                    Ok(true) => return true,
                    Ok(false) => failures.succeeded(),
                    Err(e) => {
                        if failures.failed() {
                            let failures = failures.in_a_row();
                            warn!(election.name = %asked.name, error = %e, failures, "cannot look for a resign request; looking again");
                        }
                    }
                }
            }
        }
    }

    /// A new value for this term, stored and announced at once, without a new election.
    /// [`ErrorKind::LockLost`] when the term has ended.
    pub async fn proclaim(&mut self, value: impl Into<Vec<u8>>) -> Result<()> {
        let value = value.into();
        self.send_proclamation(value.clone()).await?;
        self.value = value;
        Ok(())
    }

    /// Stores and announces `value` for this term (see `Proclaim`).
    async fn send_proclamation(&self, value: Vec<u8>) -> Result<()> {
        let proclaim = Proclaim {
            name: self.lease.name().to_owned(),
            token: self.token(),
            value,
        };
        self.locks.call(proclaim).await
    }

    /// Ends the term: the next candidate, woken by the release, takes over within one handoff.
    /// [`ErrorKind::LockLost`] when the term had already been lost.
    pub async fn resign(self) -> Result<()> {
        self.lease.release().await
    }
}

impl std::fmt::Debug for Leadership {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Leadership")
            .field("election", &self.lease.name())
            .field("token", &self.token())
            .finish()
    }
}
