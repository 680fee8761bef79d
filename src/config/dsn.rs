//! The TLS options of a DSN that tokio-postgres does not parse itself.
//!
//! tokio-postgres knows `sslmode=disable|prefer|require` and rejects `verify-ca`, `verify-full`
//! and `sslrootcert` as unknown. pgcoord takes every `ssl*` option it handles out of the DSN
//! before tokio-postgres sees it, in both of libpq's forms (`key=value …` and
//! `postgres://…?key=value&…`), and leaves the rest of the DSN byte for byte as it was.
//!
//! A DSN may carry a password (`password=…`, `postgres://user:…@`, `?password=…`), so no error
//! about one quotes its text: an error names the part that is wrong, and of the DSN's words only
//! the names of known options. A password with a space or `&` in it, unquoted or unencoded,
//! splits into what look like more options, so even an unknown option's name may be a piece of
//! one.

use crate::error::{Error, ErrorKind, Result};
use crate::tls::Secret;

/// The `ssl*` options taken out of a DSN, as written (not yet validated).
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct TlsOptions {
    pub(crate) sslmode: Option<String>,
    pub(crate) sslrootcert: Option<String>,
    pub(crate) sslcert: Option<String>,
    pub(crate) sslkey: Option<String>,
    /// The client key's password: debug-printed as `_`.
    pub(crate) sslpassword: Option<Secret>,
}

/// Options of libpq's that pgcoord does not support: a clear error instead of tokio-postgres's
/// "unknown option".
const UNSUPPORTED: &[&str] = &["sslcrl", "sslcrldir"];

/// Splits `dsn` into the DSN without its TLS options, and those options.
pub(crate) fn take_tls_options(dsn: &str) -> Result<(String, TlsOptions)> {
    let mut options = TlsOptions::default();
    let mut take = |key: &str, value: String| -> Result<bool> {
        match key {
            "sslmode" => options.sslmode = Some(value),
            "sslrootcert" => options.sslrootcert = Some(value),
            "sslcert" => options.sslcert = Some(value),
            "sslkey" => options.sslkey = Some(value),
            "sslpassword" => options.sslpassword = Some(Secret(value)),
            key if UNSUPPORTED.contains(&key) => {
                return Err(Error::new(
                    ErrorKind::InvalidConfig,
                    format!(
                        "the DSN option {key} is not supported: for revocation lists, give a \
                         rustls ClientConfig with ConfigBuilder::tls_client_config"
                    ),
                ));
            }
            _ => return Ok(false),
        }
        Ok(true)
    };
    let rest = if dsn.starts_with("postgres://") || dsn.starts_with("postgresql://") {
        take_from_url(dsn, &mut take)?
    } else {
        take_from_key_values(dsn, &mut take)?
    };
    Ok((rest, options))
}

/// `postgres://…?a=b&c=d`: the query parameters are `&`-separated and percent-encoded.
fn take_from_url(dsn: &str, take: &mut impl FnMut(&str, String) -> Result<bool>) -> Result<String> {
    // The user-info's password, as tokio-postgres finds it (before the first `@`, after the
    // first `:`): it takes bad percent-encoding there as literal text, a password the server
    // then refuses; libpq refuses the DSN, as this does.
    if let Some((credentials, _)) = dsn.split_once("://").and_then(|(_, r)| r.split_once('@'))
        && let Some((_, password)) = credentials.split_once(':')
    {
        percent_decode_bytes(password).map_err(|why| invalid(format!("{why} in the password")))?;
    }
    let Some((base, query)) = dsn.split_once('?') else {
        return Ok(dsn.to_owned());
    };
    let mut kept = Vec::new();
    for pair in query.split('&') {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        let key = percent_decode(key)
            .map_err(|why| invalid(format!("{why} in the name of a query parameter")))?;
        let value =
            percent_decode(value).map_err(|why| invalid(format!("{why} in {}", value_of(&key))))?;
        if !take(&key, value)? {
            kept.push(pair);
        }
    }
    Ok(match kept.is_empty() {
        true => base.to_owned(),
        false => format!("{base}?{}", kept.join("&")),
    })
}

/// `text` percent-decoded, as UTF-8; the error says what is wrong, never quoting `text`.
fn percent_decode(text: &str) -> std::result::Result<String, &'static str> {
    String::from_utf8(percent_decode_bytes(text)?)
        .map_err(|_| "percent-encoding of bytes that are not UTF-8")
}

/// `text` percent-decoded.
fn percent_decode_bytes(text: &str) -> std::result::Result<Vec<u8>, &'static str> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = text
                .get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok());
            let Some(byte) = hex else {
                return Err("bad percent-encoding");
            };
            out.push(byte);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    Ok(out)
}

