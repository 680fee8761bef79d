//! The search for a linearization of one window, with a memory of dead ends.
//!
//! This is Wing and Gong's search with Lowe's memory, as porcupine (etcd's checker) runs it:
//! linearize next any operation that nothing still to place must precede; back out of a dead
//! end; and remember each dead end as the set of operations placed and the state they left,
//! so it is never searched again. Without the memory the search costs every order of the
//! concurrent operations (stateright's tester has none: a window of a long run, where a paused
//! process's read overlaps hundreds of operations, did not finish in 25 minutes). With it, a
//! window costs at most its distinct (placed set, state) pairs, which the lease's total order
//! keeps few.
//!
//! stateright's tester stays the reference: `check_by_stateright` runs it on the same
//! windows, and the checker's tests require both to agree.

use std::collections::HashSet;

use stateright::semantics::SequentialSpec;

use super::spec::Fenced;
use super::{Record, Ret};

/// The set of a window's operations placed so far.
#[derive(Clone, PartialEq, Eq, Hash)]
struct Placed(Vec<u64>);

impl Placed {
    fn new(n: usize) -> Placed {
        Placed(vec![0; n.div_ceil(64)])
    }
    fn has(&self, i: usize) -> bool {
        self.0[i / 64] & (1 << (i % 64)) != 0
    }
    fn with(&self, i: usize) -> Placed {
        let mut next = self.clone();
        next.0[i / 64] |= 1 << (i % 64);
        next
    }
}

/// The state after a linearization of every completed operation of `window` (and of any of
/// its operations in flight) from `start`, if there is one. `steps` counts the states visited.
pub(super) fn linearize(window: &[Record], start: Fenced, steps: &mut u64) -> Option<Fenced> {
    // Each operation's thread's operation before it in the window.
    let mut last: std::collections::HashMap<u32, usize> = std::collections::HashMap::new();
    let mut previous = vec![None; window.len()];
    let mut order: Vec<usize> = (0..window.len()).collect();
    order.sort_by_key(|&i| window[i].invoked);
    for i in order {
        previous[i] = last.insert(window[i].thread, i);
    }
    let mut search = Search {
        window,
        previous,
        steps,
        dead: HashSet::new(),
    };
    search.from(Placed::new(window.len()), start)
}

struct Search<'a> {
    window: &'a [Record],
    /// Each operation's thread's operation before it, which must be placed first.
    previous: Vec<Option<usize>>,
    steps: &'a mut u64,
    /// (placed, state) pairs from which no linearization completes the window.
    dead: HashSet<(Placed, Fenced)>,
}

impl Search<'_> {
    fn from(&mut self, placed: Placed, state: Fenced) -> Option<Fenced> {
        let window = self.window;
        // An operation may go next when every completed operation that returned before it was
        // invoked is placed (one in flight precedes nothing: it may never take effect).
        let horizon = (0..window.len())
            .filter(|&i| !placed.has(i))
            .filter_map(|i| Some(window[i].returned?.0))
            .min();
        let Some(horizon) = horizon else {
            return Some(state); // every completed operation placed
        };
        if !self.dead.insert((placed.clone(), state)) {
            return None;
        }
        *self.steps += 1;
        for (i, r) in window.iter().enumerate() {
            let ready = self.previous[i].is_none_or(|p| placed.has(p));
            if placed.has(i) || r.invoked > horizon || !ready {
                continue;
            }
            let mut next = state;
            let valid = match r.returned {
                Some((_, ret)) => {
                    next.is_valid_step(&r.op, &ret) && grants_in_order(window, &placed, state, ret)
                }
                // In flight: it took effect here (its weakest outcome), or later, or never.
                None => {
                    next.invoke(&r.op);
                    true
                }
            };
            if valid && let Some(end) = self.from(placed.with(i), next) {
                return Some(end);
            }
        }
        None
    }
}

/// A grant must not skip a lower token of the window still to be placed: any linearization
/// grants them in increasing order, so this changes no verdict and prunes early.
fn grants_in_order(window: &[Record], placed: &Placed, state: Fenced, ret: Ret) -> bool {
    let Ret::Granted(token) = ret else {
        return true;
    };
    !(window.iter().enumerate()).any(|(j, p)| {
        !placed.has(j)
            && matches!(p.returned, Some((_, Ret::Granted(t))) if state.granted < t && t < token)
    })
}
