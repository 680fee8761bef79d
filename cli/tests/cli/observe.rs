//! `elect observe`: who leads an election, and each change of leader, until interrupted.

use std::io::{BufRead, BufReader};
use std::sync::mpsc;

use super::*;

/// A running `pgcoord elect observe`, its lines read on a thread of their own.
struct Observer {
    child: std::process::Child,
    lines: mpsc::Receiver<String>,
}

impl Observer {
    fn start(table: &str, args: &[&str]) -> Observer {
        let mut child = pgcoord_command(table, args).spawn().unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Observer { child, lines }
    }

    /// The next line, waited for 10 s at most.
    fn next(&self) -> serde_json::Value {
        let line = (self.lines.recv_timeout(Duration::from_secs(10)))
            .unwrap_or_else(|e| panic!("no line from the observer: {e}"));
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{line:?}: {e}"))
    }
}

impl Drop for Observer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn elect_observe_prints_each_change_of_leader_until_interrupted() {
    let table = unique_name("cli");
    assert!(pgcoord(&table, &["migrate"]).status.success());
    let mut observer = Observer::start(&table, &["--json", "elect", "observe", "primary"]);
    // First who leads now: nobody.
    let first = observer.next();
    assert_eq!(first["election"], "primary", "{first}");
    assert_eq!(first["leader"], serde_json::Value::Null, "{first}");
    assert_eq!(first["resync"], true, "{first}");

    // A term, then its end when its command exits, then the next term.
    let mut terms = Vec::new();
    for value in ["host-a:5432", "host-b:5432"] {
        let args = ["elect", "primary", "--value", value, "--", "sleep", "1"];
        let leader = pgcoord(&table, &args);
        assert!(leader.status.success(), "{leader:?}");
        let elected = observer.next();
        assert_eq!(elected["leader"]["value"], value, "{elected}");
        assert!(elected["leader"]["owner"].is_string(), "{elected}");
        terms.push(elected["leader"]["token"].as_i64().unwrap());
        let ended = observer.next();
        assert_eq!(ended["leader"], serde_json::Value::Null, "{ended}");
    }
    assert!(terms[1] > terms[0], "{terms:?}");

    // Interrupted (Ctrl-C): it ends at once, with success, having printed nothing else.
    // SAFETY: kill(2) on our own child's pid, which stays reserved until we wait for it.
    let sent = unsafe { libc::kill(observer.child.id() as libc::pid_t, libc::SIGINT) };
    assert_eq!(sent, 0);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = observer.child.try_wait().unwrap() {
            break status;
        }
        assert!(std::time::Instant::now() < deadline, "still running");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "{status}");
    assert!(observer.lines.try_recv().is_err(), "a line no change made");
}

#[test]
fn elect_observe_speaks_text_and_stops_after_count_lines() {
    let table = unique_name("cli");
    assert!(pgcoord(&table, &["migrate"]).status.success());
    let script = "sleep 30";
    let args = [
        "elect", "jobs", "--value", "worker-7", "--", "sh", "-c", script,
    ];
    let mut leader = pgcoord_command(&table, &args).spawn().unwrap();
    wait_until_held(&table, "jobs");
    let out = pgcoord(&table, &["elect", "observe", "jobs", "--count", "1"]);
    let _ = leader.kill();
    let _ = leader.wait();
    assert!(out.status.success(), "{out:?}");
    let text = stdout(&out);
    let line = text
        .strip_suffix('\n')
        .unwrap_or_else(|| panic!("{text:?}"));
    assert!(!line.contains('\n'), "one line: {text:?}");
    assert!(line.contains(" leads (term "), "{text}");
    assert!(line.ends_with("): worker-7"), "{text}");
    // A bad name: a usage error, before any connection.
    let bad = pgcoord(&table, &["elect", "observe", ""]);
    assert_eq!(bad.status.code(), Some(2), "{bad:?}");
}
