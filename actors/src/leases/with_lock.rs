//! [`with_lock`]: run work while holding a lease, cancelled when the lease is lost.

use actix::Addr;
use pgcoord::{Error, ErrorKind, Result};

use super::LockManager;
use super::lease::Lease;
use super::messages::Acquire;

/// Acquires `request`, runs `work` with the lease, and releases it when the work returns. If the
/// lease is lost first, the work is dropped (cancelled at its next `.await`) and the result is
/// [`ErrorKind::LockLost`]. Dropping the returned future cancels the work and releases the
/// lease. Work must not keep making externally visible changes it cannot fence: use
/// [`Lease::fence`] in its transactions, as in `async |lease| lease.fence(&tx).await`.
pub async fn with_lock<T, F>(manager: &Addr<LockManager>, request: Acquire, work: F) -> Result<T>
where
    F: AsyncFnOnce(&Lease) -> T,
{
    let lease = manager
        .send(request)
        .await
        .map_err(|e| Error::new(ErrorKind::Unavailable, format!("lock manager stopped: {e}")))??;
    let lost = lease.lost();
    let outcome = tokio::select! {
        output = work(&lease) => Ok(output),
        Some(reason) = lost => Err(Error::new(
            ErrorKind::LockLost,
            format!("lease {:?} was lost ({reason:?}); its work was cancelled", lease.name()),
        )),
    };
    match outcome {
        Ok(output) => {
            lease.release().await?;
            Ok(output)
        }
        // The manager forgot the lost lease; dropping the handle sends a release it refuses.
        Err(e) => Err(e),
    }
}
