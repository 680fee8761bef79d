//! A live view of a fleet's coordination, as one web page: who holds each lease and for how
//! much longer, who waits in its line, the terms seen, each durable topic's consumers with their
//! lag (and a chart of it over the last minutes), what holds readers back, each worker pool's
//! members and the keys they hold, what each schedule last did, stored limits and rate-limit
//! buckets in use, advisory locks, and the fleet: the processes holding leases and the
//! database's sessions (the listeners among them). `pgcoord ui` serves it; an application can
//! mount it in its own server.
//!
//! - [`LiveView`] — the view: a small pool of its own, the latest look shared by every open
//!   page, the history (`history`, pure) kept from the looks.
//! - `snapshot` — one look, read with pgcoord's own inspection functions (no second copy of
//!   the tables' knowledge), every statement bounded.
//! - `page.html` — the page, with its assets: tables and an SVG chart drawn by a small script
//!   of its own that asks for a look about every second. Nothing is fetched from elsewhere.
//!
//! The view reads; it acts only when given a token ([`LiveView::allow_actions`]): a leader
//! asked to resign, a pool member asked to drain, a lease released by force (naming the token it ends), a consumer's cursor
//! moved to now or to the oldest event (`actions`: each a POST carrying the token in a header,
//! refused across sites, audited through `tracing`). It shows no secret: the page and its JSON
//! carry no DSN, password, server address or token. Any number of open pages cost one look a
//! second between them: the leases and their lines about every second (one statement), the rest
//! every fifteen seconds (eight): under 2 statements a second (1.7 measured).
//!
//! Mounted in an axum application (the view keeps its own pool, built from `config`):
//!
//! ```no_run
//! async fn serve(config: pgcoord::Config) -> std::io::Result<()> {
//!     let view = pgcoord_ui::LiveView::new(&config);
//!     let app = axum::Router::new().nest("/pgcoord", view.router());
//!     let listener = tokio::net::TcpListener::bind("127.0.0.1:7070").await?;
//!     axum::serve(listener, app).await
//! }
//! ```
//!
//! An actix-web application serves it on a port of its own beside its server, from a tokio
//! task (`actix_rt::spawn(view.serve(listener))`), or behind the same reverse proxy.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::Path;
use axum::http::HeaderMap;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use pgcoord::{Config, Pool};
use serde_json::{Value, json};
use tokio::sync::Mutex;

mod actions;
mod history;
mod snapshot;

use history::History;
use snapshot::{REST_EVERY, Tables};

/// The page, with its style and script: served as it is, nothing fetched from elsewhere.
const PAGE: &str = include_str!("page.html");

/// How long a look may take before the page is told the database did not answer.
const LOOK_WITHIN: Duration = Duration::from_secs(2);

/// How long a look is shown again instead of taken anew: a page asks 800 ms after its last
/// answer, and any number of pages cost one look every 0.8–0.9 s (its slow part every
/// [`REST_EVERY`]).
const LOOK_KEPT: Duration = Duration::from_millis(700);

/// The live view of one database's pgcoord tables. Cheap to clone: clones share the pool, the
/// latest look and the history.
#[derive(Clone)]
pub struct LiveView {
    inner: Arc<Inner>,
}

struct Inner {
    pool: Pool,
    tables: Tables,
    /// The token that lets a request act; `None`: the view only reads.
    token: Option<String>,
    /// Held while a look is taken: pages asking meanwhile wait for it and share it.
    latest: Mutex<Latest>,
}

#[derive(Default)]
struct Latest {
    taken: Option<Instant>,
    /// The slow part of the looks, and when it was read.
    rest: Option<(Instant, Arc<snapshot::Rest>)>,
    page: Arc<String>,
    history: History,
    /// Whether the last look failed (its warning given).
    failing: bool,
}

impl std::fmt::Debug for LiveView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LiveView").finish_non_exhaustive()
    }
}

impl LiveView {
    /// A view of the tables `config` names, on a pool of its own (of `config`'s size; it uses
    /// one connection at a time). Nothing connects until a page asks.
    pub fn new(config: &Config) -> LiveView {
        LiveView {
            inner: Arc::new(Inner {
                pool: Pool::new(config),
                tables: Tables::new(config),
                token: None,
                latest: Mutex::new(Latest::default()),
            }),
        }
    }

