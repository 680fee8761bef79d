//! Identifier validation and quoting for tables, schemas and channels.
//!
//! pgcoord builds SQL with the names of its tables, so every name is validated once, when the
//! configuration is built, and quoted everywhere it is used. A valid identifier part is 1 to 63
//! bytes (PostgreSQL's `NAMEDATALEN - 1`) of ASCII letters, digits, `_` and `$`, not starting
//! with a digit or `$`. Anything else — spaces, quotes, semicolons, NUL, non-ASCII — is an
//! [`ErrorKind::InvalidIdentifier`] error, so a hostile name never reaches SQL at all; quoting is
//! the second line of defence and keeps mixed-case names exact. Channel names
//! ([`Ident::channel`]) are wider — any name `NOTIFY` takes quoted, dots and dashes included —
//! and so rest on the quoting alone: every `"` doubled, tested with names made to break out.

use std::fmt;

use crate::error::{Error, ErrorKind, Result};

/// The longest identifier PostgreSQL keeps without truncating, in bytes.
pub const MAX_IDENTIFIER_BYTES: usize = 63;

/// One validated identifier part: a schema, table, sequence or channel name.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Ident(String);

impl Ident {
    /// Validates `name` as one identifier part.
    pub fn new(name: &str) -> Result<Ident> {
        Ident::with_room(name, 0)
    }

    /// Validates `name`, leaving room for a suffix of `suffix_bytes` that pgcoord appends to
    /// derive other names from it (such as the `_rvn` sequence of a lock table).
    pub fn with_room(name: &str, suffix_bytes: usize) -> Result<Ident> {
        let max = MAX_IDENTIFIER_BYTES - suffix_bytes;
        let invalid = |why: &str| invalid("identifier", name, why);
        sized(name, max, invalid)?;
        let mut bytes = name.bytes();
        let first = bytes.next().unwrap_or_default();
        if !(first.is_ascii_alphabetic() || first == b'_') {
            return Err(invalid("must start with an ASCII letter or underscore"));
        }
        if !bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'$') {
            return Err(invalid(
                "only ASCII letters, digits, underscores and dollar signs are allowed",
            ));
        }
        Ok(Ident(name.to_owned()))
    }

    /// Validates `name` as a notification channel: anything `LISTEN` and `NOTIFY` take as a
    /// quoted identifier — 1 to 63 bytes with no NUL, so dots, dashes, spaces and mixed case
    /// too (`orders.created`, `bad-channel`). Quoted wherever it is SQL text, bound as given to
    /// `pg_notify`, and matched exactly (case included) against what arrives.
    pub fn channel(name: &str) -> Result<Ident> {
        let invalid = |why: &str| invalid("channel name", name, why);
        sized(name, MAX_IDENTIFIER_BYTES, invalid)?;
        if name.contains('\0') {
            return Err(invalid("contains NUL"));
        }
        Ok(Ident(name.to_owned()))
    }

    /// The name as given, unquoted (for use as a bound parameter, such as a channel in
    /// `pg_notify`).
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The name quoted for SQL text.
    pub fn quoted(&self) -> String {
        // Validation admits no `"`, so wrapping is enough; doubling keeps this correct regardless.
        format!("\"{}\"", self.0.replace('"', "\"\""))
    }

    /// This name with `suffix` appended, validated again.
    pub fn suffixed(&self, suffix: &str) -> Result<Ident> {
        Ident::new(&format!("{}{suffix}", self.0))
    }
}

/// [`ErrorKind::InvalidIdentifier`] for `name`, saying what it was meant to be and why not.
fn invalid(what: &str, name: &str, why: &str) -> Error {
    Error::new(
        ErrorKind::InvalidIdentifier,
        format!("invalid {what} {name:?}: {why}"),
    )
}

/// Refuses an empty name or one longer than `max` bytes.
fn sized(name: &str, max: usize, invalid: impl Fn(&str) -> Error) -> Result<()> {
    if name.is_empty() {
        return Err(invalid("empty"));
    }
    if name.len() > max {
        return Err(invalid(&format!("longer than {max} bytes")));
    }
    Ok(())
}

