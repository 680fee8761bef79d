//! `lock run` and `elect`: a command run while the lease or leadership is held.

use super::*;

#[test]
fn lock_run_holds_the_lease_while_its_command_runs_and_exits_with_its_code() {
    let table = unique_name("cli");
    assert!(pgcoord(&table, &["migrate"]).status.success());
    let script =
        r#"echo "$PGCOORD_LEASE_NAME $PGCOORD_LEASE_TOKEN $PGCOORD_LEASE_OWNER"; sleep 1; exit 7"#;
    let first = pgcoord_command(&table, &["lock", "run", "job", "--", "sh", "-c", script])
        .spawn()
        .unwrap();
    wait_until_held(&table, "job");
    // While the first holds it, a second run that waits 200 ms gives up, its command not run.
    let args = [
        "--timeout",
        "200ms",
        "lock",
        "run",
        "job",
        "--",
        "echo",
        "ran",
    ];
    let second = pgcoord(&table, &args);
    assert_eq!(second.status.code(), Some(6), "{second:?}");
    assert!(!stdout(&second).contains("ran"), "{second:?}");
    assert!(
        String::from_utf8_lossy(&second.stderr).contains("held"),
        "{second:?}"
    );
    // The first's command saw its lease, and its exit code is pgcoord's.
    let first = first.wait_with_output().unwrap();
    assert_eq!(first.status.code(), Some(7), "{first:?}");
    let seen = stdout(&first);
    let [name, token, owner]: [&str; 3] = (seen.split_whitespace().collect::<Vec<_>>())
        .try_into()
        .unwrap_or_else(|_| panic!("{seen}"));
    assert_eq!(name, "job");
    assert!(token.parse::<i64>().unwrap() > 0, "{seen}");
    // Each run its own identity (host, pid, random): two runs never share one.
    assert!(
        owner.len() > "pgcoord-cli".len() && owner != "pgcoord-cli",
        "{seen}"
    );
    // Released at once when the command exited, not left to expire.
    let show = pgcoord(&table, &["lock", "show", "job"]);
    assert_eq!(show.status.code(), Some(3), "{show:?}");
    let third = pgcoord(
        &table,
        &["--timeout", "1s", "lock", "run", "job", "--", "true"],
    );
    assert_eq!(third.status.code(), Some(0), "{third:?}");
    // No command: a usage error.
    let none = pgcoord(&table, &["lock", "run", "job"]);
    assert_eq!(none.status.code(), Some(2), "{none:?}");
}

#[test]
fn lock_run_stops_its_command_when_the_lease_is_lost() {
    let table = unique_name("cli");
    assert!(pgcoord(&table, &["migrate"]).status.success());
    // A command that runs until told to stop, and says it was.
    let script = r#"trap 'echo stopped; exit 0' TERM; while true; do sleep 0.1; done"#;
    let args = [
        "lock", "run", "--lease", "3s", "job", "--", "sh", "-c", script,
    ];
    let holder = pgcoord_command(&table, &args).spawn().unwrap();
    wait_until_held(&table, "job");
    let freed = pgcoord(&table, &["lock", "release", "job", "--force"]);
    assert!(freed.status.success(), "{freed:?}");
    let started = std::time::Instant::now();
    let holder = holder.wait_with_output().unwrap();
    // Seen at the next renewal (a third of the lease): well within one lease.
    let took = started.elapsed();
    assert!(took < Duration::from_secs(3), "stopped after {took:?}");
    assert_eq!(holder.status.code(), Some(5), "{holder:?}");
    assert!(stdout(&holder).contains("stopped"), "{holder:?}");
    let said = String::from_utf8_lossy(&holder.stderr);
    assert!(said.contains("lost"), "{said}");
}