    /// The same view, whose page may act when it is given `token` (asked for on the page, kept
    /// in the browser's tab, sent in a header): at least 16 characters, else
    /// [`ErrorKind::InvalidConfig`](pgcoord::ErrorKind::InvalidConfig). Call it before the view
    /// is cloned or served.
    pub fn allow_actions(self, token: impl Into<String>) -> pgcoord::Result<LiveView> {
        let token = token.into();
        if token.chars().count() < actions::TOKEN_MIN_LEN {
            return Err(pgcoord::Error::new(
                pgcoord::ErrorKind::InvalidConfig,
                format!(
                    "the live view's token must have at least {} characters",
                    actions::TOKEN_MIN_LEN
                ),
            ));
        }
        let Ok(mut inner) = Arc::try_unwrap(self.inner) else {
            return Err(pgcoord::Error::new(
                pgcoord::ErrorKind::InvalidConfig,
                "allow_actions: the view is already shared",
            ));
        };
        inner.token = Some(token);
        Ok(LiveView {
            inner: Arc::new(inner),
        })
    }

    /// The view's routes: `/` the page, `/snapshot` what it shows (JSON), and with actions
    /// allowed `POST /actions/{resign,drain,release,reset}`. Nest it where it should be served
    /// (`Router::nest("/pgcoord", view.router())`).
    pub fn router(&self) -> Router {
        let (view, acting) = (self.clone(), self.clone());
        Router::new()
            .route("/", get(page))
            .route("/snapshot", get(move || snapshot(view.clone())))
            .route(
                "/actions/{action}",
                post(
                    move |Path(action): Path<String>, headers: HeaderMap, body: String| {
                        act(acting.clone(), action, headers, body)
                    },
                ),
            )
    }

    /// Serves the view on `listener` until the listener fails.
    pub async fn serve(self, listener: tokio::net::TcpListener) -> std::io::Result<()> {
        axum::serve(listener, self.router()).await
    }

    /// The latest look as the page's JSON, taken anew when it is older than [`LOOK_KEPT`].
    async fn look(&self) -> pgcoord::Result<Arc<String>> {
        let mut latest = self.inner.latest.lock().await;
        if latest.taken.is_some_and(|at| at.elapsed() < LOOK_KEPT) {
            return Ok(latest.page.clone());
        }
        let (tables, pool) = (&self.inner.tables, &self.inner.pool);
        let rest_due = (latest.rest.as_ref()).is_none_or(|(at, _)| at.elapsed() >= REST_EVERY);
        let taken = async {
            let live = snapshot::take(tables, pool, LOOK_WITHIN).await?;
            let rest = match rest_due {
                true => Some(snapshot::take_rest(tables, pool, LOOK_WITHIN).await?),
                false => None,
            };
            Ok::<_, pgcoord::Error>((live, rest))
        };
        let (snapshot, rest) = match taken.await {
            Ok(taken) => taken,
            Err(e) => {
                // Said once when the looks start failing, not at every page's every second.
                if !latest.failing {
                    tracing::warn!(error = %e, "the live view cannot look at the database");
                }
                latest.failing = true;
                return Err(e);
            }
        };
        if latest.failing {
            tracing::info!("the live view looks at the database again");
        }
        latest.failing = false;
        snapshot::remember(&snapshot, &mut latest.history);
        if let Some(rest) = rest {
            snapshot::remember_lag(&rest, &mut latest.history);
            latest.rest = Some((Instant::now(), Arc::new(rest)));
        }
        let rest = latest
            .rest
            .as_ref()
            .expect("read in this look or before")
            .1
            .clone();
        let acting = self.inner.token.is_some();
        let page = snapshot::render(&snapshot, &rest, &latest.history, acting);
        let page = Arc::new(page.to_string());
        latest.taken = Some(Instant::now());
        latest.page = page.clone();
        Ok(page)
    }
}

async fn page() -> Response {
    html(PAGE)
}

