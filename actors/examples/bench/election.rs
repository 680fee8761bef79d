//! Elections: the handover when a leader resigns, and how long an observer takes to hear of a
//! new value, each against its raw floor measured in the same run.

use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use pgcoord::lease::{AcquireRequest, Attempt, ReleaseRequest};
use pgcoord::{Config, LeaseTable};
use pgcoord_actors::{Coordinator, LeaderChanged};
use tokio::sync::mpsc;

use crate::Sizes;
use crate::leases::{Res, floor, floor_clients};
use crate::report::{Report, Samples};

/// Forwards the time each change arrives, with its token and value.
struct Arrivals(mpsc::UnboundedSender<(Instant, i64, Vec<u8>)>);
impl Actor for Arrivals {
    type Context = Context<Self>;
}
impl Handler<LeaderChanged> for Arrivals {
    type Result = ();
    fn handle(&mut self, change: LeaderChanged, _: &mut Context<Self>) {
        if let Some(l) = change.leader {
            let _ = self.0.send((Instant::now(), l.token, l.value));
        }
    }
}

pub async fn run(pg: &tokio_postgres::Config, sizes: &Sizes, report: &mut Report) -> Res {
    let config = |owner: &str| {
        Config::builder()
            .pg_config(pg)
            .owner(owner)
            .lock_table("bench_elections")
            .build()
    };
    let admin_cfg = config("admin")?;
    let admin = pgcoord::db::connect_spawned(&admin_cfg).await?;
    pgcoord::schema::migrate(&admin, &admin_cfg).await?;
    let raw = floor_clients(&admin_cfg, 1).await?;
    let (_, pairs) = floor(&admin_cfg, &raw, sizes.requests).await?;
    let pairs = Samples::new(pairs);
    let pair = pairs.p(0.5);

    // Two candidates take turns: each resigns and campaigns again at once, so every term is a
    // handover. Timed from the resignation sent to the other's campaign returning (its grant
    // and its announcement).
    let (a, b) = (
        Coordinator::connect(config("a")?).await?,
        Coordinator::connect(config("b")?).await?,
    );
    let (tx, mut arrivals) = mpsc::unbounded_channel();
    let watcher = Coordinator::connect(config("watcher")?).await?;
    watcher
        .election("bench")?
        .observe(Arrivals(tx).start().recipient());
    let resigned = Arc::new(std::sync::Mutex::new(None::<Instant>));
    let terms = sizes.requests.max(20);
    let tasks: Vec<_> = [a, b]
        .into_iter()
        .map(|c| {
            let resigned = resigned.clone();
            actix_rt::spawn(async move {
                let election = c.election("bench").unwrap();
                let mut handovers = Vec::new();
                for _ in 0..terms / 2 {
                    let term = election.campaign("v", None).await.unwrap();
                    if let Some(at) = resigned.lock().unwrap().take() {
                        handovers.push(at.elapsed());
                    }
                    *resigned.lock().unwrap() = Some(Instant::now());
                    term.resign().await.unwrap();
                }
                handovers
            })
        })
        .collect();
    let mut handovers = Vec::new();
    for t in tasks {
        handovers.extend(t.await?);
    }
    let handovers = Samples::new(handovers);
    report.time("election handover: resign sent → next leader elected and announced, p50 (floor: one acquire+release)", handovers.p(0.5), pair);
    report.time("election handover p99", handovers.p(0.99), pairs.p(0.99));
    let raw = Samples::new(raw_handovers(&admin_cfg, terms).await?);
    report.time("election handover, p50 (floor: the same work in raw statements — a release that notifies, the NOTIFY heard, an acquire, a NOTIFY announcing it)", handovers.p(0.5), raw.p(0.5));
    report.time(
        "election handover p99 (floor: the raw statements')",
        handovers.p(0.99),
        raw.p(0.99),
    );

    // Observer latency: a proclaim sent → the observer told, against one raw NOTIFY → LISTEN hop
    // (the request/reply floor's one way).
    while arrivals.try_recv().is_ok() {}
    let mut term = watcher.election("bench")?.campaign("p", None).await?;
    while arrivals
        .recv()
        .await
        .is_some_and(|(_, t, _)| t != term.token())
    {}
    let mut heard = Vec::new();
    for i in 0..sizes.requests.max(20) {
        let value = format!("v{i}").into_bytes();
        let sent = Instant::now();
        term.proclaim(value.clone()).await?;
        loop {
            let (at, _, v) = arrivals.recv().await.expect("observer");
            if v == value {
                heard.push(at - sent);
                break;
            }
        }
    }
    term.resign().await?;
    let heard = Samples::new(heard);
    report.note(
        "election observer: proclaim sent → observer told, p50 (one statement, one NOTIFY hop, one read of the table)",
        crate::report::ms(heard.p(0.5)),
    );
    Ok(())
}

/// The handover in raw statements on warm connections, with the coordinators above still
/// listening: a releases with a NOTIFY on the lease channel; a raw LISTEN connection hears it;
/// b acquires and sends the announcement's NOTIFY on the election channel.
async fn raw_handovers(cfg: &Config, terms: usize) -> Res<Vec<Duration>> {
    let table = LeaseTable::new(cfg);
    let clients = floor_clients(cfg, 2).await?;
    let (a, b) = (table.owner("raw-a")?, table.owner("raw-b")?);
    let lease_channel = cfg.lease_channel().quoted();
    let (_listening, mut heard) = crate::signals::raw_listener(cfg, &lease_channel).await?;
    let (announcer, connection) = pgcoord::__private::connect(cfg).await?;
    tokio::spawn(connection);
    let announce = announcer.prepare("SELECT pg_notify($1, $2)").await?;
    let election_channel = cfg.election_channel().as_str().to_owned();
    let request = AcquireRequest::new("raw-handover");
    let mut times = Vec::new();
    for _ in 0..terms {
        let Attempt::Granted(held) = a.try_acquire(&*clients[0], &request, cfg.lease()).await?
        else {
            return Err("the raw handover's lease is not free".into());
        };
        while heard.try_recv().is_ok() {}
        let started = Instant::now();
        let release = ReleaseRequest {
            name: "raw-handover",
            token: held.token,
            keep: false,
            announce_always: true,
        };
        a.release(&*clients[0], &release).await?;
        heard.recv().await.ok_or("the raw listener stopped")?;
        let Attempt::Granted(next) = b.try_acquire(&*clients[1], &request, cfg.lease()).await?
        else {
            return Err("the raw handover's lease was not free after its release".into());
        };
        announcer
            .query_one(&announce, &[&election_channel, &"raw"])
            .await?;
        times.push(started.elapsed());
        let release = ReleaseRequest {
            name: "raw-handover",
            token: next.token,
            keep: false,
            announce_always: false,
        };
        b.release(&*clients[1], &release).await?;
    }
    Ok(times)
}
