//! Routed worker pools: a message to a key's worker in another process, against the
//! request/reply round trip it is built on, one at a time and with many senders at once.

use std::time::{Duration, Instant};

use actix::prelude::*;
use pgcoord::Config;
use pgcoord_actors::{
    Ask, GetStats, KeyRouter, ListenerActor, LockManager, Routed, Serve, Shutdown, WorkerKey,
    WorkerPool,
};

use crate::Sizes;
use crate::leases::Res;
use crate::report::{Report, Samples};

/// Answers what it is sent, and says when it got it.
struct Echo(tokio::sync::mpsc::UnboundedSender<Instant>);
impl Actor for Echo {
    type Context = Context<Self>;
}
impl Handler<Shutdown> for Echo {
    type Result = ();
    fn handle(&mut self, _: Shutdown, ctx: &mut Context<Self>) {
        ctx.stop();
    }
}
impl Handler<Routed> for Echo {
    type Result = Result<Vec<u8>, String>;
    fn handle(&mut self, routed: Routed, _: &mut Context<Self>) -> Self::Result {
        let _ = self.0.send(Instant::now());
        Ok(routed.payload().to_vec())
    }
}

pub async fn run(pg: &tokio_postgres::Config, sizes: &Sizes, report: &mut Report) -> Res {
    let config = |owner: &str| {
        Config::builder()
            .pg_config(pg)
            .owner(owner)
            .lock_table("bench_routing")
            .lease(Duration::from_secs(4))
            .heartbeat(Duration::from_secs(1))
            .pool_size(16)
            .build()
    };
    let admin_cfg = config("admin")?;
    let admin = pgcoord::db::connect_spawned(&admin_cfg).await?;
    pgcoord::schema::drop_tables(&admin, &admin_cfg).await?;
    pgcoord::schema::migrate(&admin, &admin_cfg).await?;
    let keys: Vec<String> = (0..1_000).map(|i| format!("k{i}")).collect();
    // Two members, as two processes; each key's worker answers from one of them.
    let (handled, mut arrivals) = tokio::sync::mpsc::unbounded_channel();
    let member = |owner: &str| -> Res<(Addr<WorkerPool<Echo>>, Addr<ListenerActor>)> {
        let config = config(owner)?;
        let locks = LockManager::new(config.clone()).start();
        let listener = ListenerActor::new(config.clone(), None).start_supervised();
        let handled = handled.clone();
        let echo = move |_: WorkerKey| Echo(handled.clone());
        let pool =
            WorkerPool::new(&config, locks, "bench", keys.clone(), echo).routed(listener.clone());
        Ok((pool.start(), listener))
    };
    let (a, a_listener) = member("a")?;
    let (b, _b_listener) = member("b")?;
    let started = Instant::now();
    loop {
        let held =
            a.send(GetStats::new()).await?.keys.len() + b.send(GetStats::new()).await?.keys.len();
        if held == keys.len() {
            break;
        }
        if started.elapsed() > Duration::from_secs(60) {
            return Err("the keys were not all held within a minute".into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The floor: the same sender's request/reply to a channel one member serves.
    a_listener
        .send(Serve::new("bench_route_floor", |p| async move { Ok(p) }))
        .await??;
    let sender = config("sender")?;
    let listener = ListenerActor::new(sender.clone(), None).start_supervised();
    let router = KeyRouter::new("bench", LockManager::new(sender).start(), listener.clone());
    let timeout = Duration::from_secs(10);
    let floor = |i: usize| {
        let ask = Ask::new("bench_route_floor", (i as u32).to_be_bytes().to_vec()).timeout(timeout);
        listener.send(ask)
    };

    // One at a time, interleaved in blocks of 20 (the first operation after a switch is slower).
    let (mut ours, mut theirs) = (Vec::new(), Vec::new());
    for block in 0..sizes.requests.div_ceil(20) {
        for side in [block % 2, 1 - block % 2] {
            for i in block * 20..(block + 1) * 20 {
                let t = Instant::now();
                if side == 0 {
                    floor(i).await??;
                    theirs.push(t.elapsed());
                } else {
                    let key = &keys[i % keys.len()];
                    router
                        .ask(key, (i as u32).to_be_bytes().to_vec(), timeout)
                        .await?;
                    ours.push(t.elapsed());
                }
            }
        }
    }
    let (ours, theirs) = (Samples::new(ours), Samples::new(theirs));
    let p50 = report.time(
        "routed ask to a key's worker in another process, p50 (floor: request/reply round trip)",
        ours.p(0.5),
        theirs.p(0.5),
    );
    report.time("routed ask, p99", ours.p(0.99), theirs.p(0.99));
    report.target(
        "routed ask p50: at most 1.2× the request/reply round trip",
        format!("{p50:.3}×"),
        p50 <= 1.2,
    );

    // A tell: from the call until the key's worker has the message, against one raw NOTIFY
    // hop (a NOTIFY's statement until a LISTENing connection has it). Also the call's own
    // time: it answers once the message is in the worker's mailbox.
    let (raw, mut connection) = pgcoord::__private::connect(&admin_cfg).await?;
    let (tx, mut heard) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        use futures_util::future::poll_fn;
        while let Some(Ok(message)) = poll_fn(|cx| connection.poll_message(cx)).await {
            if let tokio_postgres::AsyncMessage::Notification(_) = message {
                let _ = tx.send(Instant::now());
            }
        }
    });
    raw.batch_execute("LISTEN bench_route_hop").await?;
    let notify = admin
        .prepare("SELECT pg_notify('bench_route_hop', $1)")
        .await?;
    while arrivals.try_recv().is_ok() {}
    let (mut told, mut calls, mut hops) = (Vec::new(), Vec::new(), Vec::new());
    for block in 0..sizes.requests.div_ceil(20) {
        for side in [block % 2, 1 - block % 2] {
            for i in block * 20..(block + 1) * 20 {
                let t = Instant::now();
                if side == 0 {
                    admin.query_one(&notify, &[&i.to_string()]).await?;
                    hops.push(heard.recv().await.ok_or("the raw listener")? - t);
                } else {
                    let key = &keys[i % keys.len()];
                    router.tell(key, b"t".to_vec(), timeout).await?;
                    calls.push(t.elapsed());
                    told.push(arrivals.recv().await.ok_or("the workers")? - t);
                }
            }
        }
    }
    let (told, calls, hops) = (Samples::new(told), Samples::new(calls), Samples::new(hops));
    let p50 = report.time(
        "routed tell, call → the key's worker has it, p50 (floor: one raw NOTIFY→LISTEN hop)",
        told.p(0.5),
        hops.p(0.5),
    );
    report.time("routed tell, p99", told.p(0.99), hops.p(0.99));
    report.target(
        "routed tell p50: at most 2× one NOTIFY hop",
        format!("{p50:.3}×"),
        p50 <= 2.0,
    );
    report.time(
        "routed tell, the call until it answers (in the mailbox), p50 (floor: one raw NOTIFY hop)",
        calls.p(0.5),
        hops.p(0.5),
    );

    // Many senders at once: 64 loops, each one ask after another, over 1,000 keys on two
    // members; the floor is 64 loops of request/reply.
    let total = sizes.requests * 4;
    let per = total.div_ceil(64);
    let rate = async |routed: bool| -> Res<f64> {
        let t = Instant::now();
        let loops = (0..64).map(|l| {
            let (router, keys) = (router.clone(), &keys);
            let floor = &floor;
            async move {
                for i in l * per..(l + 1) * per {
                    if routed {
                        let key = &keys[i % keys.len()];
                        router.ask(key, b"m".to_vec(), timeout).await?;
                    } else {
                        floor(i).await??;
                    }
                }
                Ok::<(), Box<dyn std::error::Error>>(())
            }
        });
        for done in futures_util::future::join_all(loops).await {
            done?;
        }
        Ok((per * 64) as f64 / t.elapsed().as_secs_f64())
    };
    let (mut ours, mut theirs) = (0f64, 0f64);
    for _ in 0..2 {
        theirs = theirs.max(rate(false).await?);
        ours = ours.max(rate(true).await?);
    }
    report.rate(
        "routed asks/s, 64 senders, 1,000 keys on two members (floor: request/reply, 64 senders)",
        ours,
        theirs,
        "msgs/s",
    );
    a.send(Shutdown).await?;
    b.send(Shutdown).await?;

    // A fleet's shape: three members, each on a thread and runtime of its own (as three
    // processes), 1,000 keys; 64 senders in this one ask (or tell) one message after another;
    // the floor is 64 loops of request/reply to an echo each member serves.
    let mut members = Vec::new();
    for owner in ["m1", "m2", "m3"] {
        members.push(member_thread(
            config(owner)?,
            keys.clone(),
            format!("bench_echo_{owner}"),
        ));
    }
    for (_, _, ready) in &members {
        ready.recv_timeout(Duration::from_secs(30))?;
    }
    let held = "SELECT count(*) FROM bench_routing \
                WHERE starts_with(name, 'fleet/keys/') AND expires_at > clock_timestamp()";
    let started = Instant::now();
    while admin.query_one(held, &[]).await?.get::<_, i64>(0) < keys.len() as i64 {
        if started.elapsed() > Duration::from_secs(60) {
            return Err("the fleet's keys were not all held within a minute".into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let fleet = KeyRouter::new(
        "fleet",
        LockManager::new(config("fleet-sender")?).start(),
        listener.clone(),
    );
    let echo = |i: usize| {
        let ask = Ask::new(format!("bench_echo_m{}", 1 + i % 3), b"m".to_vec()).timeout(timeout);
        listener.send(ask)
    };
    // One at a time, each member on a runtime of its own: what a routed ask costs a process
    // that is not also running the members (interleaved in blocks of 20, as above).
    let (mut ours, mut theirs) = (Vec::new(), Vec::new());
    for block in 0..sizes.requests.div_ceil(20) {
        for side in [block % 2, 1 - block % 2] {
            for i in block * 20..(block + 1) * 20 {
                let t = Instant::now();
                if side == 0 {
                    echo(i).await??;
                    theirs.push(t.elapsed());
                } else {
                    fleet
                        .ask(&keys[i % keys.len()], b"m".to_vec(), timeout)
                        .await?;
                    ours.push(t.elapsed());
                }
            }
        }
    }
    let (ours, theirs) = (Samples::new(ours), Samples::new(theirs));
    let p50 = report.time(
        "routed ask, members on runtimes of their own, p50 (floor: request/reply to an echo on the same runtimes)",
        ours.p(0.5),
        theirs.p(0.5),
    );
    report.time(
        "routed ask, members on runtimes of their own, p99",
        ours.p(0.99),
        theirs.p(0.99),
    );
    report.target(
        "routed ask p50, members on runtimes of their own: at most 1.2× the request/reply round trip",
        format!("{p50:.3}×"),
        p50 <= 1.2,
    );
    #[derive(Clone, Copy)]
    enum Send {
        Ask,
        Tell,
        Floor,
    }
    let rate = async |how: Send| -> Res<f64> {
        let t = Instant::now();
        let loops = (0..64).map(|l| {
            let (fleet, keys, echo) = (fleet.clone(), &keys, &echo);
            async move {
                for i in l * per..(l + 1) * per {
                    let key = &keys[i % keys.len()];
                    match how {
                        Send::Ask => drop(fleet.ask(key, b"m".to_vec(), timeout).await?),
                        Send::Tell => fleet.tell(key, b"m".to_vec(), timeout).await?,
                        Send::Floor => drop(echo(i).await??),
                    }
                }
                Ok::<(), Box<dyn std::error::Error>>(())
            }
        });
        for done in futures_util::future::join_all(loops).await {
            done?;
        }
        Ok((per * 64) as f64 / t.elapsed().as_secs_f64())
    };
    let (mut asks, mut tells, mut floor) = (0f64, 0f64, 0f64);
    for _ in 0..2 {
        floor = floor.max(rate(Send::Floor).await?);
        asks = asks.max(rate(Send::Ask).await?);
        tells = tells.max(rate(Send::Tell).await?);
    }
    report.rate(
        "routed asks/s, 64 senders, 1,000 keys over three members on threads of their own (floor: request/reply to them, 64 senders)",
        asks,
        floor,
        "msgs/s",
    );
    report.rate(
        "routed tells/s, the same (floor: the same request/reply)",
        tells,
        floor,
        "msgs/s",
    );
    for (thread, stop, _) in members {
        drop(stop);
        let _ = tokio::task::spawn_blocking(move || thread.join()).await;
    }
    Ok(())
}

/// A member of pool "fleet" on a thread and actix System of its own, as another process would
/// be, serving an echo on `echo` beside it. Ready when it says so; stops (its pool shut down)
/// when the sender is dropped.
fn member_thread(
    config: Config,
    keys: Vec<String>,
    echo: String,
) -> (
    std::thread::JoinHandle<()>,
    tokio::sync::oneshot::Sender<()>,
    std::sync::mpsc::Receiver<()>,
) {
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let (ready, is_ready) = std::sync::mpsc::channel();
    let thread = std::thread::spawn(move || {
        actix_rt::System::new().block_on(async move {
            let locks = LockManager::new(config.clone()).start();
            let listener = ListenerActor::new(config.clone(), None).start_supervised();
            let _ = listener
                .send(Serve::new(echo, |p| async move { Ok(p) }))
                .await;
            // Nobody reads these arrivals.
            let (handled, _) = tokio::sync::mpsc::unbounded_channel();
            let echo = move |_: WorkerKey| Echo(handled.clone());
            let pool = WorkerPool::new(&config, locks, "fleet", keys, echo)
                .routed(listener)
                .start();
            let _ = ready.send(());
            let _ = stopped.await;
            let _ = pool.send(Shutdown).await;
        });
    });
    (thread, stop, is_ready)
}
