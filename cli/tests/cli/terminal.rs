//! The command in a real terminal (tmux), as a person runs it: what the screen shows, and what
//! Ctrl-C does (the terminal sends SIGINT to the whole foreground group, not to one process).

use pgcoord_testkit::require_program;

use super::*;

/// A tmux session, killed when dropped (a failed assertion too).
struct Terminal(String);

impl Terminal {
    /// Runs `shell` (a `sh -c` line) in a new detached 120×30 terminal.
    fn run(shell: &str) -> Terminal {
        let name = unique_name("pgcoord-cli");
        let started = Command::new("tmux")
            .args([
                "new-session",
                "-d",
                "-s",
                &name,
                "-x",
                "120",
                "-y",
                "30",
                shell,
            ])
            .output()
            .expect("tmux (Debian: apt-get install tmux)");
        assert!(started.status.success(), "{started:?}");
        Terminal(name)
    }

    /// What the screen shows now.
    fn screen(&self) -> String {
        let shown = Command::new("tmux")
            .args(["capture-pane", "-p", "-t", &self.0])
            .output()
            .unwrap();
        stdout(&shown)
    }

    /// Waits (at most 15 s) until the screen shows `text`.
    fn wait_for(&self, text: &str) -> String {
        let deadline = std::time::Instant::now() + Duration::from_secs(15);
        loop {
            let screen = self.screen();
            if screen.contains(text) {
                return screen;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "never shown: {text}\n{screen}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn ctrl_c(&self) {
        let sent = Command::new("tmux")
            .args(["send-keys", "-t", &self.0, "C-c"])
            .output()
            .unwrap();
        assert!(sent.status.success(), "{sent:?}");
    }
}

impl Drop for Terminal {
    fn drop(&mut self) {
        let _ = Command::new("tmux")
            .args(["kill-session", "-t", &self.0])
            .output();
    }
}

/// `pgcoord` with the test's tables and DSN and `args`, then its exit code, as a shell line.
fn shell_line(table: &str, args: &[&str]) -> String {
    let quote = |s: &str| format!("'{}'", s.replace('\'', r"'\''"));
    // The shell traps SIGINT (a trap, not an ignore: the command gets the default back) so that
    // it outlives the command's Ctrl-C and shows its code.
    let mut line = format!(
        "trap true INT; DATABASE_URL={} {} --lock-table {} --payload-table {} --topic-table {} --schedule-table {}",
        quote(&dsn()),
        quote(env!("CARGO_BIN_EXE_pgcoord")),
        quote(table),
        quote(&format!("{table}_p")),
        quote(&format!("{table}_t")),
        quote(&format!("{table}_s")),
    );
    for arg in args {
        line.push(' ');
        line.push_str(&quote(arg));
    }
    // The shell stays to show the code after the command ended.
    line + "; echo \"exited $?\"; sleep 60"
}

#[test]
fn in_a_terminal_listen_shows_each_message_and_ctrl_c_ends_it() {
    if require_program("tmux", "tmux").is_none() {
        return;
    }
    let table = unique_name("cli");
    assert!(pgcoord(&table, &["migrate"]).status.success());
    let channel = unique_name("screen");
    let terminal = Terminal::run(&shell_line(&table, &["listen", &channel]));
    // Notified until the listener has subscribed and shows it: the first may come too early.
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    while !terminal.screen().contains(r#""n":1"#) {
        assert!(
            std::time::Instant::now() < deadline,
            "{}",
            terminal.screen()
        );
        let sent = pgcoord(&table, &["notify", &channel, r#"{"n": 1}"#]);
        assert!(sent.status.success(), "{sent:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
    // One line per message, as it comes (not held in a buffer while a terminal watches).
    let sent = pgcoord(&table, &["notify", &channel, r#"{"n": 2}"#]);
    assert!(sent.status.success(), "{sent:?}");
    terminal.wait_for(r#""n":2"#);
    terminal.ctrl_c();
    terminal.wait_for("exited 130");
}

#[test]
fn in_a_terminal_ctrl_c_stops_lock_runs_command_and_frees_the_lease_at_once() {
    if require_program("tmux", "tmux").is_none() {
        return;
    }
    let table = unique_name("cli");
    assert!(pgcoord(&table, &["migrate"]).status.success());
    // A lease of a minute: only its release, not its expiry, frees it within the test.
    let terminal = Terminal::run(&shell_line(
        &table,
        &[
            "lock",
            "run",
            "nightly",
            "--lease",
            "60s",
            "--",
            "sh",
            "-c",
            "echo running; sleep 60",
        ],
    ));
    terminal.wait_for("running");
    wait_until_held(&table, "nightly");
    terminal.ctrl_c();
    // pgcoord gets the terminal's SIGINT and passes it to the command's group (its own): the
    // command ends, the lease is released, pgcoord exits as the command did (128 + SIGINT).
    terminal.wait_for("exited 130");
    let shown = pgcoord(&table, &["lock", "show", "nightly"]);
    assert!(!shown.status.success(), "still held: {}", stdout(&shown));
}
