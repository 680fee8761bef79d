//! The checks [`ConfigBuilder::build`] runs: each setting validated, with its typed error — the
//! connections and their TLS, the tables' and channels' names, the durations and the pool size.

use std::time::Duration;

use super::ConfigBuilder;
use super::SEQUENCE_SUFFIX;
use super::connection::{Connection, Settings};
use crate::error::{Error, ErrorKind, Result};
use crate::ident::{Ident, QualifiedName};
use crate::tls::{RootCerts, Tls, TlsRequest};

impl ConfigBuilder {
    /// The pool's and the sessions' connection settings, taken out of the builder, with its
    /// settings applied, DSNs completed from the environment `var` reads, and TLS resolved; the
    /// sessions' are the pool's unless set apart.
    pub(super) fn connections(
        &mut self,
        var: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Connections> {
        let connection = std::mem::replace(&mut self.connection, Connection::Unset);
        let session = std::mem::replace(&mut self.session, Connection::Unset);
        let settings = Settings {
            application_name: self.application_name.as_deref(),
            connect_timeout: self.connect_timeout,
            lease: self.lease,
            tcp_user_timeout: self.tcp_user_timeout,
            var,
        };
        let pool = match connection {
            Connection::Unset => {
                return Err(Error::new(
                    ErrorKind::InvalidConfig,
                    "no connection: call dsn() or pg_config()",
                ));
            }
            connection => settings.apply(connection)?,
        };
        let mut pg = pool.pg;
        let tls = self.tls_over(pool.tls).resolve(&mut pg)?;
        let mut ignored_passfile = pool.ignored_passfile;
        let (session_pg, session_tls) = match session {
            Connection::Unset => (pg.clone(), tls.clone()),
            session => {
                let session = settings.apply(session)?;
                let mut session_pg = session.pg;
                let session_tls = self.tls_over(session.tls).resolve(&mut session_pg)?;
                ignored_passfile = ignored_passfile.or(session.ignored_passfile);
                (session_pg, session_tls)
            }
        };
        Ok(Connections {
            pg,
            session_pg,
            tls,
            session_tls,
            connect_timeout: pool.connect_timeout,
            ignored_passfile,
        })
    }

    /// What a connection's settings ask of TLS, with the builder's TLS settings over it.
    fn tls_over(&self, mut request: TlsRequest) -> TlsRequest {
        request.mode = self.ssl_mode.or(request.mode);
        if let Some(roots) = &self.ssl_root_cert {
            request.roots = Some(RootCerts::parse(roots));
        }
        #[cfg(feature = "tls")]
        {
            request.client_config = self.tls_client_config.clone();
        }
        request
    }

    /// The tables and channels, validated, in the schema when one is set; the derived ones
    /// (the sequence, the queue, the default channels) named after the lock table.
    pub(super) fn names(&self) -> Result<Names> {
        let schema = self.schema.as_deref().map(Ident::new).transpose()?;
        let lock_table = QualifiedName::parse(&self.lock_table, super::LOCK_SUFFIX_BYTES)?
            .in_schema(schema.as_ref());
        let lock_sequence = lock_table.suffixed(SEQUENCE_SUFFIX)?;
        let lock_queue = lock_table.suffixed(super::QUEUE_SUFFIX)?;
        let lease_channel = match &self.lease_channel {
            Some(channel) => Ident::channel(channel)?,
            None => lock_table.name().clone(),
        };
        // The lock table's name leaves room for the suffix (see LOCK_SUFFIX_BYTES).
        let election_channel = match &self.election_channel {
            Some(channel) => Ident::channel(channel)?,
            None => lock_table.name().suffixed("_ldr")?,
        };
        let payload_table =
            QualifiedName::parse(&self.payload_table, 0)?.in_schema(schema.as_ref());
        let topic_table = QualifiedName::parse(&self.topic_table, super::TOPIC_SUFFIX_BYTES)?
            .in_schema(schema.as_ref());
        let schedule_table =
            QualifiedName::parse(&self.schedule_table, super::SCHEDULE_SUFFIX_BYTES)?
                .in_schema(schema.as_ref());
        Ok(Names {
            lock_table,
            lock_sequence,
            lock_queue,
            lease_channel,
            election_channel,
            payload_table,
            topic_table,
            schedule_table,
        })
    }

    /// Every duration and the pool size in range; `connect_timeout` is the one in force (the
    /// connection settings' own, else the builder's).
    pub(super) fn check_values(&self, connect_timeout: Duration) -> Result<()> {
        if self.lease < Duration::from_millis(1) {
            return Err(Error::new(
                ErrorKind::DurationTooSmall,
                format!("lease {:?} is shorter than 1 ms", self.lease),
            ));
        }
        if self.heartbeat > self.lease / 2 {
            return Err(Error::new(
                ErrorKind::DurationTooSmall,
                format!(
                    "lease {:?} is too small for heartbeat {:?}: the heartbeat must be at most half the lease",
                    self.lease, self.heartbeat
                ),
            ));
        }
        for (what, value) in [
            ("ping interval", self.ping_interval),
            ("ping timeout", self.ping_timeout),
            ("pool timeout", self.pool_timeout),
            ("pool idle timeout", self.pool_idle_timeout),
            ("connect timeout", connect_timeout),
            ("statement timeout", self.statement_timeout),
            ("payload time-to-live", self.payload_ttl),
        ] {
            if value.is_zero() {
                return Err(Error::new(
                    ErrorKind::DurationTooSmall,
                    format!("{what} must not be zero"),
                ));
            }
        }
        let (initial, max) = self.backoff;
        if initial < Duration::from_millis(1) || max < initial {
            return Err(Error::new(
                ErrorKind::DurationTooSmall,
                format!(
                    "backoff {initial:?} to {max:?}: the initial delay must be at least 1 ms and at most the maximum"
                ),
            ));
        }
        if self.pool_size == 0 {
            return Err(Error::new(
                ErrorKind::InvalidConfig,
                "pool size must be at least 1",
            ));
        }
        Ok(())
    }
}

/// The connection settings [`ConfigBuilder::build`] derives, for the pool and the sessions.
pub(super) struct Connections {
    pub(super) pg: tokio_postgres::Config,
    pub(super) session_pg: tokio_postgres::Config,
    pub(super) tls: Tls,
    pub(super) session_tls: Tls,
    pub(super) connect_timeout: Duration,
    /// The password file, when a connection needed it and it was ignored for being readable by
    /// others.
    pub(super) ignored_passfile: Option<String>,
}

/// The tables and channels [`ConfigBuilder::build`] validates.
pub(super) struct Names {
    pub(super) lock_table: QualifiedName,
    pub(super) lock_sequence: QualifiedName,
    pub(super) lock_queue: QualifiedName,
    pub(super) lease_channel: Ident,
    pub(super) election_channel: Ident,
    pub(super) payload_table: QualifiedName,
    pub(super) topic_table: QualifiedName,
    pub(super) schedule_table: QualifiedName,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(builder: ConfigBuilder, connect_timeout: Duration) -> (ErrorKind, String) {
        let e = builder.check_values(connect_timeout).unwrap_err();
        (e.kind(), e.to_string())
    }

