//! Listings: columns as wide as their data, or with `--json` one JSON array of objects (one
//! per row, keyed by the column names) for scripts. Data is shown decoded, as `listen` does.

use serde_json::{Map, Value, json};

/// The widest the last column's cells (data, bodies: free-form values) are shown; names and
/// other columns are never cut, and `--json` has every cell whole.
const MAX_CELL: usize = 80;

/// A listing: named columns, rows of values, and what a row is ("lease(s)").
pub(crate) struct Listing {
    columns: Vec<&'static str>,
    rows: Vec<Vec<Value>>,
    what: &'static str,
}

impl Listing {
    pub(crate) fn new(columns: &[&'static str], what: &'static str) -> Listing {
        Listing {
            columns: columns.to_vec(),
            rows: Vec::new(),
            what,
        }
    }

    pub(crate) fn push(&mut self, row: Vec<Value>) {
        debug_assert_eq!(row.len(), self.columns.len());
        self.rows.push(row);
    }

    /// Prints the listing: as JSON, or as columns with a count below.
    pub(crate) fn print(&self, as_json: bool) {
        if as_json {
            let objects: Vec<Value> = (self.rows.iter())
                .map(|row| {
                    let fields = self
                        .columns
                        .iter()
                        .zip(row)
                        .map(|(c, v)| (key(c), v.clone()));
                    Value::Object(fields.collect::<Map<_, _>>())
                })
                .collect();
            println!("{}", Value::Array(objects));
            return;
        }
        let cells: Vec<Vec<String>> = self
            .rows
            .iter()
            .map(|row| {
                let last = row.len() - 1;
                let cell = |(i, v): (usize, &Value)| if i == last { cut(text(v)) } else { text(v) };
                row.iter().enumerate().map(cell).collect()
            })
            .collect();
        let widths: Vec<usize> = (0..self.columns.len())
            .map(|i| {
                let widest = cells.iter().map(|r| r[i].chars().count()).max();
                widest.unwrap_or(0).max(self.columns[i].len())
            })
            .collect();
        let numeric: Vec<bool> = (0..self.columns.len())
            .map(|i| !self.rows.is_empty() && self.rows.iter().all(|r| r[i].is_number()))
            .collect();
        let line = |cells: Vec<&str>| {
            let last = cells.len() - 1;
            let padded: Vec<String> = (cells.into_iter().enumerate())
                .map(|(i, cell)| match (numeric[i], i == last) {
                    (true, _) => format!("{cell:>w$}", w = widths[i]),
                    (false, true) => cell.to_owned(),
                    (false, false) => format!("{cell:<w$}", w = widths[i]),
                })
                .collect();
            println!("{}", padded.join("  "));
        };
        line(self.columns.clone());
        for row in &cells {
            line(row.iter().map(String::as_str).collect());
        }
        println!("{} {}", self.rows.len(), self.what);
    }
}

/// A column name as a JSON key: `LAG AGE` is `lag_age`.
fn key(column: &str) -> String {
    column.to_lowercase().replace(' ', "_")
}

/// A value as a cell: strings bare, null as `-`, anything else as compact JSON.
pub(crate) fn text(value: &Value) -> String {
    match value {
        Value::Null => "-".to_owned(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// `cell` cut at [`MAX_CELL`] characters.
fn cut(cell: String) -> String {
    if cell.chars().count() <= MAX_CELL {
        return cell;
    }
    let head: String = cell.chars().take(MAX_CELL - 1).collect();
    format!("{head}…")
}

/// Stored data as a value: printable UTF-8 text as a string, MessagePack (as the runtime
/// stores a typed value) decoded, anything else as `{"hex": …}`.
pub(crate) fn data(data: Option<&[u8]>) -> Value {
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

/// Seconds as a number with a tenth's precision, for `LEFT` and ages.
pub(crate) fn seconds(duration: std::time::Duration) -> Value {
    json!((duration.as_secs_f64() * 10.0).round() / 10.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_is_shown_as_text_decoded_messagepack_or_hex() {
        assert_eq!(data(Some(b"addr-1")), json!("addr-1"));
        let packed = rmp_serde::to_vec_named(&json!({"job": 42})).unwrap();
        assert_eq!(data(Some(&packed)), json!({"job": 42}));
        // Not text, and not one whole MessagePack value: a value and a stray byte after it.
        assert_eq!(
            data(Some(&[0x92, 0x01, 0x02, 0xc1])),
            json!({"hex": "920102c1"})
        );
        assert_eq!(data(None), Value::Null);
    }

    #[test]
    fn long_cells_are_cut_and_keys_are_snake_case() {
        assert_eq!(cut("x".repeat(100)).chars().count(), MAX_CELL);
        assert_eq!(text(&json!("x".repeat(100))).len(), 100);
        assert_eq!(text(&Value::Null), "-");
        assert_eq!(key("LAG AGE"), "lag_age");
    }
}
