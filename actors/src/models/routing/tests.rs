use stateright::Checker;

use super::*;

/// A lease lost and a member draining: the key moves, twice.
const MOVES: Faults = Faults {
    losses: 1,
    drain: true,
    ..CALM
};
/// No move: every send after "not here" reaches the member that has the message.
const STAYS: Faults = Faults {
    duplicates: 1,
    forged: 1,
    ..CALM
};

fn check(what: &str, keys: usize, faults: Faults, mutant: Mutant) -> impl Checker<Routing> {
    super::super::explore(
        &format!("routing {what} {mutant:?}, {keys} key(s)"),
        Routing::new(keys, faults, mutant),
    )
}

#[test]
fn a_routed_ask_is_handled_at_most_once_and_only_under_its_keys_lease_as_the_key_moves() {
    check("moves", 1, MOVES, Mutant::None).assert_properties();
}

#[test]
fn a_joining_member_takes_its_share_a_draining_one_hands_it_over_and_every_key_is_held() {
    let faults = Faults {
        join: true,
        ..MOVES
    };
    check("join", 2, faults, Mutant::None).assert_properties();
}

#[test]
fn a_forged_not_here_or_a_duplicate_while_the_key_stays_is_answered_from_memory() {
    check("stays", 1, STAYS, Mutant::None).assert_properties();
}

#[test]
fn a_router_that_sends_again_after_no_answer_has_a_moved_ask_handled_twice() {
    check("moves", 1, MOVES, Mutant::ResendOnTimeout)
        .assert_any_discovery("a routed ask is handled at most once");
}

#[test]
fn a_member_that_forgets_what_it_delivered_handles_a_duplicate_twice() {
    check("stays", 1, STAYS, Mutant::Forgetful)
        .assert_any_discovery("a routed ask is handled at most once");
}

#[test]
fn a_member_that_delivers_on_a_notifications_word_handles_a_key_another_holds() {
    check("moves", 1, MOVES, Mutant::DeliverWithoutLease)
        .assert_any_discovery("a message is handled only where its key's lease is held");
}

/// The limit route.rs states, not a bug: a "not here" forged while the key moves sends the
/// message again to the new holder, which never saw its id.
#[test]
fn limit_a_forged_not_here_while_the_key_moves_has_the_ask_handled_twice() {
    let faults = Faults { forged: 1, ..MOVES };
    check("forged, moves", 1, faults, Mutant::None)
        .assert_any_discovery("a routed ask is handled at most once");
}

/// The same limit, by a replay: a copy of the request delivered after its member answered
/// "not here" to the first (it held the key's lease, its worker not yet started), then the
/// key moves and the router's send again reaches the new holder. PostgreSQL delivers each
/// notification once: only someone who can NOTIFY replays one.
#[test]
fn limit_a_replayed_request_while_the_key_moves_has_the_ask_handled_twice() {
    let faults = Faults {
        duplicates: 1,
        ..MOVES
    };
    check("replayed, moves", 1, faults, Mutant::None)
        .assert_any_discovery("a routed ask is handled at most once");
}
