//! pgcoord's fault suite (a dev-only crate, never published): the pieces that let a test break
//! things for real and then check that mutual exclusion held.
//!
//! Layout:
//! - [`history`] — the lock-set workload's record and its checker: every critical section
//!   writes a guarded resource row through `Lease::fence` and records its interval, token and
//!   write number; [`history::History::check`] reports overlapping accepted intervals, tokens
//!   that go back in commit order, and acknowledged writes that are missing.
//! - [`linear`] — the same workload as operations (acquire, fenced write, read, release), each
//!   recorded at its invocation and its completion (an unknown outcome left in flight), and
//!   checked for linearizability against a sequential fenced lock guarding a register with
//!   a search with a memory of dead ends (`stateright`'s tester the reference).
//! - [`losses`] — invariant I9 under faults: each holder's tenures, how their releases ended and
//!   what their handles and subscribers were told, added up by the scenarios.
//! - [`topic_history`] — the durable-topic workload's record (appends and how they ended,
//!   deliveries in order) and its checker: out of order, lost, phantom, late.
//! - [`process`] — [`process::HolderProcess`]: a real holder process (the `holder` binary in
//!   `src/bin/holder.rs`) that a test can pause (SIGSTOP), resume and kill, and whose reports
//!   (held, acknowledged writes, rejections, losses) it reads line by line; the `consumer`
//!   and `graceful` programs beside it, and [`program`], what the programs share.
//!
//! The network and server faults live with the throwaway cluster in `pgcoord_testkit`
//! (pause, freeze a backend, restart, stop and start) so that both crates' tests share them.
//! The scenarios are in `tests/scenarios/`; the long torture run is documented in
//! docs/RELIABILITY.md.
#![deny(missing_docs)]

pub mod history;
pub mod linear;
pub mod losses;
pub mod process;
pub mod program;
pub mod topic_history;