#[test]
fn elect_runs_its_command_while_leader_and_the_next_candidate_after() {
    let table = unique_name("cli");
    assert!(pgcoord(&table, &["migrate"]).status.success());
    let script = r#"echo "term $PGCOORD_LEASE_TOKEN"; sleep 1; exit 3"#;
    let first = [
        "elect",
        "primary",
        "--value",
        "host-a:5432",
        "--",
        "sh",
        "-c",
        script,
    ];
    let first = pgcoord_command(&table, &first).spawn().unwrap();
    wait_until_held(&table, "primary");
    // The leader's value is the election's data.
    let show = stdout(&pgcoord(&table, &["lock", "show", "primary"]));
    assert!(show.contains("host-a:5432"), "{show}");
    // A candidate waits until elected (by default as long as it takes) ...
    let second = [
        "elect",
        "primary",
        "--value",
        "host-b",
        "--",
        "sh",
        "-c",
        r#"echo "term $PGCOORD_LEASE_TOKEN""#,
    ];
    let second = pgcoord_command(&table, &second).spawn().unwrap();
    // ... unless told to give up: exit 6, its command not run.
    let args = ["elect", "primary", "--wait", "200ms", "--", "echo", "ran"];
    let quitter = pgcoord(&table, &args);
    assert_eq!(quitter.status.code(), Some(6), "{quitter:?}");
    assert!(!stdout(&quitter).contains("ran"), "{quitter:?}");
    // The first term ends with its command (pgcoord exits with its code); the second starts.
    let first = first.wait_with_output().unwrap();
    assert_eq!(first.status.code(), Some(3), "{first:?}");
    let second = second.wait_with_output().unwrap();
    assert_eq!(second.status.code(), Some(0), "{second:?}");
    let term = |out: &std::process::Output| -> i64 {
        let text = stdout(out);
        text.trim()
            .strip_prefix("term ")
            .unwrap_or_else(|| panic!("{text}"))
            .parse()
            .unwrap()
    };
    assert!(
        term(&second) > term(&first),
        "terms are ordered by their tokens"
    );
    let free = pgcoord(&table, &["lock", "show", "primary"]);
    assert_eq!(
        free.status.code(),
        Some(3),
        "released after the last term: {free:?}"
    );
}

#[test]
fn resign_asks_the_leader_to_step_down_and_elect_stops_its_command() {
    let table = unique_name("cli");
    assert!(pgcoord(&table, &["migrate"]).status.success());
    // No leader: nothing to ask, exit 3.
    let nobody = pgcoord(&table, &["resign", "primary"]);
    assert_eq!(nobody.status.code(), Some(3), "{nobody:?}");
    // A 3 s term renewed (and looked at) every second.
    let args = [
        "elect",
        "primary",
        "--lease",
        "3s",
        "--",
        "sh",
        "-c",
        "exec sleep 60",
    ];
    let leader = pgcoord_command(&table, &args).spawn().unwrap();
    wait_until_held(&table, "primary");
    let asked = std::time::Instant::now();
    let resign = pgcoord(&table, &["resign", "primary"]);
    assert!(resign.status.success(), "{resign:?}");
    assert!(stdout(&resign).contains("to step down"), "{resign:?}");
    // The command gets SIGTERM at the next look; the term ends with it, released at once.
    let out = leader.wait_with_output().unwrap();
    let took = asked.elapsed();
    assert_eq!(out.status.code(), Some(128 + 15), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("asked to step down"),
        "{out:?}"
    );
    assert!(took < Duration::from_secs(3), "stepped down after {took:?}");
    let free = pgcoord(&table, &["lock", "show", "primary"]);
    assert_eq!(free.status.code(), Some(3), "{free:?}");
}

/// A shell loop that appends a line to `$WRITES` every 50 ms, for at most a minute (a failed
/// test leaves nothing running for long). Run as `sh -c`, it is the command's child. It holds
/// no pipe of pgcoord's, so pgcoord's output ends when pgcoord does.
const WRITER: &str = r#"exec >/dev/null 2>&1; i=0; while [ $i -lt 1200 ]; do echo x >> "$WRITES"; i=$((i+1)); sleep 0.05; done"#;

/// A file for `WRITER`, new.
fn writes() -> std::path::PathBuf {
    std::env::temp_dir().join(unique_name("pgcoord-writes"))
}

fn size(file: &std::path::Path) -> u64 {
    std::fs::metadata(file).map_or(0, |m| m.len())
}

