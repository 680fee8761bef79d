//! `pgcoord`: the operator's command. Applies the schema, lists and frees leases, shows who holds
//! advisory locks, watches a channel and sends an event, and summarises pgcoord's sessions.
//!
//! Layout: `args.rs` is the command line's grammar; this file runs it and maps errors to exit
//! codes; `inspect.rs` holds
//! the read-only commands (locks, lock show, advisory, status), `signals.rs` listen and notify,
//! `topics.rs` the durable topics (list, consumers, tail, reset), `schedules.rs` the
//! schedules' runs, `hold.rs` `lock run` and `elect`, `observe.rs` `elect observe`.
//! Exit codes: 0 done, 1 failed (database, network), 2 bad usage or input, 3 not found, 4 the
//! tables are missing (with a hint to migrate) or, for `migrate --status`, not up to date,
//! 5 `lock run`'s lease lost while its command ran, 6 `lock run`'s lease held by another until
//! `--timeout`; otherwise `lock run` exits with its command's code.
#![deny(missing_docs)]

use std::process::ExitCode;

use clap::Parser;

use args::{Cli, Command, ElectAction, Held, LockAction, LockRun, TopicAction};
use pgcoord::{Config, ErrorKind};

mod args;
mod deadline;
mod group;
mod hold;
mod inspect;
mod observe;
mod output;
mod schedules;
mod signals;
mod topics;

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli).await {
        Ok(code) => ExitCode::from(code),
        Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::UNDEFINED_TABLE) => {
            eprintln!("error: {e}");
            eprintln!(
                "hint: pgcoord's tables are not in this database (or not under these names): \
                 run `pgcoord migrate`, or name them with --lock-table, --payload-table, \
                 --topic-table, --schedule-table"
            );
            ExitCode::from(4)
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(match e.kind() {
                ErrorKind::NotFound => 3,
                ErrorKind::NotAcquired => 6,
                ErrorKind::InvalidConfig
                | ErrorKind::InvalidIdentifier
                | ErrorKind::InvalidName
                | ErrorKind::PayloadTooLarge => 2,
                _ => 1,
            })
        }
    }
}

async fn run(mut cli: Cli) -> pgcoord::Result<u8> {
    if let Command::Migrate { dry_run: true, .. } = cli.command {
        // The SQL depends on the tables' names alone: no DSN is read, nothing connects.
        let config = Config::builder()
            .pg_config(&tokio_postgres::Config::new())
            .lock_table(cli.lock_table)
            .payload_table(cli.payload_table)
            .topic_table(cli.topic_table)
            .schedule_table(cli.schedule_table)
            .build()?;
        print!("{}", pgcoord::schema::sql(&config));
        return Ok(0);
    }
    // --dsn, else DATABASE_URL, else the PG* variables and the password file, as psql.
    let builder = match cli.dsn {
        Some(dsn) => Config::builder().dsn(dsn),
        None => Config::builder().dsn_from_env().map_err(|_| {
            pgcoord::Error::new(
                ErrorKind::InvalidConfig,
                "no database: pass --dsn, or set DATABASE_URL or the PG* variables",
            )
        })?,
    };
    let builder = builder
        .lock_table(cli.lock_table)
        .payload_table(cli.payload_table)
        .topic_table(cli.topic_table)
        .schedule_table(cli.schedule_table)
        .poll_only(cli.poll_only)
        .application_name("pgcoord-cli");
    if cli.poll_only && matches!(cli.command, Command::Listen { .. } | Command::Notify { .. }) {
        return Err(pgcoord::Error::new(
            ErrorKind::Unsupported,
            "listen and notify need LISTEN/NOTIFY, which --poll-only turns off",
        ));
    }
    let within = cli.timeout.max(std::time::Duration::from_millis(1));
    // `lock run` and `elect` run as long as their command: no deadline of the command's.
    let held = match std::mem::replace(&mut cli.command, Command::Locks) {
        Command::Lock {
            action: Some(LockAction::Run(LockRun { name, held })),
            ..
        }
        | Command::Lock {
            action: None,
            name: Some(name),
            held,
        } => Some((name, held, within, None)),
        Command::Elect {
            action: None,
            name: Some(name),
            value,
            wait,
            held,
        } => {
            // Until elected: a standby waits as long as it runs.
            let wait = wait.unwrap_or(std::time::Duration::from_secs(100 * 365 * 24 * 3600));
            Some((name, held, wait, Some(value.into_bytes())))
        }
        other => {
            cli.command = other;
            None
        }
    };
    if let Some((
        name,
        Held {
            lease,
            kill_after,
            command,
        },
        wait,
        proclaim,
    )) = held
    {
        // Its own owner identity (host, pid, random), as a service's: two runs never share one.
        let config = builder.lease(lease).heartbeat(lease / 3).build()?;
        let hold = hold::Hold {
            name,
            command,
            wait,
            kill_after,
            proclaim,
        };
        return hold::run(&config, hold).await;
    }
    let config = builder.owner("pgcoord-cli").build()?;
    if let Command::Elect {
        action: Some(ElectAction::Observe { name, count }),
        ..
    } = &cli.command
    {
        return observe::run(config, name, *count, within, cli.as_json).await;
    }
    if let Command::Ui {
        listen,
        allow_actions,
    } = &cli.command
    {
        let mut view = pgcoord_ui::LiveView::new(&config);
        if *allow_actions {
            let token = std::env::var("PGCOORD_UI_TOKEN").map_err(|_| {
                pgcoord::Error::new(
                    ErrorKind::InvalidConfig,
                    "--allow-actions needs the token in PGCOORD_UI_TOKEN",
                )
            })?;
            view = view.allow_actions(token)?;
        }
        return serve_ui(view, *listen).await;
    }
    // Set once connected: past the deadline the statement under way is cancelled with it.
    let cancel = std::sync::OnceLock::new();
    let bounded = async {
        if let Command::Listen { channel, count } = &cli.command {
            let listening = signals::start_listening(&config, channel).await?;
            return Ok(Ok((listening, *count)));
        }
        let client = pgcoord::db::connect_spawned(&config).await?;
        let _ = cancel.set(client.cancel_token());
        command(cli.command, &config, &client, cli.as_json)
            .await
            .map(Err)
    };
    match deadline::bounded(&config, within, &cancel, bounded).await? {
        Ok((listening, count)) => signals::listen(&config, listening, count).await.map(|()| 0),
        Err(code) => Ok(code),
    }
}

