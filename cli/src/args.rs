//! The command line's grammar: every subcommand, argument and help text (clap).

use clap::{Parser, Subcommand};

/// pgcoord's operator command.
#[derive(Parser)]
#[command(name = "pgcoord", version, about)]
pub(crate) struct Cli {
    /// The database, as a libpq-style DSN or a postgresql:// URL. Without it and without
    /// DATABASE_URL: the PG* variables (PGHOST, PGPORT, PGUSER, PGPASSWORD, PGDATABASE,
    /// PGSSLMODE, …) and the password file (PGPASSFILE, ~/.pgpass), as psql reads them.
    #[arg(long, env = "DATABASE_URL", hide_env_values = true, global = true)]
    pub(crate) dsn: Option<String>,
    /// The lock table, `name` or `schema.name`.
    #[arg(long, default_value = "pgcoord_locks", global = true)]
    pub(crate) lock_table: String,
    /// The payload table, `name` or `schema.name`.
    #[arg(long, default_value = "pgcoord_payloads", global = true)]
    pub(crate) payload_table: String,
    /// The durable topics' table, `name` or `schema.name`.
    #[arg(long, default_value = "pgcoord_topics", global = true)]
    pub(crate) topic_table: String,
    /// The schedules' runs table, `name` or `schema.name`.
    #[arg(long, default_value = "pgcoord_schedules", global = true)]
    pub(crate) schedule_table: String,
    /// Give up after this long (`30`, `30s`, `500ms`, `2m`): the whole command, or for `listen`
    /// and `elect observe` its start (connect, LISTEN). A server that accepts and then never answers must not
    /// hang an operator.
    #[arg(long, default_value = "30s", value_parser = duration, global = true)]
    pub(crate) timeout: std::time::Duration,
    /// Poll-only mode, as the services run with `ConfigBuilder::poll_only`: no statement sends
    /// a NOTIFY (`lock release --force`, `limit`, `lock run`, `elect`); `listen` and `notify`
    /// are refused.
    #[arg(long, env = "PGCOORD_POLL_ONLY", global = true)]
    pub(crate) poll_only: bool,
    /// Print listings (locks, lock show, advisory, status, topics, schedules, migrate) as JSON,
    /// whole where tables shorten long names with `…`, for scripts; `elect observe` prints a
    /// JSON line per change.
    #[arg(long = "json", global = true)]
    pub(crate) as_json: bool,
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Subcommand)]
pub(crate) enum Command {
    /// Create or update pgcoord's tables (idempotent), saying what it created.
    Migrate {
        /// Change nothing: say what a migration would create now (it runs and is rolled back);
        /// exit 4 when that is anything, 0 when the tables are up to date.
        #[arg(long, conflicts_with = "dry_run")]
        status: bool,
        /// Change nothing: print the SQL a migration runs, for these table names. Needs no
        /// database: nothing connects.
        #[arg(long)]
        dry_run: bool,
    },
    /// List every lease: owner, token, time left on the server's clock, data.
    Locks,
    /// One lease: show it, free it, or run a command holding it. `lock NAME -- COMMAND...`
    /// (etcdctl's and consul's form) is `lock run NAME -- COMMAND...`; a lease named `show`,
    /// `release` or `run` is run with `lock run`.
    #[command(
        args_conflicts_with_subcommands = true,
        subcommand_negates_reqs = true,
        arg_required_else_help = true
    )]
    Lock {
        #[command(subcommand)]
        action: Option<LockAction>,
        /// The lease's name.
        #[arg(required = true)]
        name: Option<String>,
        #[command(flatten)]
        held: Held,
    },
    /// Advisory locks held or awaited now, with the holding session's application_name.
    Advisory,
    /// Print every message on CHANNEL as one JSON line (stored payloads fetched).
    Listen {
        /// The channel.
        channel: String,
        /// Stop after this many messages.
        #[arg(long)]
        count: Option<usize>,
    },
    /// Send JSON (as MessagePack, in a pgcoord envelope) on CHANNEL.
    Notify {
        /// The channel.
        channel: String,
        /// The message, as JSON.
        json: String,
    },
    /// pgcoord's sessions by role, its tables' sizes, expired payloads.
    Status,
    /// Serve the live view (leases and their lines, terms, worker pools, consumers' lag with a
    /// chart, schedules, limits, advisory locks, the fleet's sessions) as a web page at
    /// --listen, until interrupted. It only reads, unless --allow-actions.
    Ui {
        /// Where to serve it: loopback by default (the page shows the fleet's names and data;
        /// put it behind your own access control before serving it elsewhere).
        #[arg(long, default_value = "127.0.0.1:7070")]
        listen: std::net::SocketAddr,
        /// Let the page act (ask a leader to resign or a pool member to drain, release a lease,
        /// move a consumer's cursor)
        /// for whoever enters the token read from PGCOORD_UI_TOKEN (16 characters or more; never
        /// on the command line, where other users can read it).
        #[arg(long)]
        allow_actions: bool,
    },
    /// Run COMMAND while leader of the election NAME: campaign (until elected, or at most
    /// --wait), proclaim --value, run the command; the term ends when it exits. When the term is
    /// lost, the command's process group gets SIGTERM (SIGKILL after --kill-after) and pgcoord
    /// exits 5. The command finds PGCOORD_LEASE_NAME, PGCOORD_LEASE_TOKEN (the term) and
    /// PGCOORD_LEASE_OWNER. It runs in a process group of its own, stopped as `lock run`'s is.
    /// `elect observe NAME` prints each change of leader instead.
    #[command(
        args_conflicts_with_subcommands = true,
        subcommand_negates_reqs = true,
        arg_required_else_help = true
    )]
    Elect {
        #[command(subcommand)]
        action: Option<ElectAction>,
        /// The election's name (its lease's, as the runtime's `Election` names it).
        #[arg(required = true)]
        name: Option<String>,
        /// What the leader proclaims (observers see it; `pgcoord lock show NAME` too).
        #[arg(long, default_value = "")]
        value: String,
        /// Campaign at most this long (exit 6 if not elected); by default until elected.
        #[arg(long, value_parser = duration)]
        wait: Option<std::time::Duration>,
        #[command(flatten)]
        held: Held,
    },
    /// Ask the leader of the election NAME to step down: it hears of it within a heartbeat and
    /// resigns once its work is wound down (`pgcoord elect` stops its command with SIGTERM).
    /// Not a release: the term lasts until then. Exit 3 when no one leads.
    Resign {
        /// The election's name.
        name: String,
    },
    /// Show the stored limit of the limited semaphore NAME, or set it to PERMITS (0 admits
    /// nobody). Lowered, the permits at or above the new limit are taken back from their
    /// holders (their fenced writes fail at once). Exit 3 when NAME has no limit to show.
    Limit {
        /// The semaphore's name.
        name: String,
        /// The new limit.
        permits: Option<u32>,
    },
    /// Durable topics: every topic, or one topic's consumers, last events, a cursor reset.
    Topics {
        #[command(subcommand)]
        action: Option<TopicAction>,
    },
    /// Schedules: each one's latest tick (state, attempts, owner, error, next tick), or with
    /// NAME that schedule's last runs.
    Schedules {
        /// One schedule: its last runs, newest first.
        name: Option<String>,
        /// How many of its runs.
        #[arg(long, default_value_t = 20)]
        count: u32,
    },
}

