//! The application of the `actix_web` example, shared with its test (`tests/it/actix_web.rs`):
//! an actix-web service whose instances keep a local cache, invalidate it everywhere with one
//! event, and run a background job on whichever instance is elected leader.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix::prelude::*;
use actix_web::{App, HttpResponse, HttpServer, dev::ServerHandle, web};
use pgcoord::Config;
use pgcoord_actors::{Coordinator, Publish, Signal, Subscribe};

/// One instance's state.
#[derive(Clone)]
pub struct Instance {
    pub name: String,
    pub coordinator: Coordinator,
    cache: Arc<Mutex<HashMap<String, String>>>,
    pub leading: Arc<AtomicBool>,
    pub job_runs: Arc<AtomicU64>,
    /// The task campaigning for the job and running it, and what ends it (`stop_campaign`).
    campaign: Arc<Mutex<Option<actix_rt::task::JoinHandle<()>>>>,
    stopping: Arc<tokio::sync::watch::Sender<bool>>,
}

/// Removes invalidated keys from the local cache.
struct Invalidator(Arc<Mutex<HashMap<String, String>>>);
impl Actor for Invalidator {
    type Context = Context<Self>;
}
impl Handler<Signal> for Invalidator {
    type Result = ();
    fn handle(&mut self, signal: Signal, _: &mut Context<Self>) {
        let key = String::from_utf8_lossy(&signal.payload).into_owned();
        self.0.lock().unwrap().remove(&key);
    }
}

async fn put(state: web::Data<Instance>, key: web::Path<String>, body: String) -> HttpResponse {
    state.cache.lock().unwrap().insert(key.into_inner(), body);
    HttpResponse::NoContent().finish()
}

async fn get(state: web::Data<Instance>, key: web::Path<String>) -> HttpResponse {
    match state.cache.lock().unwrap().get(key.as_str()) {
        Some(value) => HttpResponse::Ok().body(value.clone()),
        None => HttpResponse::NotFound().finish(),
    }
}

/// Tells every instance (this one too) to drop `key`.
async fn invalidate(state: web::Data<Instance>, key: web::Path<String>) -> HttpResponse {
    let publish = Publish::new("cache_invalidate", key.into_inner().into_bytes());
    match state.coordinator.publish(publish).await {
        Ok(()) => HttpResponse::Accepted().finish(),
        Err(e) => HttpResponse::ServiceUnavailable().body(e.to_string()),
    }
}

async fn status(state: web::Data<Instance>) -> HttpResponse {
    HttpResponse::Ok().json(serde_json::json!({
        "instance": state.name,
        "leading": state.leading.load(Ordering::SeqCst),
        "job_runs": state.job_runs.load(Ordering::SeqCst),
    }))
}

/// Starts an instance on a free port: its coordinator, cache subscription, leader-elected job
/// and HTTP server. Returns its state, address and server handle.
pub async fn start(
    config: Config,
    name: &str,
) -> std::io::Result<(Instance, String, ServerHandle)> {
    let coordinator = Coordinator::connect(config)
        .await
        .map_err(std::io::Error::other)?;
    let cache = Arc::new(Mutex::new(HashMap::new()));
    let recipient = Invalidator(cache.clone()).start().recipient();
    let subscribe = Subscribe::new("cache_invalidate", recipient);
    coordinator
        .signals()
        .unwrap()
        .send(subscribe)
        .await
        .unwrap()
        .map_err(std::io::Error::other)?;
    let instance = Instance {
        name: name.to_owned(),
        coordinator,
        cache,
        leading: Arc::default(),
        job_runs: Arc::default(),
        campaign: Arc::default(),
        stopping: Arc::new(tokio::sync::watch::Sender::new(false)),
    };
    // The background job runs only while this instance leads, until `stop`.
    let job = instance.clone();
    let mut stopping = instance.stopping.subscribe();
    let campaign = actix_rt::spawn(async move {
        let election = job.coordinator.election("background_job").unwrap();
        loop {
            // Stopping, a candidate withdraws (the campaign dropped).
            let term = tokio::select! {
                term = election.campaign(job.name.clone(), None) => term,
                _ = stopping.wait_for(|stop| *stop) => return,
            };
            let Ok(term) = term else { return };
            job.leading.store(true, Ordering::SeqCst);
            let lost = term.lost();
            tokio::pin!(lost);
            loop {
                tokio::select! {
                    _ = &mut lost => break,
                    _ = stopping.wait_for(|stop| *stop) => {
                        // The next leader takes over at once. Awaited: dropped, the term
                        // would be resigned in the background, and perhaps not before the
                        // process ends.
                        let _ = term.resign().await;
                        job.leading.store(false, Ordering::SeqCst);
                        return;
                    }
                    _ = tokio::time::sleep(Duration::from_millis(20)) => {
                        job.job_runs.fetch_add(1, Ordering::SeqCst);
                    }
                }
            }
            job.leading.store(false, Ordering::SeqCst);
        }
    });
    *instance.campaign.lock().unwrap() = Some(campaign);
    let state = web::Data::new(instance.clone());
    let server = HttpServer::new(move || {
        App::new()
            .app_data(state.clone())
            .route("/cache/{key}", web::put().to(put))
            .route("/cache/{key}", web::get().to(get))
            .route("/invalidate/{key}", web::post().to(invalidate))
            .route("/status", web::get().to(status))
    })
    .workers(1)
    // The application decides what SIGTERM and ctrl-c do (stop pgcoord too: `stop`), not the
    // server on its own.
    .disable_signals()
    // Requests under way get five seconds to answer when it stops: pgcoord's shutdown, and with
    // it the release of the leases, waits that long at most.
    .shutdown_timeout(5)
    .bind(("127.0.0.1", 0))?;
    let address = format!("http://{}", server.addrs()[0]);
    let server = server.run();
    let handle = server.handle();
    actix_rt::spawn(server);
    Ok((instance, address, handle))
}

/// Ends an instance's campaign: it resigns the term it holds, or withdraws its candidacy. A
/// candidate still in the running while pgcoord stops could be elected then, and the process
/// end before that term is released.
async fn stop_campaign(instance: &Instance) {
    let _ = instance.stopping.send(true);
    let campaign = instance.campaign.lock().unwrap().take();
    if let Some(campaign) = campaign {
        // A resignation's statement has bounds of its own; this one is the process's.
        let _ = tokio::time::timeout(Duration::from_secs(5), campaign).await;
    }
}

/// Stops an instance gracefully, as a service does on SIGTERM: its campaign, its HTTP server,
/// then pgcoord, whose leases are released at once rather than left to expire.
pub async fn stop(instance: &Instance, server: ServerHandle) {
    stop_campaign(instance).await;
    server.stop(true).await;
    if let Err(e) = instance.coordinator.shutdown(Duration::from_secs(5)).await {
        eprintln!("{}: {e}", instance.name);
    }
}
