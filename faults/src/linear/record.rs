//! The history's lines — operations, outcomes, events — and the recorder that writes them.

/// The machine's monotonic clock in ns, shared by every process of the machine.
pub fn now() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime(2) writes one timespec through a valid pointer to our own local.
    let result = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    assert_eq!(result, 0, "CLOCK_MONOTONIC is always there on Linux");
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// An operation on the fenced lock and its register.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Op {
    /// Take the lease.
    Acquire,
    /// A fenced critical section setting the register to `value` under `token`.
    Write {
        /// The token the writer holds.
        token: i64,
        /// The value written (unique in a history).
        value: i64,
    },
    /// Read the register, outside any lease.
    Read,
    /// Give the lease up.
    Release {
        /// The token released.
        token: i64,
    },
}

/// How an operation ended, when that is known.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Ret {
    /// The lease was granted with this token.
    Granted(i64),
    /// The lease was not granted (a wait that ended without it).
    NotGranted,
    /// The write committed.
    Written,
    /// The fence refused the token: nothing was written.
    Rejected,
    /// The register's value.
    Value(i64),
    /// The lease was released.
    Released,
    /// Nothing was held with the token any more.
    Lost,
}

/// What one line of a history says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum What {
    /// An operation was invoked.
    Invoke(Op),
    /// The worker's operation in progress ended: how, or `None` when unknown.
    Return(Option<Ret>),
}

/// One line of a history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// Who: one sequential worker (a manager of a holder process).
    pub worker: String,
    /// When, on [`now`]'s clock.
    pub at: u64,
    /// What happened.
    pub what: What,
}

impl Event {
    /// The event's line, `OP <worker> <at> invoke|return ...`.
    pub fn line(&self) -> String {
        let what = match self.what {
            What::Invoke(Op::Acquire) => "invoke acquire".to_string(),
            What::Invoke(Op::Write { token, value }) => format!("invoke write {token} {value}"),
            What::Invoke(Op::Read) => "invoke read".to_string(),
            What::Invoke(Op::Release { token }) => format!("invoke release {token}"),
            What::Return(None) => "return unknown".to_string(),
            What::Return(Some(Ret::Granted(token))) => format!("return granted {token}"),
            What::Return(Some(Ret::NotGranted)) => "return not-granted".to_string(),
            What::Return(Some(Ret::Written)) => "return written".to_string(),
            What::Return(Some(Ret::Rejected)) => "return rejected".to_string(),
            What::Return(Some(Ret::Value(value))) => format!("return value {value}"),
            What::Return(Some(Ret::Released)) => "return released".to_string(),
            What::Return(Some(Ret::Lost)) => "return lost".to_string(),
        };
        format!("OP {} {} {what}", self.worker, self.at)
    }

    /// The event a line says, if it is one.
    pub fn parse(line: &str) -> Option<Event> {
        let words: Vec<&str> = line.strip_prefix("OP ")?.split(' ').collect();
        let number = |i: usize| words.get(i)?.parse::<i64>().ok();
        let what = match words.get(2..)? {
            ["invoke", "acquire"] => What::Invoke(Op::Acquire),
            ["invoke", "write", ..] => What::Invoke(Op::Write {
                token: number(4)?,
                value: number(5)?,
            }),
            ["invoke", "read"] => What::Invoke(Op::Read),
            ["invoke", "release", _] => What::Invoke(Op::Release { token: number(4)? }),
            ["return", "unknown"] => What::Return(None),
            ["return", "granted", _] => What::Return(Some(Ret::Granted(number(4)?))),
            ["return", "not-granted"] => What::Return(Some(Ret::NotGranted)),
            ["return", "written"] => What::Return(Some(Ret::Written)),
            ["return", "rejected"] => What::Return(Some(Ret::Rejected)),
            ["return", "value", _] => What::Return(Some(Ret::Value(number(4)?))),
            ["return", "released"] => What::Return(Some(Ret::Released)),
            ["return", "lost"] => What::Return(Some(Ret::Lost)),
            _ => return None,
        };
        Some(Event {
            worker: words.first()?.to_string(),
            at: words.get(1)?.parse().ok()?,
            what,
        })
    }
}

/// The events among a process's report lines (the other lines are left out).
pub fn events<S: AsRef<str>>(lines: &[S]) -> Vec<Event> {
    lines
        .iter()
        .filter_map(|l| Event::parse(l.as_ref()))
        .collect()
}

/// Records one worker's operations: printed as report lines (a holder process), or kept (a
/// test's own worker).
#[derive(Debug)]
pub struct Recorder {
    worker: String,
    print: bool,
    kept: Vec<String>,
}

impl Recorder {
    /// A recorder printing each event on standard output at once.
    pub fn printing(worker: &str) -> Recorder {
        Recorder {
            worker: worker.to_string(),
            print: true,
            kept: Vec::new(),
        }
    }

    /// A recorder keeping its lines, for [`Recorder::lines`].
    pub fn keeping(worker: &str) -> Recorder {
        Recorder {
            print: false,
            ..Recorder::printing(worker)
        }
    }

    /// Records that `op` starts now: call it just before the call.
    pub fn invoke(&mut self, op: Op) {
        self.record(What::Invoke(op));
    }

    /// Records that the operation in progress ended now with `outcome` (`None`: unknown).
    pub fn complete(&mut self, outcome: Option<Ret>) {
        self.record(What::Return(outcome));
    }

    /// The lines kept so far.
    pub fn lines(&self) -> &[String] {
        &self.kept
    }

    fn record(&mut self, what: What) {
        let line = Event {
            worker: self.worker.clone(),
            at: now(),
            what,
        }
        .line();
        if self.print {
            crate::program::say(&line);
        } else {
            self.kept.push(line);
        }
    }
}