/// The options tokio-postgres knows and the `ssl*` ones pgcoord takes: the only words of a DSN
/// an error quotes.
const KNOWN: &[&str] = &[
    "host",
    "hostaddr",
    "port",
    "user",
    "password",
    "dbname",
    "options",
    "application_name",
    "connect_timeout",
    "tcp_user_timeout",
    "keepalives",
    "keepalives_idle",
    "keepalives_interval",
    "keepalives_retries",
    "target_session_attrs",
    "channel_binding",
    "load_balance_hosts",
    "sslmode",
    "sslnegotiation",
    "sslrootcert",
    "sslcert",
    "sslkey",
    "sslpassword",
];

/// The value of option `key`, named so only when it is a known option.
fn value_of(key: &str) -> String {
    match key {
        "password" => "the password".to_owned(),
        key if KNOWN.contains(&key) || UNSUPPORTED.contains(&key) => format!("the value of {key}"),
        _ => "the value of an unknown query parameter".to_owned(),
    }
}

/// tokio-postgres's refusal of `dsn`, told without its words where they may quote a password:
/// its reason ("unknown option `…`", "… but got `…`") can quote the DSN's text, so in a DSN that
/// may carry a password only reasons that quote nothing of it are passed on, and the error keeps
/// no source to show them.
pub(crate) fn refused(dsn: &str, e: tokio_postgres::Error) -> Error {
    let reason = std::error::Error::source(&e).map_or_else(String::new, ToString::to_string);
    let quotes_nothing = reason.starts_with("invalid value for option `")
        || reason.starts_with("invalid utf-8 sequence")
        || reason.starts_with("incomplete utf-8 byte sequence")
        || ["", "unexpected EOF", "unterminated parameter"].contains(&reason.as_str())
        || reason == "unterminated quoted connection parameter value";
    if quotes_nothing || !may_carry_password(dsn) {
        let reason = if reason.is_empty() {
            e.to_string()
        } else {
            reason
        };
        return invalid(reason).with_source(e);
    }
    let reason = if reason.starts_with("unknown option") {
        "an option tokio-postgres does not know (not named: it may be a piece of the password; \
         quote a password with spaces, password='…', and percent-encode one in a URL)"
            .to_owned()
    } else if let Some((at, _)) = reason.split_once(" but got")
        && at.starts_with("unexpected character at byte ")
    {
        at.to_owned()
    } else {
        "malformed (the detail is withheld: it may quote the password)".to_owned()
    };
    invalid(reason)
}

/// Whether `dsn` may name a password: the word anywhere, or a URL's user-info.
fn may_carry_password(dsn: &str) -> bool {
    let url = dsn.starts_with("postgres://") || dsn.starts_with("postgresql://");
    dsn.to_ascii_lowercase().contains("password") || (url && dsn.contains('@'))
}

/// `key=value key='quoted \' value'`: whitespace-separated, values optionally single-quoted,
/// backslash escapes in both (libpq's rules). Taken options are cut out of the text.
fn take_from_key_values(
    dsn: &str,
    take: &mut impl FnMut(&str, String) -> Result<bool>,
) -> Result<String> {
    let mut rest = String::with_capacity(dsn.len());
    let mut chars = dsn.char_indices().peekable();
    let mut kept_from = 0;
    loop {
        while chars.next_if(|(_, c)| c.is_whitespace()).is_some() {}
        let Some(&(start, _)) = chars.peek() else {
            break;
        };
        let mut key = String::new();
        while let Some((_, c)) = chars.next_if(|(_, c)| *c != '=' && !c.is_whitespace()) {
            key.push(c);
        }
        while chars.next_if(|(_, c)| c.is_whitespace()).is_some() {}
        if chars.next_if(|(_, c)| *c == '=').is_none() {
            // Not ours to judge: tokio-postgres reports the malformed DSN.
            return Ok(dsn.to_owned());
        }
        while chars.next_if(|(_, c)| c.is_whitespace()).is_some() {}
        let mut value = String::new();
        if chars.next_if(|(_, c)| *c == '\'').is_some() {
            loop {
                match chars.next() {
                    Some((_, '\'')) => break,
                    Some((_, '\\')) => value.extend(chars.next().map(|(_, c)| c)),
                    Some((_, c)) => value.push(c),
                    None => return Ok(dsn.to_owned()),
                }
            }
        } else {
            while let Some((_, c)) = chars.next_if(|(_, c)| !c.is_whitespace()) {
                match c {
                    '\\' => value.extend(chars.next().map(|(_, c)| c)),
                    c => value.push(c),
                }
            }
        }
        // A taken option goes with the whitespace after it.
        while chars.next_if(|(_, c)| c.is_whitespace()).is_some() {}
        let end = chars.peek().map_or(dsn.len(), |&(i, _)| i);
        if take(&key, value)? {
            rest.push_str(&dsn[kept_from..start]);
            kept_from = end;
        }
    }
    rest.push_str(&dsn[kept_from..]);
    Ok(rest.trim().to_owned())
}