impl fmt::Display for Ident {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A table or sequence name, optionally qualified by its schema.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct QualifiedName {
    schema: Option<Ident>,
    name: Ident,
}

impl QualifiedName {
    /// Parses `name` or `schema.name`, leaving `suffix_bytes` of room in the name part.
    pub fn parse(text: &str, suffix_bytes: usize) -> Result<QualifiedName> {
        let mut parts = text.split('.');
        let (first, second) = (parts.next().unwrap_or_default(), parts.next());
        if parts.next().is_some() {
            return Err(Error::new(
                ErrorKind::InvalidIdentifier,
                format!("invalid identifier {text:?}: at most one '.' (schema.name) is allowed"),
            ));
        }
        Ok(match second {
            None => QualifiedName {
                schema: None,
                name: Ident::with_room(first, suffix_bytes)?,
            },
            Some(name) => QualifiedName {
                schema: Some(Ident::new(first)?),
                name: Ident::with_room(name, suffix_bytes)?,
            },
        })
    }

    /// A name in `schema`, or unqualified (found through `search_path`) when `schema` is `None`.
    pub fn new(schema: Option<Ident>, name: Ident) -> QualifiedName {
        QualifiedName { schema, name }
    }

    /// The schema, when the name is qualified.
    pub fn schema(&self) -> Option<&Ident> {
        self.schema.as_ref()
    }

    /// The unqualified name.
    pub fn name(&self) -> &Ident {
        &self.name
    }

    /// The same name with its schema set to `schema` when it has none.
    pub fn in_schema(self, schema: Option<&Ident>) -> QualifiedName {
        QualifiedName {
            schema: self.schema.or_else(|| schema.cloned()),
            name: self.name,
        }
    }

    /// A sibling name in the same schema: this name with `suffix` appended.
    pub fn suffixed(&self, suffix: &str) -> Result<QualifiedName> {
        Ok(QualifiedName {
            schema: self.schema.clone(),
            name: self.name.suffixed(suffix)?,
        })
    }

    /// The name quoted for SQL text, schema-qualified when it has a schema.
    pub fn quoted(&self) -> String {
        match &self.schema {
            Some(schema) => format!("{}.{}", schema.quoted(), self.name.quoted()),
            None => self.name.quoted(),
        }
    }
}

impl fmt::Display for QualifiedName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.schema {
            Some(schema) => write!(f, "{schema}.{}", self.name),
            None => write!(f, "{}", self.name),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn channels_take_any_name_notify_takes_and_quote_it() {
        for name in [
            "orders.created",
            "bad-channel",
            "Mixed Case",
            "ünïcode",
            "a\"b",
        ] {
            assert_eq!(Ident::channel(name).unwrap().as_str(), name);
        }
        assert_eq!(Ident::channel("a\"b").unwrap().quoted(), "\"a\"\"b\"");
        for bad in ["", "nul\0", &"x".repeat(64)] {
            let kind = Ident::channel(bad).unwrap_err().kind();
            assert_eq!(kind, ErrorKind::InvalidIdentifier, "{bad:?}");
        }
        // Tables stay plain identifiers.
        assert!(Ident::new("orders.created").is_err());
    }

    #[test]
    fn accepts_plain_and_qualified_names() {
        assert_eq!(
            Ident::new("pgcoord_locks").unwrap().quoted(),
            "\"pgcoord_locks\""
        );
        let q = QualifiedName::parse("app.Locks$1", 0).unwrap();
        assert_eq!(q.quoted(), "\"app\".\"Locks$1\"");
        assert_eq!(q.to_string(), "app.Locks$1");
        assert!(Ident::new(&"a".repeat(63)).is_ok());
    }

    #[test]
    fn rejects_hostile_names() {
        let long = "a".repeat(64);
        for bad in [
            "",
            "x; DROP TABLE y",
            "x\"y",
            "x'y",
            "x\0y",
            "lócks",
            "1abc",
            "$x",
            "a b",
            "a-b",
            &long,
            "a.b.c",
            ".a",
            "a.",
            "\"a\"",
        ] {
            let err = QualifiedName::parse(bad, 0).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::InvalidIdentifier, "{bad:?}");
        }
    }

    #[test]
    fn keeps_room_for_suffixes() {
        let name = "a".repeat(60);
        assert!(Ident::with_room(&name, 4).is_err());
        assert!(Ident::with_room(&name[..59], 4).is_ok());
    }
}