#[derive(Subcommand)]
pub(crate) enum ElectAction {
    /// Print who leads the election NAME, then one line at each change of leader, until
    /// interrupted (Ctrl-C, SIGTERM, SIGHUP) or --count lines: `OWNER leads (term TOKEN): VALUE`
    /// or `no leader`; with --json a JSON object per line. What is printed is read from the
    /// lock table (a notification only makes it look): a term shorter than a read may go
    /// unseen. --timeout bounds the start (connecting).
    Observe {
        /// The election's name.
        name: String,
        /// Stop after this many lines.
        #[arg(long)]
        count: Option<usize>,
    },
}

#[derive(Subcommand)]
pub(crate) enum TopicAction {
    /// Each consumer of TOPIC: cursor, lag in events and in time, last ack.
    Consumers {
        /// The topic.
        topic: String,
    },
    /// The last events of TOPIC that can be read, oldest first.
    Tail {
        /// The topic.
        topic: String,
        /// How many.
        #[arg(long, default_value_t = 10)]
        count: u32,
    },
    /// Move CONSUMER's cursor: it gets every event after it (again, or skips to it).
    Reset {
        /// The topic.
        topic: String,
        /// The consumer.
        consumer: String,
        /// `oldest` (what retention kept), `now`, or a cursor `XID/POSITION`.
        #[arg(long)]
        to: String,
        /// Required: a running consumer acks on from wherever it is.
        #[arg(long)]
        force: bool,
    },
}

