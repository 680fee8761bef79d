//! What the suite's programs (`src/bin/`) share: their arguments and the lines they report on.

/// The value after `--name` on the command line, if any.
pub fn arg(name: &str) -> Option<String> {
    let argv: Vec<String> = std::env::args().collect();
    let at = argv.iter().position(|a| a == name)?;
    argv.get(at + 1).cloned()
}

/// The value after `--name`; panics when it is missing (the test built the command wrong).
pub fn need(name: &str) -> String {
    arg(name).unwrap_or_else(|| panic!("{name} is required"))
}

/// The number after `--name`, or `default`.
pub fn number(name: &str, default: u64) -> u64 {
    arg(name).map_or(default, |v| v.parse().expect(name))
}

/// Whether `--name` is on the command line.
pub fn flag(name: &str) -> bool {
    std::env::args().any(|a| a == name)
}

/// Prints one report line at once (standard output is a pipe, so it is flushed by hand).
pub fn say(line: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}
