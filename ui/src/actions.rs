//! The view's actions — a leader asked to resign, a pool member asked to drain, a lease
//! released by force, a consumer's cursor moved — off unless the view was given a token. Each is a POST whose JSON body names
//! what it acts on, carrying the token in its `Authorization: Bearer` header: never in a URL,
//! never logged. A cross-site page cannot send that header (nor a JSON body) without the
//! browser asking this server first, which it never allows; `Sec-Fetch-Site` and `Origin` are
//! checked too. Every request, refused or done, is audited through `tracing` (target
//! `pgcoord_ui::audit`).

use std::time::{Duration, Instant};

use axum::http::{HeaderMap, StatusCode, header};
use pgcoord::{Error, ErrorKind, Result};
use serde_json::{Value, json};

use crate::LiveView;

/// How long an action's statements may take.
const ACT_WITHIN: Duration = Duration::from_secs(5);

/// The shortest token accepted: one an attacker cannot guess.
pub(crate) const TOKEN_MIN_LEN: usize = 16;

/// Why a request was refused, as the page and the audit say it.
pub(crate) fn refusal(headers: &HeaderMap, token: &str) -> Option<(StatusCode, &'static str)> {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    // A browser says where a request comes from; only this page's own may act.
    if header("sec-fetch-site").is_some_and(|site| site != "same-origin" && site != "none") {
        return Some((StatusCode::FORBIDDEN, "cross-site request"));
    }
    if let (Some(origin), Some(host)) = (header("origin"), header("host")) {
        let bare = origin.split_once("://").map_or(origin, |(_, rest)| rest);
        if bare != host {
            return Some((StatusCode::FORBIDDEN, "cross-origin request"));
        }
    }
    let json = header(header::CONTENT_TYPE.as_str())
        .is_some_and(|t| t.split(';').next() == Some("application/json"));
    if !json {
        return Some((StatusCode::UNSUPPORTED_MEDIA_TYPE, "not a JSON request"));
    }
    let given = header(header::AUTHORIZATION.as_str()).and_then(|v| v.strip_prefix("Bearer "));
    match given {
        None => Some((StatusCode::UNAUTHORIZED, "no token")),
        Some(given) if !same(given.as_bytes(), token.as_bytes()) => {
            Some((StatusCode::FORBIDDEN, "wrong token"))
        }
        Some(_) => None,
    }
}

/// Compares without stopping at the first difference: how long it takes says nothing of the
/// token.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
}

