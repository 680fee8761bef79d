//! An axum service on pgcoord, under a plain `#[tokio::main]`: the runtime runs on a thread of
//! its own ([`pgcoord_actors::Runtime`]) and the handlers use its addresses.
//!
//! `POST /jobs/{name}` runs a job while holding the job's lease, fail-if-locked: a second run
//! of the same job, from this process or any other, answers 409 Conflict. The request's body,
//! if any, is how long the job works, in seconds (half a second by default). `GET /ready`
//! answers 200 while the runtime's actors answer. `GET /metrics` is pgcoord's metrics for
//! Prometheus (`metrics-exporter-prometheus`, its HELP text and units included).
//!
//! On SIGTERM (what systemd and Kubernetes send) or ctrl-c, and when the demo below is done, the
//! server stops taking requests and the runtime's shutdown releases every lease at once: another
//! process can take them over right away instead of waiting for them to expire.
//!
//! Run with `cargo run --example axum`. It uses `DATABASE_URL` when set, and otherwise starts a
//! throwaway PostgreSQL from the locally installed server binaries (removed on exit). The demo
//! makes its requests over real HTTP and exits non-zero if an answer is not the expected one.
//! With `-- --serve` it skips the demo and serves until SIGTERM or ctrl-c.

use std::time::Duration;

use axum::Router;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use pgcoord::Config;
use pgcoord_actors::{Acquire, Call, Coordinator, Runtime};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[path = "../common/stop_signal.rs"]
mod stop_signal;
use stop_signal::StopSignal;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // First of all: from here on SIGTERM and ctrl-c stop the service the orderly way below,
    // instead of killing the process with its leases held until they expire.
    let mut stop_signal = StopSignal::install()?;
    let serve = std::env::args().skip(1).any(|arg| arg == "--serve");
    let (_server, pg) = pgcoord_testkit::from_env_or_start()?;
    let config = Config::builder()
        .pg_config(&pg)
        .owner("axum-demo")
        .build()?;
    pgcoord::schema::migrate(&pgcoord::db::connect_spawned(&config).await?, &config).await?;

    // Before the actors start: they register their metrics with the recorder installed then.
    // Latencies as histograms with pgcoord's buckets (without buckets, the exporter renders
    // summaries, which cannot be added up across instances).
    let mut prometheus = metrics_exporter_prometheus::PrometheusBuilder::new();
    for (name, buckets) in pgcoord_actors::metrics::BUCKETS {
        let name = metrics_exporter_prometheus::Matcher::Full(name.to_string());
        prometheus = prometheus.set_buckets_for_metric(name, buckets)?;
    }
    let prometheus = prometheus.install_recorder()?;
    let runtime = Runtime::connect(config).await?;
    let app = Router::new()
        .route("/jobs/{name}", post(run_job))
        .route("/ready", get(ready))
        .route("/metrics", get(move || async move { prometheus.render() }))
        .with_state(runtime.coordinator().clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let address = listener.local_addr()?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(
        axum::serve(listener, app)
            .with_graceful_shutdown(async {
                let _ = stopped.await;
            })
            .into_future(),
    );
    println!("serving on http://{address}");

    let outcome = tokio::select! {
        outcome = demo(address), if !serve => outcome,
        signal = stop_signal.received() => {
            println!("{signal}: stopping");
            Ok(())
        }
    };
    // Stop taking requests, then release every lease at once. A job still running loses its
    // lease (its fenced writes fail from then on) rather than keep it past this process.
    let _ = stop.send(());
    let released = runtime.shutdown(Duration::from_secs(5)).await?;
    println!("stopped; {released} leases released at shutdown");
    // Requests under way get a moment to answer; the process does not wait on them longer.
    match tokio::time::timeout(Duration::from_secs(5), server).await {
        Ok(served) => served??,
        Err(_) => eprintln!("requests still under way after 5 s; leaving them"),
    }
    outcome
}

