//! What an operator looks at, in one statement: every lock and the waiters' line (a live view
//! asks every second, so one statement a look instead of two).
//!
//! The statement is made of [`LeaseTable::list`]'s and [`LeaseTable::line`]'s own texts, so
//! their rules (what is held, what a live place is, the line's order) have one home.

use std::time::Duration;

use super::{LeaseTable, Place, info_at};
use crate::LeaseInfo;
use crate::error::Result;
use crate::statement::Statements;

/// Rows of two kinds, each in its listing's order: 0 a lock (columns 2–6: name, owner, token,
/// data, ms left), 1 a place (columns 2 and 7–10: name, waiter, priority, ms waited, ms left).
/// Each listing keeps its own order: its rows are numbered as its statement returns them.
pub(super) fn list_and_line_sql(list: &str, line: &str) -> String {
    format!(
        "WITH leases (name, owner, token, data, remaining, n) AS MATERIALIZED (
                  SELECT x.*, row_number() OVER () FROM ({list}) AS x),
              line (name, waiter, priority, waited, left_ms, n) AS MATERIALIZED (
                  SELECT x.*, row_number() OVER () FROM ({line}) AS x)
         SELECT 0 AS kind, n, name::text, owner::text, token, data, remaining,
                NULL::text, NULL::int4, NULL::int8, NULL::int8
         FROM leases
         UNION ALL
         SELECT 1, n, name, NULL, NULL, NULL, NULL, waiter, priority, waited, left_ms FROM line
         ORDER BY kind, n"
    )
}

impl LeaseTable {
    /// [`list`](Self::list) and [`line`](Self::line) in one statement, as one snapshot.
    pub async fn list_and_line(
        &self,
        client: &(impl Statements + ?Sized),
    ) -> Result<(Vec<LeaseInfo>, Vec<Place>)> {
        let rows = client.run(&self.list_and_line, &[]).await?;
        let (mut leases, mut line) = (Vec::new(), Vec::new());
        for row in &rows {
            match row.try_get::<_, i32>(0)? {
                0 => leases.push(info_at(row, 2)?),
                _ => line.push(place_from(row, [2, 7, 8, 9, 10])?),
            }
        }
        Ok((leases, line))
    }
}

/// A place from `row`'s columns at `at`: name, waiter, priority, ms waited, ms left.
pub(super) fn place_from(row: &tokio_postgres::Row, at: [usize; 5]) -> Result<Place> {
    let ms = |i: usize| -> Result<Duration> {
        let ms: i64 = row.try_get(i)?;
        Ok(Duration::from_millis(ms.max(0) as u64))
    };
    Ok(Place {
        name: row.try_get(at[0])?,
        waiter: row.try_get(at[1])?,
        priority: row.try_get(at[2])?,
        waited: ms(at[3])?,
        left: ms(at[4])?,
    })
}