/// Does `action` as `body` says; what to show the operator.
pub(crate) async fn act(view: &LiveView, action: &str, body: &Value) -> Result<Value> {
    let text = |key: &str| {
        body.get(key).and_then(Value::as_str).ok_or_else(|| {
            Error::new(
                ErrorKind::InvalidConfig,
                format!("{action}: {key:?} is missing"),
            )
        })
    };
    let client = view
        .inner
        .pool
        .statements(Some(Instant::now() + ACT_WITHIN));
    let tables = &view.inner.tables;
    match action {
        "resign" => {
            let name = text("name")?;
            let by = "pgcoord-ui";
            let term = tables.leases.request_resign(&client, name, by).await?;
            Ok(json!({ "done": format!("asked the leader of {name:?} to resign"), "token": term }))
        }
        "drain" => {
            // A resign request on the member's lease: the member finds it at a round (within a
            // lease), hands every key over and stops, as `Drain` does in its process.
            let (pool, member) = (text("pool")?, text("member")?);
            let lease = format!("{pool}/members/{member}");
            match tables
                .leases
                .request_resign(&client, &lease, "pgcoord-ui")
                .await?
            {
                Some(token) => Ok(json!({
                    "done": format!("asked member {member:?} of pool {pool:?} to drain"),
                    "token": token,
                })),
                None => Err(Error::new(
                    ErrorKind::NotFound,
                    format!("{member:?} is not a member of pool {pool:?} now"),
                )),
            }
        }
        "release" => {
            let name = text("name")?;
            // The token the operator saw and confirmed: another tenure is not ended.
            let token = body.get("token").and_then(Value::as_i64).ok_or_else(|| {
                Error::new(ErrorKind::InvalidConfig, "release: \"token\" is missing")
            })?;
            let (owner, token) = tables
                .leases
                .force_release(&client, name, Some(token))
                .await?;
            Ok(json!({ "done": format!("released {name:?} (token {token}, owner {owner})") }))
        }
        "reset" => {
            let (topic, consumer, to) = (text("topic")?, text("consumer")?, text("to")?);
            if to != "now" && to != "oldest" {
                return Err(Error::new(
                    ErrorKind::InvalidConfig,
                    "reset: \"to\" is \"now\" or \"oldest\"",
                ));
            }
            let (before, after) = (tables.topics)
                .reset_consumer_to(&client, topic, consumer, to)
                .await?;
            Ok(json!({ "done": format!("{topic}/{consumer}: cursor {before} -> {after}") }))
        }
        _ => Err(Error::new(
            ErrorKind::NotFound,
            format!("no action {action:?}"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOKEN: &str = "0123456789abcdef-token";

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for (name, value) in pairs {
            headers.insert(*name, value.parse().unwrap());
        }
        headers
    }

    fn ok() -> Vec<(&'static str, String)> {
        vec![
            ("content-type", "application/json".into()),
            ("authorization", format!("Bearer {TOKEN}")),
            ("host", "127.0.0.1:7070".into()),
            ("origin", "http://127.0.0.1:7070".into()),
            ("sec-fetch-site", "same-origin".into()),
        ]
    }

    fn with(changes: &[(&'static str, &str)], removed: &[&str]) -> HeaderMap {
        let mut pairs: Vec<(&'static str, String)> = ok();
        pairs.retain(|(name, _)| !removed.contains(name));
        for (name, value) in changes {
            pairs.retain(|(n, _)| n != name);
            pairs.push((name, (*value).to_owned()));
        }
        let borrowed: Vec<(&'static str, &str)> =
            pairs.iter().map(|(n, v)| (*n, v.as_str())).collect();
        headers(&borrowed)
    }

    #[test]
    fn the_pages_own_request_with_the_token_is_let_through() {
        assert_eq!(refusal(&with(&[], &[]), TOKEN), None);
        // Without the browser's headers (a script, curl): the token alone decides.
        let bare = with(&[], &["origin", "sec-fetch-site"]);
        assert_eq!(refusal(&bare, TOKEN), None);
    }

    #[test]
    fn without_the_token_or_with_another_it_is_refused() {
        let none = with(&[], &["authorization"]);
        assert_eq!(refusal(&none, TOKEN).unwrap().0, StatusCode::UNAUTHORIZED);
        let wrong = with(&[("authorization", "Bearer 0123456789abcdef-tokeN")], &[]);
        assert_eq!(refusal(&wrong, TOKEN).unwrap().0, StatusCode::FORBIDDEN);
        let short = with(&[("authorization", "Bearer 0123")], &[]);
        assert_eq!(refusal(&short, TOKEN).unwrap().0, StatusCode::FORBIDDEN);
    }

    #[test]
    fn cross_site_requests_are_refused_even_with_the_token() {
        let site = with(&[("sec-fetch-site", "cross-site")], &[]);
        assert_eq!(refusal(&site, TOKEN).unwrap().1, "cross-site request");
        let origin = with(&[("origin", "https://evil.example")], &["sec-fetch-site"]);
        assert_eq!(refusal(&origin, TOKEN).unwrap().1, "cross-origin request");
        // A form can post text/plain or form data without asking; not JSON.
        let form = with(
            &[("content-type", "application/x-www-form-urlencoded")],
            &[],
        );
        assert_eq!(
            refusal(&form, TOKEN).unwrap().0,
            StatusCode::UNSUPPORTED_MEDIA_TYPE
        );
    }
}
