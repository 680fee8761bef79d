//! The protocols model-checked (`stateright`), each model calling the pure rooms' own code — the
//! holding side's book (`leases::book`), one wait's decisions (`leases::one_wait`), the doorbell's
//! gate (`signals::doorbell`), a schedule's plan (`pgcoord::schedule::plan`), a worker pool's round
//! (`workers::plan`) and a member's verdict on a routed message (`workers::deliver::verdict`) — so
//! the checker checks the code, not a copy. The topic reader's model is the exception: its rule
//! is one SQL statement, which the model plays and an isolation spec checks. Each model runs
//! bounded here, in the unit tests, with its properties asserted; and each has mutants (a margin
//! dropped, a deadline counted from the wrong instant, an assumption broken, a read past the
//! horizon) for which a test expects a counterexample, so a model that cannot fail is seen to
//! fail. docs/DESIGN.md's invariant index names the property each checks.

mod doorbell;
mod holding;
mod routing;
mod schedule;
mod topic_reader;
mod wait;

/// Explores every state of `model` breadth first, and prints what it took (`what` names the
/// model and its variant): the figures docs/DESIGN.md quotes.
#[cfg(test)]
fn explore<M>(what: &str, model: M) -> impl stateright::Checker<M> + use<M>
where
    M: stateright::Model + Send + Sync + 'static,
    M::State: std::hash::Hash + Send + Sync + Clone + PartialEq + 'static,
    M::Action: Clone + PartialEq,
{
    use stateright::Checker;
    let started = std::time::Instant::now();
    let checker = model.checker().spawn_bfs().join();
    eprintln!(
        "{what}: {} states ({} unique), depth {}, {:?}",
        checker.state_count(),
        checker.unique_state_count(),
        checker.max_depth(),
        started.elapsed()
    );
    checker
}