fn invalid(message: String) -> Error {
    Error::new(ErrorKind::InvalidConfig, format!("invalid DSN: {message}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(dsn: &str) -> (String, TlsOptions) {
        take_tls_options(dsn).unwrap()
    }

    fn options(mode: &str, root: Option<&str>) -> TlsOptions {
        TlsOptions {
            sslmode: Some(mode.into()),
            sslrootcert: root.map(Into::into),
            ..TlsOptions::default()
        }
    }

    #[test]
    fn key_value_options_are_cut_out_and_the_rest_kept() {
        let (rest, tls) =
            split("host=db.example user=app sslmode=verify-full sslrootcert=/etc/ca.pem port=5433");
        assert_eq!(rest, "host=db.example user=app port=5433");
        assert_eq!(tls, options("verify-full", Some("/etc/ca.pem")));
        tokio_postgres::Config::from_str(&rest).unwrap();
    }

    #[test]
    fn key_value_quotes_spaces_and_escapes() {
        let (rest, tls) = split(r"host=h sslrootcert = '/my certs/it\'s.pem' password='a b'");
        assert_eq!(tls.sslrootcert.as_deref(), Some("/my certs/it's.pem"));
        assert_eq!(rest, "host=h password='a b'");
        let (_, tls) = split(r"sslrootcert=/a\ b.pem");
        assert_eq!(tls.sslrootcert.as_deref(), Some("/a b.pem"));
    }

    #[test]
    fn url_options_are_decoded_and_cut_out() {
        let (rest, tls) = split(
            "postgres://u:p@db.example:5432/app?sslmode=verify-ca&application_name=x&sslrootcert=%2Fetc%2Fca%20file.pem",
        );
        assert_eq!(
            rest,
            "postgres://u:p@db.example:5432/app?application_name=x"
        );
        assert_eq!(tls, options("verify-ca", Some("/etc/ca file.pem")));
        let (rest, tls) = split("postgresql://localhost/app?sslmode=require");
        assert_eq!(rest, "postgresql://localhost/app");
        assert_eq!(tls, options("require", None));
        let (rest, tls) = split("postgres://localhost/app");
        assert_eq!(
            (rest.as_str(), tls),
            ("postgres://localhost/app", TlsOptions::default())
        );
    }

    #[test]
    fn unsupported_and_malformed_options() {
        let e = take_tls_options("host=h sslcrl=/crl.pem").unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidConfig);
        assert!(e.to_string().contains("sslcrl"), "{e}");
        let (rest, tls) = take_tls_options("host=h sslcert=/c.pem sslkey='/my key.pem'").unwrap();
        assert_eq!(rest.trim(), "host=h");
        assert_eq!(
            (tls.sslcert.as_deref(), tls.sslkey.as_deref()),
            (Some("/c.pem"), Some("/my key.pem"))
        );
        let e = take_tls_options("postgres://h/db?sslkey=%zz").unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidConfig);
        let e = take_tls_options("postgres://h/db?sslpassword=se%zzcret").unwrap_err();
        assert!(!e.to_string().contains("cret"), "{e}");
        assert_eq!(e.kind(), ErrorKind::InvalidConfig);
        // Malformed key=value text is left for tokio-postgres to report.
        assert_eq!(split("host=h sslmode").0, "host=h sslmode");
    }

    #[test]
    fn sslpassword_is_taken_in_both_forms_and_never_debug_printed() {
        let (rest, tls) = split("host=h sslkey=/k.pem sslpassword='s3cret pass' user=u");
        assert_eq!(rest, "host=h user=u");
        assert_eq!(tls.sslpassword, Some(Secret("s3cret pass".into())));
        let (rest, tls) = split("postgres://u@h/db?sslpassword=s3cret%20pass&sslkey=%2Fk.pem");
        assert_eq!(rest, "postgres://u@h/db");
        assert_eq!(tls.sslpassword, Some(Secret("s3cret pass".into())));
        let shown = format!("{tls:?}");
        assert!(
            shown.contains("sslpassword") && !shown.contains("s3cret"),
            "{shown}"
        );
    }

    use std::str::FromStr;
}