#[derive(Subcommand)]
pub(crate) enum LockAction {
    /// Show one lease.
    Show {
        /// The lease's name.
        name: String,
    },
    /// Free a lease now; its holder learns it lost it at its next renewal.
    Release {
        /// The lease's name.
        name: String,
        /// Required: the holder still believes it holds the lease until its next renewal.
        #[arg(long)]
        force: bool,
    },
    /// Run COMMAND while holding the lease NAME: waited for (at most --timeout), renewed while
    /// the command runs, released when it exits (pgcoord then exits with its code). The lease
    /// counts as lost a tenth of --lease before the server's deadline, as the runtime counts it;
    /// then the command's process group gets SIGTERM (SIGKILL after --kill-after) and pgcoord
    /// exits 5. The command finds PGCOORD_LEASE_NAME, PGCOORD_LEASE_TOKEN and
    /// PGCOORD_LEASE_OWNER (to fence its writes) in its environment. `pgcoord lock NAME --
    /// COMMAND...` is the same.
    ///
    /// The command runs in a process group of its own, so everything it starts is stopped with
    /// it: processes it leaves running when it exits get SIGTERM (SIGKILL after --kill-after)
    /// before the release, and if pgcoord dies, even by SIGKILL, a watchdog process kills the
    /// group (on every Unix: it sees the end of a pipe pgcoord held). pgcoord passes SIGTERM,
    /// SIGINT (Ctrl-C) and SIGHUP to the group; SIGTSTP (Ctrl-Z) stops the group with pgcoord.
    /// Out of the terminal's foreground group, a command that reads the terminal is stopped:
    /// give it its input another way.
    Run(LockRun),
}

/// `lock run NAME -- COMMAND...`, or `lock NAME -- COMMAND...`.
#[derive(clap::Args)]
pub(crate) struct LockRun {
    /// The lease's name.
    pub(crate) name: String,
    #[command(flatten)]
    pub(crate) held: Held,
}

/// What `lock run` and `elect` share: the lease (or term) that holds while a command runs.
#[derive(clap::Args)]
pub(crate) struct Held {
    /// How long the lease (or term) lasts unrenewed (`20s`): a crash of pgcoord frees it after
    /// this.
    #[arg(long, default_value = "20s", value_parser = duration)]
    pub(crate) lease: std::time::Duration,
    /// The grace between SIGTERM and SIGKILL when the command's process group is stopped: the
    /// lease lost, a resign asked, or processes left running after the command exited.
    #[arg(long, default_value = "10s", value_parser = duration)]
    pub(crate) kill_after: std::time::Duration,
    /// The command and its arguments, after `--`.
    #[arg(last = true, required = true)]
    pub(crate) command: Vec<String>,
}

/// Whole seconds (`30`), or a duration with its unit (`500ms`, `30s`, `2m`, `1h`).
pub(crate) fn duration(text: &str) -> Result<std::time::Duration, String> {
    if let Ok(seconds) = text.parse::<u64>() {
        return Ok(std::time::Duration::from_secs(seconds));
    }
    humantime::parse_duration(text).map_err(|e| format!("{e}: say 30, 30s, 500ms or 2m"))
}
