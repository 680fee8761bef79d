//! The core's answers, made by hand: what the runtime's in-memory backend returns where the
//! database would. The answers are `#[non_exhaustive]` (more may be told in later versions), so
//! nothing outside this crate builds them with a struct expression; these do. Not part of the
//! API (`__private`).

use std::time::{Duration, SystemTime};

use crate::error::Holder;
use crate::lease::{LeaseInfo, LimitChange};
use crate::topic::{Cursor, Event};

/// A lease's holder.
pub fn holder(owner: String, token: i64, remaining: Duration) -> Holder {
    Holder {
        owner,
        token,
        remaining,
    }
}

/// A lock as `LeaseTable::get` reports it.
pub fn lease_info(
    name: String,
    owner: Option<String>,
    token: Option<i64>,
    data: Option<Vec<u8>>,
    remaining: Option<Duration>,
) -> LeaseInfo {
    LeaseInfo {
        name,
        owner,
        token,
        data,
        remaining,
    }
}

/// A stored limit's change.
pub fn limit_change(previous: Option<u32>, revoked: u64) -> LimitChange {
    LimitChange { previous, revoked }
}

/// A topic's event.
pub fn event(cursor: Cursor, appended_at: SystemTime, body: Vec<u8>) -> Event {
    Event {
        cursor,
        appended_at,
        body,
    }
}
