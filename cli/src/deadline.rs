//! `--timeout` for one-shot commands: the whole command within it, and a statement still under
//! way when it passes cancelled on the server — dropping it here would leave it running there
//! (a lowered limit's take-back waiting for a fenced row).

use std::sync::OnceLock;
use std::time::Duration;

use pgcoord::{Config, ErrorKind};
use tokio_postgres::CancelToken;

/// At most this much of `--timeout` (and at most a quarter of it) is kept for sending a
/// timed-out command's cancel request.
const CANCEL_WITHIN: Duration = Duration::from_secs(1);

/// Runs `work` within `within`, the cancel request included: past its share, the statement of
/// the connection whose token is in `cancel` (if one was made) is cancelled on the server, and
/// the error says what became of it.
pub(crate) async fn bounded<T>(
    config: &Config,
    within: Duration,
    cancel: &OnceLock<CancelToken>,
    work: impl Future<Output = pgcoord::Result<T>>,
) -> pgcoord::Result<T> {
    let cancelling = (within / 4).min(CANCEL_WITHIN);
    let Ok(done) = tokio::time::timeout(within - cancelling, work).await else {
        let what = match cancel.get() {
            None => "no statement was under way".to_owned(),
            Some(token) => {
                let tls = config.session_tls().clone();
                match tokio::time::timeout(cancelling, token.cancel_query(tls)).await {
                    Ok(Ok(())) => "its statement was cancelled on the server (a change may or may \
                                   not have taken effect)"
                        .to_owned(),
                    Ok(Err(e)) => format!("cancelling its statement on the server failed: {e}"),
                    Err(_) => "its statement's cancel request was not answered in time".to_owned(),
                }
            }
        };
        return Err(pgcoord::Error::new(
            ErrorKind::Timeout,
            format!("the database did not answer within {within:?} (--timeout); {what}"),
        ));
    };
    done
}
