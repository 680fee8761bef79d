//! pgcoord through its tokio door alone. The tests (`tests/door.rs`) use every capability from
//! a plain tokio runtime, and this crate does not depend on actix: what they use is what a
//! service under `#[tokio::main]` can use.
