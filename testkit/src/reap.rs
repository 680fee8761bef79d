//! Reaping throwaway clusters whose owning process died without cleaning up.

use std::fs;

/// Stops and deletes clusters whose owning process is gone (killed before it could clean up,
/// as a test binary killed by SIGKILL is). Best effort: anything unexpected is left alone.
pub(super) fn reap_orphans(prefix: &str, owner_file: &str) {
    let Ok(entries) = fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for dir in entries.flatten().map(|e| e.path()) {
        let is_ours = dir
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with(prefix));
        let Some(owner) = is_ours
            .then(|| fs::read_to_string(dir.join(owner_file)).ok())
            .flatten()
            .and_then(|pid| pid.trim().parse::<i32>().ok())
        else {
            continue;
        };
        if process_alive(owner) {
            continue;
        }
        let postmaster = fs::read_to_string(dir.join("data/postmaster.pid"))
            .ok()
            .and_then(|f| f.lines().next()?.trim().parse::<i32>().ok());
        if let Some(pid) = postmaster.filter(|&pid| process_alive(pid)) {
            // SAFETY: signalling a pid read from the orphaned cluster's own postmaster.pid.
            unsafe { libc::kill(pid, libc::SIGQUIT) };
        }
        let _ = fs::remove_dir_all(&dir);
    }
}

fn process_alive(pid: i32) -> bool {
    // SAFETY: signal 0 only checks that the process exists.
    pid > 0 && unsafe { libc::kill(pid, 0) } == 0
}
