//! The lease statements a `LockManager` batches (see `crate::batch`): first acquire attempts,
//! releases, and notices to holders.

pub(crate) mod acquire;
pub(crate) mod notify;
pub(crate) mod release;
