//! The sequential specification the histories are checked against, and its variant that grants
//! a window's tokens in order.

use stateright::semantics::SequentialSpec;

use super::{Op, Ret};

/// The sequential specification: a lease whose grants carry increasing tokens, guarding a
/// register that only the latest grant's holder may write.
///
/// A lease also expires, which no operation shows: so a grant needs no release before it, and
/// a fence may refuse any token not newer than the last grant. What it must never do is accept
/// a token older than the last grant, or the last grant's after its release.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Fenced {
    /// The highest token granted.
    pub granted: i64,
    /// Whether the highest grant has not been released.
    pub open: bool,
    /// The register (0 before any write).
    pub value: i64,
}

impl SequentialSpec for Fenced {
    type Op = Op;
    type Ret = Ret;

    // What an operation in flight did if it took effect: the weakest of its outcomes.
    fn invoke(&mut self, op: &Op) -> Ret {
        match *op {
            Op::Acquire => {
                self.granted += 1;
                self.open = true;
                Ret::Granted(self.granted)
            }
            Op::Write { token, value } if token == self.granted && self.open => {
                self.value = value;
                Ret::Written
            }
            Op::Write { .. } => Ret::Rejected,
            Op::Read => Ret::Value(self.value),
            Op::Release { token } if token == self.granted && self.open => {
                self.open = false;
                Ret::Released
            }
            Op::Release { .. } => Ret::Lost,
        }
    }

    fn is_valid_step(&mut self, op: &Op, ret: &Ret) -> bool {
        match (*op, *ret) {
            (Op::Acquire, Ret::Granted(token)) if token > self.granted => {
                self.granted = token;
                self.open = true;
                true
            }
            (Op::Acquire, Ret::NotGranted) => true,
            (Op::Write { token, value }, Ret::Written) if token == self.granted && self.open => {
                self.value = value;
                true
            }
            // The lease may have expired unseen.
            (Op::Write { token, .. }, Ret::Rejected) => token <= self.granted,
            (Op::Read, Ret::Value(value)) => value == self.value,
            (Op::Release { token }, Ret::Released) if token == self.granted && self.open => {
                self.open = false;
                true
            }
            (Op::Release { token }, Ret::Lost) => token <= self.granted,
            _ => false,
        }
    }
}

/// [`Fenced`] that also refuses a grant while one of the window's lower tokens is still to
/// come. Any linearization grants them in increasing order, so this changes no verdict; but
/// the tester, which tries threads in a fixed order and remembers no dead end, would otherwise
/// place a grant too early and try every order of the operations after it before backing out.
#[derive(Debug, Clone)]
pub(super) struct InOrder {
    pub(super) spec: Fenced,
    /// The tokens granted in the window, in increasing order.
    pub(super) grants: std::sync::Arc<[i64]>,
}

impl SequentialSpec for InOrder {
    type Op = Op;
    type Ret = Ret;

    fn invoke(&mut self, op: &Op) -> Ret {
        self.spec.invoke(op)
    }

    fn is_valid_step(&mut self, op: &Op, ret: &Ret) -> bool {
        if let Ret::Granted(token) = *ret {
            let granted = self.spec.granted;
            let skips = self.grants.iter().any(|&t| granted < t && t < token);
            if skips {
                return false;
            }
        }
        self.spec.is_valid_step(op, ret)
    }
}
