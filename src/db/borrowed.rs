//! [`Borrowed`]: a connection borrowed from the application's bb8-postgres pool.
//!
//! pgcoord's own pool closes a connection on which a statement passed its deadline: the backend
//! may be hung, and nobody should inherit it. bb8 gives no way to close a connection of someone
//! else's pool (its manager decides, and bb8-postgres only drops closed clients), and giving it
//! back as it is would hand a hung backend to the application's next query. So a discarded
//! connection is kept out of the pool, on a task of its own, until it answers a ping within the
//! statement timeout (then it goes back) or closes (then bb8 drops it).

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio_postgres::{Client, Row};
use tracing::{debug, warn};

use crate::error::Result;
use crate::statement::{BoxFuture, Param, Session, Statements};
use crate::tls::Tls;

/// A connection of the application's bb8-postgres pool, whatever TLS connector that pool has.
pub(crate) type Loan = Box<dyn std::ops::Deref<Target = Client> + Send + Sync>;

/// How often a kept-aside connection is pinged at most.
const QUARANTINE_PING_EVERY: Duration = Duration::from_secs(1);

/// A connection of the application's pool, on loan to pgcoord.
pub struct Borrowed {
    conn: Option<Loan>,
    discarded: AtomicBool,
    statement_timeout: Duration,
    /// For cancel requests: pgcoord's TLS settings for the pool's server.
    tls: Tls,
}

impl Borrowed {
    pub(crate) fn new(conn: Loan, statement_timeout: Duration, tls: Tls) -> Borrowed {
        Borrowed {
            conn: Some(conn),
            discarded: AtomicBool::new(false),
            statement_timeout,
            tls,
        }
    }
}

impl crate::statement::Sealed for Borrowed {}

impl Statements for Borrowed {
    /// Statements go out with their types in one round trip (`query_typed`): nothing is
    /// prepared on a connection pgcoord does not own.
    fn run<'a>(&'a self, sql: &'a str, params: &'a [Param<'a>]) -> BoxFuture<'a, Result<Vec<Row>>> {
        Box::pin(async move { Ok(self.client().query_typed(sql, params).await?) })
    }
}

impl Session for Borrowed {
    fn client(&self) -> &Client {
        self.conn.as_ref().expect("present until dropped")
    }

    fn cancel(&self) {
        crate::statement::cancel(self.client(), self.tls.clone());
    }

    fn discard(&self) {
        self.discarded.store(true, Ordering::Relaxed);
    }
}

impl Drop for Borrowed {
    fn drop(&mut self) {
        let Some(conn) = self.conn.take() else { return };
        if !self.discarded.load(Ordering::Relaxed) || conn.is_closed() {
            // Healthy, or closed (bb8-postgres drops closed clients): bb8 decides.
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let bound = self.statement_timeout;
        runtime.spawn(async move {
            let mut failed = crate::backoff::Failures::default();
            loop {
                match super::ping(&conn, bound).await {
                    Ok(()) => {
                        let failed = failed.in_a_row();
                        debug!(failed, "a connection kept aside answers again; back to the pool");
                        return;
                    }
                    Err(_) if conn.is_closed() => return,
                    Err(e) => {
                        if failed.failed() {
                            let failed = failed.in_a_row();
                            warn!(error = %e, failed, "a connection of the application's pool does not answer; kept out of the pool");
                        }
                        tokio::time::sleep(QUARANTINE_PING_EVERY).await;
                    }
                }
            }
        });
    }
}
