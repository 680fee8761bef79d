//! The live view's cost on the database: what open pages make it commit, measured as the
//! transactions committed on a database of its own (where nothing else runs) above what it
//! commits idle. A page here is what the page's script does: ask for `/snapshot` 0.8 s after
//! its last answer. One page, then five (looks are shared: the five cost about what one does).
//! Issue #49's target: at most 2 statements a second per open page.

use std::time::{Duration, Instant};

use pgcoord::Config;
use pgcoord::topic::Start;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::Sizes;
use crate::leases::Res;
use crate::report::Report;

pub async fn run(pg: &tokio_postgres::Config, sizes: &Sizes, report: &mut Report) -> Res {
    // The smoke run (`--quick`) checks the section runs: short windows, no wait for quiet.
    let quick = sizes.rounds <= 2;
    let window = Duration::from_secs(if quick { 3 } else { 30 });
    let database = "bench_view";
    let (admin, conn) = pg.connect(tokio_postgres::NoTls).await?;
    tokio::spawn(conn);
    // Two statements, as neither may run in a transaction block.
    let drop_it = format!("DROP DATABASE IF EXISTS {database} WITH (FORCE)");
    admin.batch_execute(&drop_it).await?;
    admin
        .batch_execute(&format!("CREATE DATABASE {database}"))
        .await?;
    let mut own_pg = pg.clone();
    own_pg.dbname(database);
    let config = Config::builder()
        .pg_config(&own_pg)
        .owner("bench-view")
        .build()?;
    let own = pgcoord::db::connect_spawned(&config).await?;
    pgcoord::schema::migrate(&own, &config).await?;
    // Something to show: 100 leases held, one with a waiter, a topic with a consumer behind.
    let leases = pgcoord::LeaseTable::new(&config);
    let holder = leases.owner("holder")?;
    for i in 0..100 {
        let name = format!("job-{i}");
        let request = pgcoord::lease::AcquireRequest::new(&name);
        holder
            .try_acquire(&own, &request, Duration::from_secs(600))
            .await?;
    }
    (leases.owner("waiter")?)
        .try_acquire_or_queue(
            &own,
            &pgcoord::lease::AcquireRequest::new("job-0"),
            Duration::from_secs(600),
            Duration::from_secs(600),
        )
        .await?;
    let topics = pgcoord::TopicTable::new(&config);
    topics
        .open_consumer(&own, "orders", "billing", Start::Oldest)
        .await?;
    for n in 0..10u32 {
        topics.append(&own, "orders", &n.to_be_bytes()).await?;
    }

    let quiet = quiet(&own, !quick).await?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let address = listener.local_addr()?;
    let view = pgcoord_ui::LiveView::new(&config);
    let served = tokio::spawn(view.serve(listener));
    for pages in [1usize, 5] {
        let stop = Instant::now() + window + Duration::from_secs(2);
        let asking: Vec<_> = (0..pages)
            .map(|_| tokio::spawn(page(address, stop)))
            .collect();
        // The first look (both parts) before the window opens.
        tokio::time::sleep(Duration::from_secs(1)).await;
        let before = commits(&own).await?;
        tokio::time::sleep(window).await;
        let after = commits(&own).await?;
        for page in asking {
            page.await?.map_err(|e| format!("a page: {e}"))?;
        }
        // The statement reading the counter is one of them.
        let all = (after - before - 1) as f64 / window.as_secs_f64();
        let per_page = (all - quiet).max(0.0) / pages as f64;
        report.note(
            &format!("live view: {pages} open page(s), transactions a second per page"),
            format!("{per_page:.2} ({all:.2} in all, {quiet:.2} idle)"),
        );
        if pages == 1 {
            report.target(
                "live view: statements a second per open page ≤ 2",
                format!("{per_page:.2}"),
                per_page <= 2.0,
            );
        }
    }
    served.abort();
    drop(own);
    admin.batch_execute(&drop_it).await?;
    Ok(())
}

/// A page: asks for a look 0.8 s after its last answer, until `stop`. Each ask is bounded (a
/// look answers within its own 2 s, or says it cannot look).
async fn page(address: std::net::SocketAddr, stop: Instant) -> Result<(), String> {
    while Instant::now() < stop {
        tokio::time::timeout(Duration::from_secs(10), ask(address))
            .await
            .map_err(|_| "no answer within 10 s".to_owned())??;
        tokio::time::sleep(Duration::from_millis(800)).await;
    }
    Ok(())
}

/// One `GET /snapshot`, which must answer 200.
async fn ask(address: std::net::SocketAddr) -> Result<(), String> {
    let mut stream = (tokio::net::TcpStream::connect(address).await).map_err(|e| e.to_string())?;
    let request = format!("GET /snapshot HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n");
    (stream.write_all(request.as_bytes()).await).map_err(|e| e.to_string())?;
    let mut answer = Vec::new();
    (stream.read_to_end(&mut answer).await).map_err(|e| e.to_string())?;
    if !answer.starts_with(b"HTTP/1.1 200") {
        return Err(String::from_utf8_lossy(&answer[..answer.len().min(200)]).into_owned());
    }
    Ok(())
}

async fn commits(client: &tokio_postgres::Client) -> Result<i64, tokio_postgres::Error> {
    let sql = "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()";
    Ok(client.query_one(sql, &[]).await?.get(0))
}

/// What the database commits idle, once its first autovacuum visit (a transaction per table)
/// is over: 5 s windows until one is under one a second (a minute at most), unless not
/// `patient` (one window).
async fn quiet(client: &tokio_postgres::Client, patient: bool) -> Res<f64> {
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        let before = commits(client).await?;
        tokio::time::sleep(Duration::from_secs(5)).await;
        let idle = (commits(client).await? - before - 1) as f64 / 5.0;
        if idle < 1.0 || !patient || Instant::now() > until {
            return Ok(idle);
        }
    }
}