    #[test]
    fn values_are_checked_at_their_bounds() {
        let ms = Duration::from_millis;
        let five = Duration::from_secs(5);
        let ok = |builder: ConfigBuilder| builder.check_values(five).is_ok();
        assert!(ok(ConfigBuilder::default()));
        assert!(ok(ConfigBuilder::default().lease(ms(10)).heartbeat(ms(5))));
        assert!(ok(ConfigBuilder::default().backoff(ms(1), ms(1))));
        assert!(ok(ConfigBuilder::default().heartbeat(Duration::ZERO)));

        let (kind, text) = refused(
            ConfigBuilder::default().lease(ms(10)).heartbeat(ms(6)),
            five,
        );
        assert_eq!(kind, ErrorKind::DurationTooSmall);
        assert!(
            text.contains("the heartbeat must be at most half the lease"),
            "{text}"
        );
        let (kind, text) = refused(ConfigBuilder::default(), Duration::ZERO);
        assert_eq!(kind, ErrorKind::DurationTooSmall);
        assert!(text.contains("connect timeout must not be zero"), "{text}");
        let (kind, text) = refused(ConfigBuilder::default().payload_ttl(Duration::ZERO), five);
        assert_eq!(kind, ErrorKind::DurationTooSmall);
        assert!(
            text.contains("payload time-to-live must not be zero"),
            "{text}"
        );
        let (kind, _) = refused(ConfigBuilder::default().backoff(ms(2), ms(1)), five);
        assert_eq!(kind, ErrorKind::DurationTooSmall);
        let (kind, text) = refused(ConfigBuilder::default().pool_size(0), five);
        assert_eq!(kind, ErrorKind::InvalidConfig);
        assert!(text.contains("pool size must be at least 1"), "{text}");
    }

    #[test]
    fn the_builder_and_the_dsn_come_before_the_environment() {
        use crate::tls::SslMode;
        let env = |name: &str| {
            let value = match name {
                "PGHOST" => "env-host",
                "PGSSLMODE" => "disable",
                "PGAPPNAME" => "env-app",
                "PGCONNECT_TIMEOUT" => "9",
                _ => return None,
            };
            Some(value.to_owned())
        };
        let dsn = || ConfigBuilder::default().dsn("postgres:///db");
        let secs = Duration::from_secs;
        let mut builder = (dsn().ssl_mode(SslMode::Prefer))
            .application_name("mine")
            .connect_timeout(secs(2));
        let set = builder.connections(&env).unwrap();
        assert_eq!(set.tls.mode(), SslMode::Prefer);
        assert_eq!(set.pg.get_application_name(), Some("mine"));
        assert_eq!(set.connect_timeout, secs(2));
        assert_eq!(format!("{:?}", set.pg.get_hosts()), r#"[Tcp("env-host")]"#);
        let unset = dsn().connections(&env).unwrap();
        assert_eq!(unset.tls.mode(), SslMode::Disable);
        assert_eq!(unset.pg.get_application_name(), Some("env-app"));
        assert_eq!(unset.connect_timeout, secs(9));
        // The DSN's own connect timeout comes first, as before.
        let mut own = (ConfigBuilder::default().dsn("postgres:///db?connect_timeout=3"))
            .connect_timeout(secs(2));
        assert_eq!(own.connections(&env).unwrap().connect_timeout, secs(3));
    }
}