async fn snapshot(view: LiveView) -> Response {
    match view.look().await {
        Ok(page) => json_response(StatusCode::OK, page.as_str().to_owned()),
        Err(e) => {
            let body = json!({ "error": e.to_string(), "kind": format!("{:?}", e.kind()) });
            json_response(StatusCode::SERVICE_UNAVAILABLE, body.to_string())
        }
    }
}

/// An action: refused without the token or across sites; audited either way.
async fn act(view: LiveView, action: String, headers: HeaderMap, body: String) -> Response {
    let Some(token) = view.inner.token.as_deref() else {
        let body = json!({ "error": "actions are off: the view was started without a token" });
        return json_response(StatusCode::NOT_FOUND, body.to_string());
    };
    let target: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
    // What it acts on, for the audit: names only (the body has no secret; the token is in a
    // header, never logged).
    let on = ["name", "pool", "member", "topic", "consumer", "to", "token"]
        .iter()
        .filter_map(|k| target.get(*k).map(|v| format!("{k}={v}")))
        .collect::<Vec<_>>()
        .join(" ");
    if let Some((status, why)) = actions::refusal(&headers, token) {
        tracing::warn!(target: "pgcoord_ui::audit", action, on, refused = why, "live view action refused");
        let body = json!({ "error": format!("refused: {why}") });
        return json_response(status, body.to_string());
    }
    match actions::act(&view, &action, &target).await {
        Ok(done) => {
            tracing::info!(target: "pgcoord_ui::audit", action, on, "live view action done");
            // The next look reads everything again: the page shows what the action did.
            let mut latest = view.inner.latest.lock().await;
            (latest.taken, latest.rest) = (None, None);
            json_response(StatusCode::OK, done.to_string())
        }
        Err(e) => {
            tracing::warn!(target: "pgcoord_ui::audit", action, on, error = %e, "live view action failed");
            let status = match e.kind() {
                pgcoord::ErrorKind::NotFound => StatusCode::NOT_FOUND,
                pgcoord::ErrorKind::InvalidConfig
                | pgcoord::ErrorKind::InvalidName
                | pgcoord::ErrorKind::InvalidIdentifier => StatusCode::BAD_REQUEST,
                pgcoord::ErrorKind::FailedPrecondition => StatusCode::CONFLICT,
                _ => StatusCode::SERVICE_UNAVAILABLE,
            };
            let body = json!({ "error": e.to_string() });
            json_response(status, body.to_string())
        }
    }
}

fn html(body: &'static str) -> Response {
    let mut response = body.into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    // Nothing but its own script and style, and no framing by other sites.
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; \
             connect-src 'self'; img-src 'self' data:; frame-ancestors 'none'",
        ),
    );
    response
}

fn json_response(status: StatusCode, body: String) -> Response {
    let mut response = (status, body).into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

/// Stored data (a lease's, a term's proclamation) as the view and the `pgcoord` command show
/// it: printable UTF-8 text as a string, MessagePack (as the runtime stores a typed value)
/// decoded, anything else as `{"hex": …}`.
pub fn shown(data: Option<&[u8]>) -> Value {
    let Some(data) = data else {
        return Value::Null;
    };
    if let Ok(text) = std::str::from_utf8(data)
        && !text.chars().any(char::is_control)
    {
        return Value::String(text.to_owned());
    }
    // Decoded only when the whole of it is one MessagePack value.
    let mut rest = data;
    let mut decoder = rmp_serde::Deserializer::new(&mut rest);
    match serde::Deserialize::deserialize(&mut decoder) {
        Ok(value) if rest.is_empty() => value,
        _ => json!({ "hex": data.iter().map(|b| format!("{b:02x}")).collect::<String>() }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_is_shown_as_text_decoded_messagepack_or_hex() {
        assert_eq!(shown(Some(b"addr-1")), json!("addr-1"));
        let packed = rmp_serde::to_vec_named(&json!({"job": 42})).unwrap();
        assert_eq!(shown(Some(&packed)), json!({"job": 42}));
        // Not text, and not one whole MessagePack value: a value and a stray byte after it.
        assert_eq!(
            shown(Some(&[0x92, 0x01, 0x02, 0xc1])),
            json!({"hex": "920102c1"})
        );
        assert_eq!(shown(None), Value::Null);
    }
}