/// Waits (at most 15 s) until something writes to `file`.
fn wait_for_writes(file: &std::path::Path) {
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    while size(file) < 2 {
        assert!(std::time::Instant::now() < deadline, "nothing written");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits (at most 5 s) until `file` stops growing: two sizes half a second apart are equal.
fn assert_writes_stop(file: &std::path::Path) {
    assert_writes_stop_for_now(file);
    let _ = std::fs::remove_file(file);
}

/// As `assert_writes_stop`, the file kept.
fn assert_writes_stop_for_now(file: &std::path::Path) {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let before = size(file);
        std::thread::sleep(Duration::from_millis(500));
        if size(file) == before {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "still written to: {} bytes",
            size(file)
        );
    }
}

/// `pgcoord` with `args` started, its command writing to `file`, once the writes began.
fn writing(table: &str, args: &[&str], file: &std::path::Path) -> std::process::Child {
    let holder = pgcoord_command(table, args)
        .env("WRITES", file)
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    wait_for_writes(file);
    holder
}

#[test]
fn lock_run_stops_the_commands_children_when_the_lease_is_lost() {
    let table = unique_name("cli");
    assert!(pgcoord(&table, &["migrate"]).status.success());
    let file = writes();
    // The writer is the shell's child, not pgcoord's: the group is signalled, not one pid.
    let script = format!("sh -c '{WRITER}'; echo finished");
    let args = [
        "lock", "run", "--lease", "3s", "job", "--", "sh", "-c", &script,
    ];
    let holder = writing(&table, &args, &file);
    let freed = pgcoord(&table, &["lock", "release", "job", "--force"]);
    assert!(freed.status.success(), "{freed:?}");
    let holder = holder.wait_with_output().unwrap();
    assert_eq!(holder.status.code(), Some(5), "{holder:?}");
    assert_writes_stop(&file);
}

#[test]
fn lock_run_kills_the_group_after_kill_after_when_it_ignores_sigterm() {
    let table = unique_name("cli");
    assert!(pgcoord(&table, &["migrate"]).status.success());
    let file = writes();
    // SIGTERM ignored by the shell and, inherited, by its writer.
    let script = format!("trap '' TERM; sh -c '{WRITER}'; echo finished");
    let args = [
        "lock",
        "run",
        "--lease",
        "3s",
        "--kill-after",
        "1s",
        "job",
        "--",
        "sh",
        "-c",
        &script,
    ];
    let holder = writing(&table, &args, &file);
    let freed = pgcoord(&table, &["lock", "release", "job", "--force"]);
    assert!(freed.status.success(), "{freed:?}");
    let holder = holder.wait_with_output().unwrap();
    assert_eq!(holder.status.code(), Some(5), "{holder:?}");
    let said = String::from_utf8_lossy(&holder.stderr);
    assert!(said.contains("SIGKILL"), "{said}");
    assert_writes_stop(&file);
}

#[test]
fn lock_run_stops_what_its_command_left_running_before_the_release() {
    let table = unique_name("cli");
    assert!(pgcoord(&table, &["migrate"]).status.success());
    let file = writes();
    // The command exits, its background writer still running.
    let script = format!("sh -c '{WRITER}' & sleep 0.5; exit 3");
    let args = ["lock", "run", "job", "--", "sh", "-c", &script];
    let holder = pgcoord_command(&table, &args)
        .env("WRITES", &file)
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let holder = holder.wait_with_output().unwrap();
    assert_eq!(holder.status.code(), Some(3), "{holder:?}");
    assert_writes_stop(&file);
    let said = String::from_utf8_lossy(&holder.stderr);
    assert!(said.contains("leaving processes"), "{said}");
    let show = pgcoord(&table, &["lock", "show", "job"]);
    assert_eq!(show.status.code(), Some(3), "released: {show:?}");
}

#[test]
fn a_sigkilled_pgcoord_leaves_nothing_of_its_command_running() {
    let table = unique_name("cli");
    assert!(pgcoord(&table, &["migrate"]).status.success());
    let script = format!("sh -c '{WRITER}'; echo finished");
    for verb in [&["lock", "run", "job"][..], &["elect", "primary"][..]] {
        let file = writes();
        let mut args = verb.to_vec();
        args.extend(["--", "sh", "-c", &script]);
        let mut holder = pgcoord_command(&table, &args)
            .env("WRITES", &file)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        wait_for_writes(&file);
        // SIGKILL: pgcoord cannot pass anything on; its watchdog kills the group.
        holder.kill().unwrap();
        holder.wait().unwrap();
        assert_writes_stop(&file);
    }
}

#[test]
fn lock_run_stops_its_command_with_it_on_sigtstp_and_continues_it_after() {
    let table = unique_name("cli");
    assert!(pgcoord(&table, &["migrate"]).status.success());
    let file = writes();
    let script = format!("sh -c '{WRITER}'; echo finished");
    let args = [
        "lock", "run", "--lease", "10s", "job", "--", "sh", "-c", &script,
    ];
    let holder = writing(&table, &args, &file);
    let kill = |signal: &str| {
        let sent = Command::new("kill")
            .args([signal, &holder.id().to_string()])
            .output()
            .unwrap();
        assert!(sent.status.success(), "{sent:?}");
    };
    // Ctrl-Z's signal, to pgcoord alone: the command (its own group) is stopped with it.
    kill("-TSTP");
    assert_writes_stop_for_now(&file);
    let before = size(&file);
    kill("-CONT");
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while size(&file) <= before {
        assert!(std::time::Instant::now() < deadline, "not continued");
        std::thread::sleep(Duration::from_millis(20));
    }
    let freed = pgcoord(&table, &["lock", "release", "job", "--force"]);
    assert!(freed.status.success(), "{freed:?}");
    let holder = holder.wait_with_output().unwrap();
    assert_eq!(holder.status.code(), Some(5), "{holder:?}");
    assert_writes_stop(&file);
}

/// The command is stopped a margin (a tenth of the lease, as the runtime's) before the deadline
/// the server keeps, measured from the grant's sending: here the renewals are black-holed.
#[tokio::test]
async fn lock_run_stops_its_command_a_margin_before_the_lease_expires() {
    let table = unique_name("cli");
    assert!(pgcoord(&table, &["migrate"]).status.success());
    let pg = test_pg_config().unwrap();
    let proxy = pgcoord_testkit::Proxy::start(&pg).await.unwrap();
    let via = proxy.pg_config(&pg);
    let dsn = format!(
        "host=127.0.0.1 port={} user={} dbname={}",
        via.get_ports()[0],
        via.get_user().unwrap(),
        via.get_dbname().unwrap()
    );
    let file = writes();
    let script = r#"echo started >> "$WRITES"; trap 'echo stopped >> "$WRITES"; exit 0' TERM; while true; do sleep 0.05; done"#;
    let lease = Duration::from_secs(10);
    let args = [
        "lock", "run", "--lease", "10s", "job", "--", "sh", "-c", script,
    ];
    let holder = pgcoord_command(&table, &args)
        .env("DATABASE_URL", &dsn)
        .env("WRITES", &file)
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let read = || std::fs::read_to_string(&file).unwrap_or_default();
    let until = |text: &'static str| async move {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while !read().contains(text) {
            assert!(tokio::time::Instant::now() < deadline, "never {text}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        std::time::Instant::now()
    };
    // Started after the grant was sent: from here, less than the lease is left.
    let started = until("started").await;
    proxy.cut();
    proxy.refuse(true);
    let stopped = until("stopped").await;
    let held = stopped - started;
    // Old: the full lease (less the start's few ms). Half the margin is the slack for a slow
    // wake-up; a tenth of the lease is the runtime's margin.
    let margin = lease / 10;
    assert!(held < lease - margin / 2, "stopped after {held:?}");
    assert!(held > lease / 2, "stopped early: {held:?}");
    let holder = tokio::task::spawn_blocking(|| holder.wait_with_output().unwrap())
        .await
        .unwrap();
    assert_eq!(holder.status.code(), Some(5), "{holder:?}");
    let _ = std::fs::remove_file(&file);
}

#[test]
fn lock_name_then_a_command_is_lock_run_as_etcdctl_has_it() {
    let table = unique_name("cli");
    assert!(pgcoord(&table, &["migrate"]).status.success());
    let script = r#"echo "$PGCOORD_LEASE_NAME $PGCOORD_LEASE_TOKEN"; sleep 1; exit 7"#;
    let args = ["lock", "--lease", "5s", "job", "--", "sh", "-c", script];
    let first = pgcoord_command(&table, &args).spawn().unwrap();
    wait_until_held(&table, "job");
    // The subcommands are still theirs.
    let show = stdout(&pgcoord(&table, &["lock", "show", "job"]));
    assert!(show.contains("held:    true"), "{show}");
    // Held by the first: a second run gives up at --timeout, exit 6, its command not run.
    let args = ["--timeout", "200ms", "lock", "job", "--", "echo", "ran"];
    let second = pgcoord(&table, &args);
    assert_eq!(second.status.code(), Some(6), "{second:?}");
    assert!(!stdout(&second).contains("ran"), "{second:?}");
    // The command saw its lease; its exit code is pgcoord's; the lease is free at once.
    let first = first.wait_with_output().unwrap();
    assert_eq!(first.status.code(), Some(7), "{first:?}");
    assert!(stdout(&first).starts_with("job "), "{first:?}");
    let show = pgcoord(&table, &["lock", "show", "job"]);
    assert_eq!(show.status.code(), Some(3), "{show:?}");
    // No command, or nothing at all: a usage error.
    for args in [&["lock", "job"][..], &["lock"][..]] {
        let out = pgcoord(&table, args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {out:?}");
    }
}
