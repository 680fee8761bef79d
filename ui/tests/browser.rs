//! The live view in a real browser: headless Chromium driven through chromedriver (WebDriver),
//! against `LiveView` served on loopback and a coordinator that holds a lease, runs a durable
//! topic's consumer and a schedule. Screenshots go to the test's output folder.

use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fantoccini::{Client, ClientBuilder};
use pgcoord::schedule::Timing;
use pgcoord::{Config, ConfigBuilder};
use pgcoord_actors::{Acquire, Call, Consume, Delivery, Runtime, Schedule, TaskPool};
use pgcoord_testkit::{find_program, require, test_pg_config, unique_name};
use tokio::sync::Semaphore;

/// The operator's token of the views that act.
const TOKEN: &str = "a-token-of-the-operators-7c1e";

/// The chromedriver process and the session it drives; both ended on drop.
struct Browser {
    client: Client,
    driver: Child,
}

impl Drop for Browser {
    fn drop(&mut self) {
        // The driver and the browser it started share a process group of their own: all of it
        // goes, even when the test panicked before closing the session.
        // SAFETY: kill(2) with a process group id and a signal number; no memory is involved.
        unsafe { libc::kill(-(self.driver.id() as i32), libc::SIGKILL) };
        let _ = self.driver.wait();
    }
}

/// Headless Chromium through Debian's chromedriver, or `None` (skipped) where it is missing.
async fn browser() -> Option<Browser> {
    let driver = require(
        find_program("chromedriver"),
        "chromedriver",
        "chromium-driver",
    )?;
    let chromium = require(find_program("chromium"), "chromium", "chromium")?;
    let port = {
        let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        probe.local_addr().unwrap().port()
    };
    let driver = Command::new(driver)
        .process_group(0)
        .arg(format!("--port={port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start chromedriver");
    let mut capabilities = serde_json::Map::new();
    capabilities.insert(
        "goog:chromeOptions".into(),
        serde_json::json!({
            "binary": chromium,
            // Root in CI: no sandbox. A fixed window, for comparable screenshots.
            "args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                     "--disable-dev-shm-usage", "--window-size=1280,1400"],
        }),
    );
    let url = format!("http://127.0.0.1:{port}");
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let connector = hyper_util::client::legacy::connect::HttpConnector::new();
        match ClientBuilder::new(connector)
            .capabilities(capabilities.clone())
            .connect(&url)
            .await
        {
            Ok(client) => return Some(Browser { client, driver }),
            Err(e) if Instant::now() < until => {
                let _ = e;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("no WebDriver session within 30 s: {e}"),
        }
    }
}

/// Fresh tables for one test, migrated.
fn builder(pg: &tokio_postgres::Config, table: &str, owner: &str) -> ConfigBuilder {
    Config::builder()
        .pg_config(pg)
        .lock_table(table)
        .payload_table(format!("{table}_p"))
        .topic_table(format!("{table}_t"))
        .schedule_table(format!("{table}_s"))
        .owner(owner)
        .lease(Duration::from_secs(10))
}

/// Migrates fresh tables named `table` on `pg` for a viewer; its config and an admin client.
async fn fresh_tables(
    pg: &tokio_postgres::Config,
    table: &str,
) -> (Config, tokio_postgres::Client) {
    let config = builder(pg, table, "viewer").build().unwrap();
    let admin = pgcoord::db::connect_spawned(&config).await.unwrap();
    pgcoord::schema::migrate(&admin, &config).await.unwrap();
    (config, admin)
}

/// Serves `view` on a free loopback port; its address.
async fn serve(view: pgcoord_ui::LiveView) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(view.serve(listener));
    address
}

