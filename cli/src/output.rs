//! Listings: columns as wide as their data, or with `--json` one JSON array of objects (one
//! per row, keyed by the column names) for scripts. Data is shown decoded, as `listen` does.

use serde_json::{Map, Value, json};

/// The widest the last column's cells (data, bodies: free-form values) are shown, cut at the
/// end; `--json` has every cell whole.
const MAX_CELL: usize = 80;

/// The widest the other columns' text (names, keys, owners) is shown: longer, its middle gives
/// way to `…`, keeping the prefix and the suffix (a key's tenant and its id) that tell keys
/// apart. A 200-character key would make every line of a listing some 300 columns wide.
const MAX_NAME: usize = 100;

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
        let mut shortened = false;
        let cells: Vec<Vec<String>> = (self.rows.iter())
            .map(|row| {
                let last = row.len() - 1;
                let mut cell = |(i, v): (usize, &Value)| {
                    let whole = text(v);
                    let shown = match (i == last, v) {
                        (true, _) => cut(whole.clone()),
                        (false, Value::String(_)) => cut_middle(whole.clone()),
                        (false, _) => return whole,
                    };
                    shortened |= shown != whole;
                    shown
                };
                row.iter().enumerate().map(&mut cell).collect()
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
        match shortened {
            true => println!(
                "{} {} (… marks text shortened: --json has it whole)",
                self.rows.len(),
                self.what
            ),
            false => println!("{} {}", self.rows.len(), self.what),
        }
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

/// `cell` cut to [`MAX_NAME`] characters in the middle.
fn cut_middle(cell: String) -> String {
    let length = cell.chars().count();
    if length <= MAX_NAME {
        return cell;
    }
    let head = (MAX_NAME - 1) / 2;
    let tail = MAX_NAME - 1 - head;
    let head: String = cell.chars().take(head).collect();
    let tail: String = cell.chars().skip(length - tail).collect();
    format!("{head}…{tail}")
}

// Stored data is shown as the live view shows it.
pub(crate) use pgcoord_ui::shown as data;

/// Seconds as a number with a tenth's precision, for `LEFT` and ages.
pub(crate) fn seconds(duration: std::time::Duration) -> Value {
    json!((duration.as_secs_f64() * 10.0).round() / 10.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_cells_are_cut_and_keys_are_snake_case() {
        assert_eq!(cut("x".repeat(100)).chars().count(), MAX_CELL);
        assert_eq!(text(&json!("x".repeat(100))).len(), 100);
        assert_eq!(text(&Value::Null), "-");
        let long = format!("tenant-7:{}:job-42", "x".repeat(200));
        let shown = cut_middle(long);
        assert_eq!(shown.chars().count(), MAX_NAME);
        assert!(
            shown.starts_with("tenant-7:xx") && shown.ends_with("xx:job-42"),
            "{shown}"
        );
        assert_eq!(cut_middle("short".into()), "short");
        assert_eq!(key("LAG AGE"), "lag_age");
    }
}
