//! Clusters shared by everything in a process — a plain one and one with TLS — started on
//! first use and stopped when the process exits, for test binaries.

use std::sync::{Mutex, OnceLock};

use super::TempPostgres;
use pgcoord::error::{Error, ErrorKind, Result};

impl TempPostgres {
    /// The cluster shared by everything in this process, started on first use and stopped when
    /// the process exits normally (including after a test panicked).
    pub fn shared() -> Result<&'static TempPostgres> {
        static SHARED: OnceLock<std::result::Result<TempPostgres, String>> = OnceLock::new();
        shared_in(&SHARED, TempPostgres::start)
    }

    /// As [`shared`](Self::shared), a cluster with TLS on ([`start_tls`](Self::start_tls)).
    pub fn shared_tls() -> Result<&'static TempPostgres> {
        static SHARED: OnceLock<std::result::Result<TempPostgres, String>> = OnceLock::new();
        shared_in(&SHARED, TempPostgres::start_tls)
    }
}

/// The cluster in `cell`, started by `start` on first use and stopped when the process exits.
fn shared_in(
    cell: &'static OnceLock<std::result::Result<TempPostgres, String>>,
    start: fn() -> Result<TempPostgres>,
) -> Result<&'static TempPostgres> {
    static STARTED: Mutex<Vec<&'static TempPostgres>> = Mutex::new(Vec::new());
    extern "C" fn stop_shared() {
        if let Ok(started) = STARTED.lock() {
            started.iter().for_each(|server| server.shutdown());
        }
    }
    let server = cell.get_or_init(|| {
        let server = start().map_err(|e| e.to_string())?;
        Ok(server)
    });
    if let Ok(server) = server {
        let mut started = STARTED.lock().expect("shared clusters");
        if !started.iter().any(|s| std::ptr::eq(*s, server)) {
            if started.is_empty() {
                // SAFETY: registering a plain `extern "C" fn` with no captured state.
                unsafe { libc::atexit(stop_shared) };
            }
            started.push(server);
        }
    }
    server
        .as_ref()
        .map_err(|e| Error::new(ErrorKind::Unavailable, e.clone()))
}
