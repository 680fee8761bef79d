//! Semaphores in memory: a permit is a slot's lease (`"{name}#{i}"`), as on PostgreSQL, and a
//! limited semaphore's limit is the backend's. Lowering a limit takes the slots at and above it
//! back as `force_loss` does. A permit waiter looks again after any release in the backend (no
//! order among permit waiters, as across processes on PostgreSQL).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use pgcoord::lease::{LimitChange, MAX_PERMITS, slot_names};
use pgcoord::{Error, ErrorKind, Result};

use super::leases::Attempt;
use super::{Shared, State};
use crate::leases::{Acquire, AcquirePermit, SetLimit};
use crate::losses::TenureWatch;

/// The stored limits.
#[derive(Default)]
pub(super) struct PermitState {
    limits: HashMap<String, u32>,
}

impl PermitState {
    /// The stored limit of semaphore `name`, if it has one.
    pub(super) fn limit(&self, name: &str) -> Option<u32> {
        self.limits.get(name).copied()
    }
}

/// A permit granted: its slot, token and loss signal.
pub(super) type Granted = (String, i64, TenureWatch);

/// One attempt at any free slot of `request`'s semaphore.
fn attempt(
    state: &mut State,
    request: &AcquirePermit,
    coordinator: u64,
    owner: &str,
    lease: std::time::Duration,
) -> Result<Option<Granted>> {
    let slots = match request.permits {
        Some(permits) => slot_names(&request.name, permits)?,
        None => match state.permits.limits.get(&request.name) {
            None => {
                return Err(Error::new(
                    ErrorKind::NotFound,
                    format!(
                        "semaphore {:?} has no stored limit; set one first",
                        request.name
                    ),
                ));
            }
            Some(0) => Vec::new(),
            Some(&limit) => slot_names(&request.name, limit)?,
        },
    };
    for slot in slots {
        if state.leases.is_held(&slot) {
            continue;
        }
        let mut acquire = Acquire::new(slot.clone());
        if request.permits.is_none() {
            acquire = acquire.keep_on_release();
        }
        if let Attempt::Granted(token, _, lost) =
            state
                .leases
                .attempt(&acquire, coordinator, owner, None, lease)?
        {
            return Ok(Some((slot, token, lost)));
        }
    }
    Ok(None)
}

/// Acquires a permit of `request` for `coordinator`, waiting as the request says.
pub(super) async fn acquire(
    shared: Arc<Shared>,
    coordinator: u64,
    owner: String,
    request: AcquirePermit,
) -> Result<Granted> {
    pgcoord::lease::check_name(&request.name)?;
    crate::leases::held::checked_lease(request.lease, shared.lease)?;
    let deadline = request.timeout.map(|t| Instant::now() + t);
    loop {
        // Registered before looking, so a release between the look and the wait still wakes it.
        let released = shared.released.notified();
        tokio::pin!(released);
        released.as_mut().enable();
        if let Some(granted) = attempt(
            &mut shared.lock(),
            &request,
            coordinator,
            &owner,
            shared.lease,
        )? {
            return Ok(granted);
        }
        match deadline {
            Some(deadline) => {
                if tokio::time::timeout_at(deadline.into(), released)
                    .await
                    .is_err()
                {
                    return Err(Error::not_acquired(&request.name, None));
                }
            }
            None => released.await,
        }
    }
}

/// Stores `request`'s limit; lowered, the slots at and above it are taken back.
pub(super) fn set_limit(shared: &Shared, request: &SetLimit) -> Result<LimitChange> {
    if request.permits > MAX_PERMITS {
        return Err(Error::new(
            ErrorKind::InvalidConfig,
            format!(
                "a limit is 0 to {MAX_PERMITS} permits, not {}",
                request.permits
            ),
        ));
    }
    slot_names(&request.name, request.permits.max(1))?;
    let mut state = shared.lock();
    let previous = (state.permits.limits).insert(request.name.clone(), request.permits);
    let mut revoked = 0;
    for i in request.permits..previous.unwrap_or(0) {
        if state.take_back(&format!("{}#{i}", request.name)) {
            revoked += 1;
        }
    }
    drop(state);
    shared.released.notify_waiters();
    Ok(pgcoord::__private::limit_change(previous, revoked))
}
