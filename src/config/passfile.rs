//! libpq's password file (`PGPASSFILE`, else `~/.pgpass`): its lines
//! (`host:port:database:user:password`), how a connection finds its password there, and the
//! permission check that makes libpq ignore a file others may read.

/// What reading the password file found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Passfile {
    /// The file's text.
    Read(String),
    /// Group or others may read the file: ignored, as libpq ignores it.
    TooOpen,
    /// No file there, or it cannot be read.
    Missing,
}

/// Where the password file is: `PGPASSFILE`, else `~/.pgpass`.
pub(super) fn path(var: &dyn Fn(&str) -> Option<String>) -> Option<String> {
    var("PGPASSFILE").or_else(|| var("HOME").map(|home| format!("{home}/.pgpass")))
}

/// The password file at `path`, as libpq reads it: ignored, with libpq's warning, when group or
/// others may read it.
pub(crate) fn load(path: &str) -> Passfile {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let Ok(metadata) = std::fs::metadata(path) else {
            return Passfile::Missing;
        };
        if metadata.permissions().mode() & 0o077 != 0 {
            tracing::warn!(
                path,
                "password file has group or world access; permissions should be u=rw (0600) or \
                 less: ignored"
            );
            return Passfile::TooOpen;
        }
    }
    match std::fs::read_to_string(path) {
        Ok(text) => Passfile::Read(text),
        Err(_) => Passfile::Missing,
    }
}

/// The password file's text; none when it cannot be read or others may read it (libpq ignores
/// such a file too).
pub(super) fn read_passfile(path: &str) -> Option<String> {
    match load(path) {
        Passfile::Read(text) => Some(text),
        Passfile::TooOpen | Passfile::Missing => None,
    }
}

/// The password for `pg` in the password file's text `passwords`, as libpq looks it up: the
/// first host (a socket directory is `localhost`; without a host name, the first `hostaddr`)
/// and port (default 5432), the database (default: the user), the user (default: `os_user`).
pub(super) fn password_in(
    passwords: &str,
    pg: &tokio_postgres::Config,
    os_user: Option<String>,
) -> Option<String> {
    use tokio_postgres::config::Host;
    let user = pg.get_user().map(str::to_owned).or(os_user)?;
    // A socket directory matches `localhost`, as in libpq.
    let host = match (pg.get_hosts().first(), pg.get_hostaddrs().first()) {
        (Some(Host::Tcp(host)), _) => host.clone(),
        (None, Some(address)) => address.to_string(),
        _ => "localhost".to_owned(),
    };
    let port = pg.get_ports().first().copied().unwrap_or(5432).to_string();
    let dbname = pg.get_dbname().unwrap_or(&user).to_owned();
    password_for(passwords, &host, &port, &dbname, &user)
}

/// The first line of a password file (`host:port:database:user:password`, `*` matching
/// anything, `\:` and `\\` escaped) that matches.
pub(super) fn password_for(
    passwords: &str,
    host: &str,
    port: &str,
    dbname: &str,
    user: &str,
) -> Option<String> {
    for line in passwords.lines() {
        if line.trim_start().starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let fields = split_fields(line);
        let [h, p, d, u, password] = fields.as_slice() else {
            continue;
        };
        let matches = |field: &str, value: &str| field == "*" || field == value;
        if matches(h, host) && matches(p, port) && matches(d, dbname) && matches(u, user) {
            return Some(password.clone());
        }
    }
    None
}

/// A line's fields: split at unescaped `:`, with `\:` and `\\` unescaped.
fn split_fields(line: &str) -> Vec<String> {
    let (mut fields, mut field) = (Vec::new(), String::new());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => field.extend(chars.next()),
            ':' if fields.len() < 4 => fields.push(std::mem::take(&mut field)),
            c => field.push(c),
        }
    }
    fields.push(field);
    fields
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dsn_without_a_password_gets_the_password_files() {
        let file = "other:5432:app:svc:wrong\ndb.internal:6432:app:svc:right\n*:*:*:*:any\n";
        let pg = |dsn: &str| dsn.parse::<tokio_postgres::Config>().unwrap();
        let found = |dsn: &str| password_in(file, &pg(dsn), Some("os".into()));
        assert_eq!(
            found("host=db.internal port=6432 user=svc dbname=app").as_deref(),
            Some("right")
        );
        // Defaults: port 5432, the database named as the user, the system's user.
        assert_eq!(found("host=db.internal").as_deref(), Some("any"));
        let exact = "db.internal:5432:os:os:mine\n";
        let pg_default = pg("host=db.internal");
        assert_eq!(
            password_in(exact, &pg_default, Some("os".into())).as_deref(),
            Some("mine")
        );
        // A socket directory is `localhost`.
        let local = "localhost:5432:app:svc:sock\n";
        let socket = pg("host=/var/run/postgresql user=svc dbname=app");
        assert_eq!(password_in(local, &socket, None).as_deref(), Some("sock"));
    }

    #[test]
    fn a_password_file_others_may_read_is_ignored() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pgpass");
        std::fs::write(&path, "*:*:*:*:secret\n").unwrap();
        let path_str = path.to_str().unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert_eq!(read_passfile(path_str), None);
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(read_passfile(path_str).is_some());
    }
}
