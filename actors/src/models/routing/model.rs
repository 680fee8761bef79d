//! The model proper: its first state, the actions each state allows, what each does, and the
//! properties checked.

use stateright::{Model, Property};

use super::*;

impl Model for Routing {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![State {
            ticks: 0,
            rounded: [false; 2],
            // `a`, and `b` unless it joins, are past their first round.
            live: [true, !self.faults.join],
            first: [false, self.faults.join],
            draining: [false; 2],
            holder: [None; 2],
            tenure: [[Tenure::Free; 2]; 2],
            losses: 0,
            router: Router::Idle,
            sends: 0,
            requests: Vec::new(),
            replies: Vec::new(),
            duplicated: 0,
            forged: 0,
            remembered: [false; 2],
            handled: 0,
            unleased: false,
            not_here: false,
            held_by: [false; 2],
        }]
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        // The pool.
        let active: Vec<usize> = self.members().filter(|&m| self.active(s, m)).collect();
        if s.ticks < HORIZON {
            if active.iter().all(|&m| s.rounded[m]) && self.settled(s) {
                actions.push(Action::Tick);
            }
            for &m in &active {
                if !s.rounded[m] {
                    actions.push(Action::Round(m));
                }
            }
        }
        if self.faulty(s) {
            if self.faults.join && !s.live[1] && !s.draining[1] {
                actions.push(Action::Join(1));
            }
            if self.faults.drain && s.live[1] {
                actions.push(Action::Drain(1));
            }
        }
        for m in self.members() {
            for k in self.keys() {
                match s.tenure[m][k] {
                    Tenure::Claiming => actions.push(Action::ClaimApplies(m, k)),
                    Tenure::Granted => actions.push(Action::Start(m, k)),
                    Tenure::Releasing => actions.push(Action::ReleaseApplies(m, k)),
                    _ => {}
                }
                let holds = matches!(s.tenure[m][k], Tenure::Granted | Tenure::Running);
                if holds && self.faulty(s) && s.losses < self.faults.losses {
                    actions.push(Action::Lose(m, k));
                }
            }
        }
        for k in self.keys() {
            if s.holder[k].is_some_and(|m| matches!(s.tenure[m][k], Tenure::Lost | Tenure::Free)) {
                actions.push(Action::Expire(k));
            }
        }
        // The router.
        match s.router {
            Router::Idle if s.sends < SENDS => actions.push(Action::Look),
            Router::Idle => actions.push(Action::Deadline),
            Router::Waiting(_) => {
                actions.push(Action::NoAnswer);
                if s.forged < self.faults.forged {
                    actions.push(Action::Forge);
                }
            }
            _ => {}
        }
        // The network: requests and answers arrive in any order, or not at all.
        for i in 0..s.requests.len() {
            if i > 0 && s.requests[i] == s.requests[i - 1] {
                continue;
            }
            actions.push(Action::Arrive(i));
            actions.push(Action::LoseRequest(i));
            if s.duplicated < self.faults.duplicates {
                actions.push(Action::Duplicate(i));
            }
        }
        for i in 0..s.replies.len() {
            if i > 0 && s.replies[i] == s.replies[i - 1] {
                continue;
            }
            actions.push(Action::Answer(i));
            actions.push(Action::LoseAnswer(i));
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut s = last.clone();
        match action {
            Action::Tick => {
                s.ticks += 1;
                s.rounded = [false; 2];
            }
            Action::Round(m) => {
                self.round(&mut s, m);
                s.rounded[m] = true;
            }
            Action::Join(m) => s.live[m] = true,
            Action::Drain(m) => self.drain(&mut s, m),
            Action::Lose(m, k) => {
                // Granted, the answer lost: the member never runs the key; its row expires.
                s.tenure[m][k] = Tenure::Lost;
                s.losses += 1;
            }
            Action::ClaimApplies(m, k) => claim_applies(&mut s, m, k),
            Action::Start(m, k) => s.tenure[m][k] = Tenure::Running,
            Action::ReleaseApplies(m, k) => {
                s.tenure[m][k] = Tenure::Free;
                s.holder[k] = None;
            }
            Action::Expire(k) => s.holder[k] = None,
            Action::Look => {
                // One statement: the holder by the server's clock, notified.
                s.sends += 1;
                if let Some(m) = s.holder[ASKED] {
                    insert(&mut s.requests, (m, s.sends));
                    s.router = Router::Waiting(s.sends);
                }
            }
            Action::NoAnswer => {
                s.router = match self.mutant {
                    Mutant::ResendOnTimeout if s.sends < SENDS => Router::Idle,
                    _ => Router::MaybeHandled,
                };
            }
            Action::Deadline => s.router = Router::NotDelivered,
            Action::Arrive(i) => self.arrive(&mut s, i),
            Action::LoseRequest(i) => {
                s.requests.remove(i);
            }
            Action::Duplicate(i) => {
                let copy = s.requests[i];
                insert(&mut s.requests, copy);
                s.duplicated += 1;
            }
            Action::Answer(i) => answer(&mut s, i),
            Action::LoseAnswer(i) => {
                s.replies.remove(i);
            }
            Action::Forge => {
                let Router::Waiting(send) = s.router else {
                    return None;
                };
                insert(&mut s.replies, (send, Reply::NotHere));
                s.forged += 1;
            }
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        let mut properties = vec![
            Property::always("a routed ask is handled at most once", |_, s: &State| {
                s.handled <= 1
            }),
            Property::always(
                "a message is handled only where its key's lease is held",
                |_, s: &State| !s.unleased,
            ),
            Property::always(
                "a key runs on one member at a time",
                |m: &Routing, s: &State| {
                    (m.keys()).all(|k| {
                        (m.members())
                            .all(|i| s.tenure[i][k] != Tenure::Running || s.holder[k] == Some(i))
                    })
                },
            ),
            Property::eventually(
                "every key is held once the faults stop",
                |m: &Routing, s: &State| {
                    s.ticks == HORIZON
                        && (m.keys()).all(|k| {
                            s.holder[k]
                                .is_some_and(|i| s.live[i] && s.tenure[i][k] == Tenure::Running)
                        })
                },
            ),
            // The model reaches what it is about: a send again after "not here", answered.
            Property::sometimes("an ask is answered after a not here", |_, s: &State| {
                s.not_here && s.router == Router::Answered
            }),
        ];
        if self.faults.losses > 0 || self.faults.join || self.faults.drain {
            properties.push(Property::sometimes(
                "an ask is answered after its key moved",
                |_, s: &State| {
                    s.router == Router::Answered && s.held_by.iter().filter(|&&h| h).count() > 1
                },
            ));
        }
        properties
    }
}

/// Member `m`'s claim of key `k` reaches the table: a grant only of a free row.
fn claim_applies(s: &mut State, m: usize, k: usize) {
    if s.holder[k].is_none() {
        s.holder[k] = Some(m);
        s.tenure[m][k] = Tenure::Granted;
        if k == ASKED {
            s.held_by[m] = true;
        }
    } else {
        s.tenure[m][k] = Tenure::Free;
    }
}

/// Answer `i` reaches the router; an answer to an earlier send is dropped: nobody waits for it.
fn answer(s: &mut State, i: usize) {
    let (send, reply) = s.replies.remove(i);
    if s.router == Router::Waiting(send) {
        s.router = match reply {
            Reply::Handled => Router::Answered,
            Reply::NotHere => {
                s.not_here = true;
                Router::Idle
            }
        };
    }
}
