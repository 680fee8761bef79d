//! The lease statements a `LockManager` batches (see `crate::batch`): first acquire attempts and
//! releases.

pub(crate) mod acquire;
pub(crate) mod release;