/// `ui`: the live view at `listen`, until ctrl-c or SIGTERM.
async fn serve_ui(view: pgcoord_ui::LiveView, listen: std::net::SocketAddr) -> pgcoord::Result<u8> {
    let listener = tokio::net::TcpListener::bind(listen).await.map_err(|e| {
        pgcoord::Error::new(
            ErrorKind::InvalidConfig,
            format!("cannot listen on {listen}: {e}"),
        )
    })?;
    let address = listener.local_addr().unwrap_or(listen);
    // The address as the listener took it (port 0 asks for any): a script reads it here.
    println!("serving the live view at http://{address}/");
    let mut terminate =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .map_err(|e| pgcoord::Error::new(ErrorKind::Other, format!("SIGTERM: {e}")))?;
    tokio::select! {
        served = view.serve(listener) => served.map_err(|e| {
            pgcoord::Error::new(ErrorKind::Unavailable, format!("serving the live view: {e}"))
        })?,
        _ = tokio::signal::ctrl_c() => {}
        _ = terminate.recv() => {}
    }
    Ok(0)
}

/// Every one-shot command, on `client`; its exit code.
async fn command(
    command: Command,
    config: &Config,
    client: &tokio_postgres::Client,
    json: bool,
) -> pgcoord::Result<u8> {
    let done = match command {
        Command::Migrate { status, .. } => {
            let changes = pgcoord::schema::migrate_and_report(client, config, !status).await?;
            let (done, pending) = if status {
                ("up to date", "would create")
            } else {
                ("up to date: nothing changed", "created")
            };
            if json {
                let key = if status { "pending" } else { "created" };
                println!("{}", serde_json::json!({ key: changes }));
            } else if changes.is_empty() {
                println!("{done}");
            } else {
                println!("{pending}:");
                for change in &changes {
                    println!("  {change}");
                }
            }
            // Scripts and deployment checks ask with the code: 4, as for missing tables.
            return Ok(if status && !changes.is_empty() { 4 } else { 0 });
        }
        Command::Locks => inspect::locks(config, client, json).await,
        Command::Lock {
            action: Some(LockAction::Show { name }),
            ..
        } => inspect::show(config, client, &name, json).await,
        Command::Lock {
            action: Some(LockAction::Release { name, force }),
            ..
        } => inspect::release(config, client, &name, force).await,
        Command::Lock { .. } | Command::Elect { .. } => {
            unreachable!(
                "lock run, elect and elect observe are started by `run`: they have no deadline \
                 of their own"
            )
        }
        Command::Resign { name } => inspect::resign(config, client, &name).await,
        Command::Limit { name, permits } => inspect::limit(config, client, &name, permits).await,
        Command::Advisory => inspect::advisory(client, json).await,
        Command::Status => inspect::status(config, client, json).await,
        Command::Ui { .. } => unreachable!("ui is served by `run`: it has no deadline"),
        // Started (bounded) and run by `run`: it has no end of its own.
        Command::Listen { .. } => unreachable!("listen is not a one-shot command"),
        Command::Notify { channel, json } => signals::notify(config, client, &channel, &json).await,
        Command::Topics { action: None } => topics::list(config, client, json).await,
        Command::Topics {
            action: Some(TopicAction::Consumers { topic }),
        } => topics::consumers(config, client, &topic, json).await,
        Command::Topics {
            action: Some(TopicAction::Tail { topic, count }),
        } => topics::tail(config, client, &topic, count, json).await,
        Command::Topics {
            action:
                Some(TopicAction::Reset {
                    topic,
                    consumer,
                    to,
                    force,
                }),
        } => topics::reset(config, client, &topic, &consumer, &to, force).await,
        Command::Schedules { name, count } => {
            schedules::list(config, client, name.as_deref(), count, json).await
        }
    };
    done.map(|()| 0)
}