/// Where the screenshots go.
fn screenshots() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("live-view");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Waits (at most `within`) until the text of the first element `css` matches satisfies `ok`;
/// how long it took.
async fn until_text(
    client: &Client,
    css: &str,
    within: Duration,
    ok: impl Fn(&str) -> bool,
) -> Duration {
    let start = Instant::now();
    let mut last = String::new();
    while start.elapsed() < within {
        // Read in one script: the page draws its tables anew every second.
        let script = "const e = document.querySelector(arguments[0]); \
                      return e ? e.innerText : null;";
        let text = client.execute(script, vec![css.into()]).await.unwrap();
        last = text.as_str().unwrap_or_default().to_owned();
        if ok(&last) {
            return start.elapsed();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{css}: {last:?} after {within:?}");
}

/// The y coordinates of the chart's line for `consumer`, oldest first (read in one script: the
/// page draws the chart anew every second).
async fn chart_ys(client: &Client, consumer: &str) -> Vec<f64> {
    let css = format!("#lag-chart polyline[data-consumer='{consumer}']");
    let script = "const l = document.querySelector(arguments[0]); \
                  return l ? l.getAttribute('points') : null;";
    let points = client.execute(script, vec![css.into()]).await.unwrap();
    let points = points.as_str().expect("the consumer's line").to_owned();
    (points.split_whitespace())
        .map(|p| p.split(',').nth(1).unwrap().parse().unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_shows_leases_lag_and_schedules_live_and_no_password() {
    let Some(browser) = browser().await else {
        return;
    };
    let client = &browser.client;
    let mut pg = test_pg_config().unwrap();
    // A password the server does not ask for (the test cluster trusts loopback), so that the
    // page can be searched for it.
    if pg.get_password().is_none() {
        pg.password("ui-test-secret-7f3a");
    }
    let password = String::from_utf8(pg.get_password().unwrap().to_vec()).unwrap();
    let table = unique_name("ui");
    let (config, admin) = fresh_tables(&pg, &table).await;

    let address = serve(pgcoord_ui::LiveView::new(&config)).await;
    client.goto(&format!("http://{address}/")).await.unwrap();
    until_text(client, "#status", Duration::from_secs(10), |t| {
        t.starts_with("updated")
    })
    .await;

    // A lease taken after the page opened is on it within 2 s (the page asks every second).
    let runtime = Runtime::connect(builder(&pg, &table, "worker-a").build().unwrap())
        .await
        .unwrap();
    let coordinator = runtime.coordinator().clone();
    let name = unique_name("nightly");
    let lease = coordinator
        .locks()
        .unwrap()
        .call(Acquire::new(&name).data(b"batch 42".to_vec()))
        .await
        .unwrap();
    let row = format!("#leases tr[data-name='{name}']");
    let shown = until_text(client, &row, Duration::from_secs(2), |t| {
        t.contains("worker-a") && t.contains("batch 42")
    })
    .await;
    eprintln!("a new lease shown after {shown:?}");

    // Another process waits for it: its place in line is on the lease's row. Released, the lease
    // goes to it, and the row shows both terms, the first first.
    let other = Runtime::connect(builder(&pg, &table, "worker-b").build().unwrap())
        .await
        .unwrap();
    let wait = Acquire::new(&name).timeout(Duration::from_secs(60));
    let waiting = tokio::spawn(other.coordinator().locks().unwrap().call(wait));
    until_text(client, &row, Duration::from_secs(10), |t| {
        t.contains("worker-b") && t.contains("waiting")
    })
    .await;
    let first = format!("{} worker-a from", lease.token());
    lease.release().await.unwrap();
    let lease = waiting.await.unwrap().unwrap();
    let second = format!("{} worker-b from", lease.token());
    let terms = until_text(client, &row, Duration::from_secs(2), |t| {
        t.find(&first)
            .zip(t.find(&second))
            .is_some_and(|(a, b)| a < b)
    })
    .await;
    eprintln!("the new term shown after {terms:?}");

    // A consumer stalled on its first event: its lag rises on the page and in the chart.
    let topic = unique_name("orders");
    // No permit until resumed: the handler waits in its first event.
    let gate = Arc::new(Semaphore::new(0));
    let permits = gate.clone();
    let consume = Consume::new(&topic, "billing", move |_: Delivery| {
        let permits = permits.clone();
        async move {
            permits.acquire().await.unwrap().forget();
            Ok(())
        }
    })
    .poll(Duration::from_millis(200));
    let _consumer = coordinator.consume(consume).unwrap();
    for n in 0..10u32 {
        coordinator.append_value(&topic, &n).await.unwrap();
    }
    let consumer = format!("{topic}/billing");
    let lag_cell = format!("#consumers tr[data-consumer='{consumer}'] td.lag");
    // Topics and schedules are in the look's slow part, read every fifteen seconds.
    until_text(client, &lag_cell, Duration::from_secs(35), |t| t == "10").await;
    // A few samples at 10 for the chart, then a picture of the stalled consumer.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let high = chart_ys(client, &consumer).await;
    let png = client.screenshot().await.unwrap();
    std::fs::write(screenshots().join("lagging.png"), png).unwrap();

    // Resumed, it catches up: the lag falls to 0, and the chart's line comes down.
    gate.add_permits(10);
    until_text(client, &lag_cell, Duration::from_secs(35), |t| t == "0").await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = chart_ys(client, &consumer).await;
    let baseline = after.iter().cloned().fold(f64::MIN, f64::max);
    let top = high.iter().cloned().fold(f64::MAX, f64::min);
    assert!(top < baseline, "the chart rose while it lagged: {high:?}");
    assert_eq!(
        *after.last().unwrap(),
        baseline,
        "and is back down: {after:?}"
    );

    // A schedule's last run.
    let every = Timing::every(Duration::from_millis(300)).unwrap();
    let rollup = unique_name("rollup");
    let schedule = Schedule::new(&rollup, every, |_| async { Ok(()) });
    let _runner = coordinator.schedule(schedule).unwrap();
    let run = format!("#schedules tr[data-schedule='{rollup}']");
    until_text(client, &run, Duration::from_secs(35), |t| {
        t.contains("done")
    })
    .await;

    // Also in the slow part: a stored limit with one of its permits held, an advisory lock held
    // by a session, and the sessions, the runtime's listener among them.
    let table_of = pgcoord::LeaseTable::new(&config);
    let semaphore = unique_name("uploads");
    table_of.set_limit(&admin, &semaphore, 2).await.unwrap();
    let slot = format!("{semaphore}#0");
    (table_of.owner("worker-a").unwrap())
        .try_acquire(
            &admin,
            &pgcoord::lease::AcquireRequest::new(&slot),
            Duration::from_secs(60),
        )
        .await
        .unwrap();
    let key = pgcoord::advisory::key_for_name(&semaphore);
    admin
        .execute("SELECT pg_advisory_lock($1)", &[&key])
        .await
        .unwrap();
    let limit_row = format!("#limits tr[data-limit='{semaphore}']");
    let in_use = format!("{limit_row} td.in-use");
    until_text(client, &in_use, Duration::from_secs(35), |t| t == "1").await;
    let advisory_row = format!("#advisory tr[data-key='{key}']");
    until_text(client, &advisory_row, Duration::from_secs(35), |t| {
        t.contains("held")
    })
    .await;
    let listener = "#sessions tr[data-application$=' listener']";
    until_text(client, listener, Duration::from_secs(2), |t| {
        t.contains("idle")
    })
    .await;
    let owner_row = "#holders tr[data-owner='worker-a']";
    until_text(client, owner_row, Duration::from_secs(2), |_| true).await;
    admin
        .execute("SELECT pg_advisory_unlock($1)", &[&key])
        .await
        .unwrap();
    let png = client.screenshot().await.unwrap();
    std::fs::write(screenshots().join("live-view.png"), png).unwrap();

    // No secret anywhere: not on the page, not in what it reads.
    let page = client.source().await.unwrap();
    assert!(page.contains(&name), "the page is the one looked at");
    assert!(!page.contains(&password), "the password is on the page");
    client
        .goto(&format!("http://{address}/snapshot"))
        .await
        .unwrap();
    let snapshot = client.source().await.unwrap();
    assert!(snapshot.contains(&name));
    assert!(
        !snapshot.contains(&password),
        "the password is in the snapshot"
    );

    lease.release().await.unwrap();
    other.shutdown(Duration::from_secs(5)).await.unwrap();
    runtime.shutdown(Duration::from_secs(5)).await.unwrap();
    // What an open page costs the database is the benchmark's (`--only view`).
}

/// Clicks the button `css` (drawn anew every second: found again until the click lands) and
/// accepts the confirmation it asks for.
async fn click_and_confirm(client: &Client, css: &str) {
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let clicked = match client.find(fantoccini::Locator::Css(css)).await {
            Ok(button) => button.click().await.is_ok(),
            Err(_) => false,
        };
        if clicked {
            break;
        }
        assert!(
            Instant::now() < until,
            "{css}: no button to click within 10 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    client.accept_alert().await.expect("a confirmation");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn actions_are_refused_without_the_token_and_take_effect_with_it() {
    let Some(browser) = browser().await else {
        return;
    };
    let client = &browser.client;
    let pg = test_pg_config().unwrap();
    let table = unique_name("ui");
    let (config, admin) = fresh_tables(&pg, &table).await;
    let view = pgcoord_ui::LiveView::new(&config)
        .allow_actions(TOKEN)
        .unwrap();
    let address = serve(view).await;

    let runtime = Runtime::connect(builder(&pg, &table, "worker-a").build().unwrap())
        .await
        .unwrap();
    let name = unique_name("leader");
    let lease = (runtime.coordinator().locks().unwrap())
        .call(Acquire::new(&name))
        .await
        .unwrap();
    client.goto(&format!("http://{address}/")).await.unwrap();
    let release = format!("#leases tr[data-name='{name}'] button[data-action='release']");
    let resign = format!("#leases tr[data-name='{name}'] button[data-action='resign']");
    let result = "#action-result";

    // No token entered: refused, and the lease still held.
    click_and_confirm(client, &release).await;
    until_text(client, result, Duration::from_secs(5), |t| {
        t.contains("refused: no token")
    })
    .await;
    // A wrong one: refused too.
    let field = client
        .find(fantoccini::Locator::Css("#token"))
        .await
        .unwrap();
    field.send_keys("not-the-operators-token").await.unwrap();
    click_and_confirm(client, &release).await;
    until_text(client, result, Duration::from_secs(5), |t| {
        t.contains("refused: wrong token")
    })
    .await;
    let table_of = pgcoord::LeaseTable::new(&config);
    let held = table_of.get(&admin, &name).await.unwrap();
    assert_eq!(held.token, Some(lease.token()), "refused, yet acted on");
    assert!(held.is_held());

    // With it: the leader is asked to resign (its term sees the request), then the lease is
    // released, naming the token it ends.
    field.clear().await.unwrap();
    field.send_keys(TOKEN).await.unwrap();
    click_and_confirm(client, &resign).await;
    until_text(client, result, Duration::from_secs(5), |t| {
        t.contains("asked the leader")
    })
    .await;
    let asked = table_of
        .owner("worker-a")
        .unwrap()
        .resign_requested(&admin, &name, lease.token())
        .await
        .unwrap();
    assert!(asked, "the resignation was not recorded");
    click_and_confirm(client, &release).await;
    until_text(client, result, Duration::from_secs(5), |t| {
        t.contains("released") && t.contains(&format!("token {}", lease.token()))
    })
    .await;
    // Released, the row goes (nobody waits for it).
    let freed = table_of.get(&admin, &name).await;
    assert!(
        freed
            .as_ref()
            .is_err_and(|e| e.kind() == pgcoord::ErrorKind::NotFound),
        "not released: {freed:?}"
    );
    // Its holder learns at its next renewal.
    let lost = tokio::time::timeout(Duration::from_secs(15), lease.lost()).await;
    assert!(lost.expect("the holder told within 15 s").is_some());
    let png = client.screenshot().await.unwrap();
    std::fs::write(screenshots().join("actions.png"), png).unwrap();

    // A request from another site, token and all: refused (a browser sends these headers).
    let forged = cross_site_post(&address, &name, TOKEN).await;
    assert!(forged.starts_with("HTTP/1.1 403"), "{forged}");
    runtime.shutdown(Duration::from_secs(5)).await.unwrap();
}

/// A POST as another site's page would send it (its `Origin` and `Sec-Fetch-Site`), with the
/// token: the status line and body.
async fn cross_site_post(address: &std::net::SocketAddr, name: &str, token: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let body = serde_json::json!({ "name": name, "token": 1 }).to_string();
    let request = format!(
        "POST /actions/release HTTP/1.1\r\nHost: {address}\r\nOrigin: https://elsewhere.example\r\n\
         Sec-Fetch-Site: cross-site\r\nContent-Type: application/json\r\n\
         Authorization: Bearer {token}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.unwrap();
    answer
}

/// A pool of four keys whose workers wait until their key moves.
fn four_keys(name: &str) -> TaskPool {
    let keys = (0..4).map(|k| format!("k{k}")).collect();
    TaskPool::new(name, keys, |_| std::future::pending::<()>())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drained_members_keys_move_on_the_page() {
    let Some(browser) = browser().await else {
        return;
    };
    let client = &browser.client;
    let pg = test_pg_config().unwrap();
    let table = unique_name("ui");
    let (config, _admin) = fresh_tables(&pg, &table).await;
    let view = pgcoord_ui::LiveView::new(&config)
        .allow_actions(TOKEN)
        .unwrap();
    let address = serve(view).await;

    let a = Runtime::connect(builder(&pg, &table, "member-a").build().unwrap())
        .await
        .unwrap();
    let b = Runtime::connect(builder(&pg, &table, "member-b").build().unwrap())
        .await
        .unwrap();
    let pool = unique_name("shards");
    let in_a = a.coordinator().run_tasks(four_keys(&pool)).unwrap();
    let in_b = b.coordinator().run_tasks(four_keys(&pool)).unwrap();
    client.goto(&format!("http://{address}/")).await.unwrap();
    let held = |member: &str| {
        format!("#pools tr[data-pool='{pool}'][data-member='{member}'] td.keys-held")
    };
    // Two members, two keys each.
    until_text(client, &held("member-a"), Duration::from_secs(30), |t| {
        t == "2"
    })
    .await;
    until_text(client, &held("member-b"), Duration::from_secs(30), |t| {
        t == "2"
    })
    .await;
    let png = client.screenshot().await.unwrap();
    std::fs::write(screenshots().join("pool.png"), png).unwrap();

    // Drained from the page (its request stored, found by the member at a round), a hands its
    // keys over: b holds all four on the page, and a key is found there.
    let field = client
        .find(fantoccini::Locator::Css("#token"))
        .await
        .unwrap();
    field.send_keys(TOKEN).await.unwrap();
    let drain = format!(
        "#pools tr[data-pool='{pool}'][data-member='member-a'] button[data-action='drain']"
    );
    click_and_confirm(client, &drain).await;
    until_text(client, "#action-result", Duration::from_secs(5), |t| {
        t.contains("asked member \"member-a\"")
    })
    .await;
    until_text(client, &held("member-b"), Duration::from_secs(30), |t| {
        t == "4"
    })
    .await;
    // Its two keys changed hands within the minute.
    let moves = format!("#pools tr[data-pool='{pool}'][data-member='member-b'] td.moves");
    until_text(client, &moves, Duration::from_secs(5), |t| {
        t.parse::<u32>().is_ok_and(|n| n >= 2)
    })
    .await;
    let search = client
        .find(fantoccini::Locator::Css("#key-search"))
        .await
        .unwrap();
    search.send_keys("k0").await.unwrap();
    until_text(client, "#key-found", Duration::from_secs(5), |t| {
        t.contains("k0 held by member-b")
    })
    .await;
    drop((in_a, in_b));
    a.shutdown(Duration::from_secs(5)).await.unwrap();
    b.shutdown(Duration::from_secs(5)).await.unwrap();
}
