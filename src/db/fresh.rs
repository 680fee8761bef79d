//! Trusting an idle connection. One left idle across a partition can be dead while its socket
//! still looks open: a black hole shows nothing until a statement waits for an answer that never
//! comes, and that statement would spend its caller's whole deadline although the database is
//! healthy. So a connection the server has not answered on for [`IDLE_CHECK_AFTER`] first
//! answers an empty query within a small share of the time left; one that does not is
//! discarded, and the caller's statement goes to another with most of its time still ahead.
//!
//! A connection in use pays nothing. One second, because a network that drops packets for less
//! leaves TCP connections working (retransmission covers the gap), and a check a second per
//! connection at most is cheap.

use std::time::{Duration, Instant};

use tracing::debug;

use crate::statement::{CachingClient, Session};

/// A connection the server has not answered on for this long is checked before it is trusted.
pub const IDLE_CHECK_AFTER: Duration = Duration::from_secs(1);

/// The check may take this share of the time left (a quarter), within the bounds below.
const CHECK_SHARE: u32 = 4;

/// The check's bound at least: a live backend on a busy machine answers within it.
const CHECK_AT_LEAST: Duration = Duration::from_millis(50);

/// The check's bound at most: a live backend that takes longer is no use to a caller either.
const CHECK_AT_MOST: Duration = Duration::from_secs(1);

/// Whether `client` can be trusted with a statement due by `deadline`: at once when the server
/// answered on it within [`IDLE_CHECK_AFTER`], otherwise when it answers an empty query within a
/// quarter of the time left (50 ms to 1 s, never past `deadline`). A connection that does not
/// answer is discarded (a pool closes it); nothing was sent on it but the empty query, so the
/// caller's statement can always go to another.
pub async fn answers(client: &CachingClient, deadline: Instant) -> bool {
    let now = Instant::now();
    if now.saturating_duration_since(client.answered_at()) < IDLE_CHECK_AFTER {
        return true;
    }
    let left = deadline.saturating_duration_since(now);
    let bound = (left / CHECK_SHARE)
        .clamp(CHECK_AT_LEAST, CHECK_AT_MOST)
        .min(left);
    match super::ping(client.client(), bound).await {
        Ok(()) => {
            client.answered_now();
            true
        }
        Err(e) => {
            debug!(error = %e, ?bound, "an idle connection did not answer its check; discarded");
            client.discard();
            false
        }
    }
}
