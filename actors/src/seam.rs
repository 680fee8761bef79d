//! What the seams between the wings and their backends pass: a boxed future, and a caller's
//! client lent to a seam. Below every wing and every backend, so that none imports another to
//! name them.

use std::future::Future;
use std::pin::Pin;

use pgcoord::Result;

/// A boxed `Send` future that borrows nothing.
pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// A caller's client of any size as a `&dyn Statements`, for a seam that runs statements on it
/// (the fencing guard, a topic's ack).
pub(crate) struct Borrowed<'a, T: ?Sized>(pub(crate) &'a T);

impl<T: pgcoord::Statements + ?Sized> pgcoord::__private::Sealed for Borrowed<'_, T> {}

impl<T: pgcoord::Statements + ?Sized> pgcoord::Statements for Borrowed<'_, T> {
    fn run<'a>(
        &'a self,
        sql: &'a str,
        params: &'a [pgcoord::__private::Param<'a>],
    ) -> pgcoord::BoxFuture<'a, Result<Vec<tokio_postgres::Row>>> {
        self.0.run(sql, params)
    }
}