/// The demo: ready; one run of the nightly job; a second run at the same time refused.
async fn demo(address: std::net::SocketAddr) -> Result<(), Box<dyn std::error::Error>> {
    // Not ready until the listener has confirmed its LISTENs: a load balancer waits for it.
    let started = std::time::Instant::now();
    while request(address, "GET", "/ready").await? != 200 {
        if started.elapsed() > Duration::from_secs(10) {
            return Err("never ready".into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    println!("ready after {:?}", started.elapsed());
    let first = tokio::spawn(request(address, "POST", "/jobs/nightly"));
    tokio::time::sleep(Duration::from_millis(100)).await;
    let second = request(address, "POST", "/jobs/nightly").await?;
    expect(second, 409, "a second run while the first holds the lease")?;
    expect(first.await??, 200, "the first run")?;
    expect(
        request(address, "POST", "/jobs/nightly").await?,
        200,
        "a run after it",
    )?;
    // What Prometheus scrapes: the two grants, described (the refusal was this process's own
    // lease: `AlreadyHeld`, answered before any statement).
    let metrics = get_text(address, "/metrics").await?;
    for line in [
        "# HELP pgcoord_acquires_total",
        "pgcoord_acquires_total{outcome=\"granted\"} 2",
        "pgcoord_listener_connected 1",
        "# TYPE pgcoord_acquire_wait_seconds histogram",
        "pgcoord_acquire_wait_seconds_bucket{le=\"0.001\"}",
        "pgcoord_losses_total{kind=\"lease\",reason=\"deadline_passed\"} 0",
    ] {
        if !metrics.lines().any(|l| l.starts_with(line)) {
            return Err(format!("/metrics has no line {line:?}:\n{metrics}").into());
        }
    }
    println!("/metrics: {} lines", metrics.lines().count());
    Ok(())
}

/// Runs the job `name` while holding its lease: 409 when another run holds it. The body, if any,
/// is how long the job works, in seconds.
async fn run_job(
    State(coordinator): State<Coordinator>,
    Path(name): Path<String>,
    body: String,
) -> StatusCode {
    let work = match body.trim() {
        "" => Duration::from_millis(500),
        seconds => match seconds
            .parse()
            .ok()
            .and_then(|s| Duration::try_from_secs_f64(s).ok())
        {
            Some(work) => work,
            None => return StatusCode::BAD_REQUEST,
        },
    };
    let lease = match coordinator
        .locks()
        .unwrap()
        .call(Acquire::new(format!("job:{name}")).fail_if_locked())
        .await
    {
        Ok(lease) => lease,
        // Held by another process, or by this one (leases do not stack in one process).
        Err(e) if e.is_not_acquired() || e.kind() == pgcoord::ErrorKind::AlreadyHeld => {
            return StatusCode::CONFLICT;
        }
        Err(e) => {
            eprintln!("job {name}: {e}");
            return StatusCode::SERVICE_UNAVAILABLE;
        }
    };
    // The work; its writes would be fenced with `lease.fence(&tx)`.
    // The work stops when the lease is lost: released by a shutdown, or taken over.
    tokio::select! {
        () = tokio::time::sleep(work) => {}
        Some(reason) = lease.lost() => {
            eprintln!("job {name}: lease lost ({reason:?}); stopped");
            return StatusCode::SERVICE_UNAVAILABLE;
        }
    }
    match lease.release().await {
        Ok(()) => StatusCode::OK,
        // Lost while working: the work must not count.
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// 200 while pgcoord is ready (listening, renewing, the database answering), asked with a
/// one-second bound; 503 with what is not well otherwise.
async fn ready(State(coordinator): State<Coordinator>) -> (StatusCode, String) {
    let health = coordinator.health(Duration::from_secs(1)).await;
    if health.is_ready() {
        (StatusCode::OK, "ready".into())
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, format!("{health:?}"))
    }
}

/// One HTTP/1.1 request over a new connection; the status code of its answer.
async fn request(address: std::net::SocketAddr, method: &str, path: &str) -> std::io::Result<u16> {
    let mut stream = tokio::net::TcpStream::connect(address).await?;
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {address}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).await?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await?;
    // "HTTP/1.1 200 OK"
    (answer.split(' ').nth(1))
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("not an HTTP answer: {answer:?}")))
}

/// The body of a GET of `path`.
async fn get_text(address: std::net::SocketAddr, path: &str) -> std::io::Result<String> {
    let mut stream = tokio::net::TcpStream::connect(address).await?;
    let head = format!("GET {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n");
    stream.write_all(head.as_bytes()).await?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await?;
    let (_, body) = answer
        .split_once("\r\n\r\n")
        .ok_or_else(|| std::io::Error::other("no body"))?;
    Ok(body.to_owned())
}

fn expect(status: u16, expected: u16, what: &str) -> Result<(), Box<dyn std::error::Error>> {
    println!("{what}: {status}");
    if status != expected {
        return Err(format!("{what}: answered {status}, expected {expected}").into());
    }
    Ok(())
}
