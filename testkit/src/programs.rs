//! The external programs some tests need (PgBouncer, tmux, libfaketime), and the one rule for
//! when one is missing: skip with a line naming the package to install, except where every test
//! must run (CI), which fails instead.

use std::io::Write;
use std::path::PathBuf;

/// Where `program` is: the first directory of `PATH` that has it, else `/usr/sbin` (Debian puts
/// PgBouncer there, off a user's `PATH`).
pub fn find_program(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    (std::env::split_paths(&path).chain([PathBuf::from("/usr/sbin")]))
        .map(|dir| dir.join(program))
        .find(|p| p.is_file())
}

/// [`find_program`] under the rule of [`require`].
pub fn require_program(program: &str, package: &str) -> Option<PathBuf> {
    require(find_program(program), program, package)
}

/// What a test found of an external thing it needs (`what`, from the Debian package
/// `package`), under the rule for a missing one: `None` after one line on stderr naming the
/// package, and the caller skips what needs it (a test returns, and passes). Where the environment variable
/// `CI` is set (non-empty) or `PGCOORD_REQUIRE_ALL=1`, a missing one panics instead: there no
/// test may be skipped silently.
pub fn require(found: Option<PathBuf>, what: &str, package: &str) -> Option<PathBuf> {
    if found.is_some() {
        return found;
    }
    let var = |name: &str| std::env::var(name).unwrap_or_default();
    let install = format!("Debian: apt-get install {package}");
    if !var("CI").is_empty() || var("PGCOORD_REQUIRE_ALL") == "1" {
        panic!(
            "{what} not found, and under CI or PGCOORD_REQUIRE_ALL=1 no test is skipped ({install})"
        );
    }
    // Straight to stderr, in one write: the test harness captures the print macros' output of
    // a passing test, and this line is for the person running the tests, whole.
    let line = format!("{what} not found: what needs it is skipped ({install})\n");
    let _ = std::io::stderr().write_all(line.as_bytes());
    None
}
