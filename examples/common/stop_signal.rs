//! SIGTERM and ctrl-c, for the web examples: what a service stops on, and then releases what it
//! holds (`Runtime::shutdown`, `Coordinator::shutdown`) before it exits.

/// SIGTERM and ctrl-c (SIGINT), listened for from the start.
pub struct StopSignal {
    terminate: tokio::signal::unix::Signal,
    interrupt: tokio::signal::unix::Signal,
}

impl StopSignal {
    pub fn install() -> std::io::Result<StopSignal> {
        use tokio::signal::unix::{SignalKind, signal};
        Ok(StopSignal {
            terminate: signal(SignalKind::terminate())?,
            interrupt: signal(SignalKind::interrupt())?,
        })
    }

    /// The next of them, named.
    pub async fn received(&mut self) -> &'static str {
        tokio::select! {
            _ = self.terminate.recv() => "SIGTERM",
            _ = self.interrupt.recv() => "ctrl-c",
        }
    }
}
