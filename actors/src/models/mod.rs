//! The protocols model-checked (`stateright`), each model calling the pure rooms' own code — the
//! holding side's book (`leases::book`), one wait's decisions (`leases::one_wait`), the doorbell's gate (`signals::doorbell`), a schedule's plan (`pgcoord::schedule::plan`) — so the checker checks the code, not a copy. Each
//! model runs bounded here, in the unit tests, with its properties asserted; and each has
//! mutants (a margin dropped, a deadline counted from the wrong instant, an assumption broken)
//! for which a test expects a counterexample, so a model that cannot fail is seen to fail.
//! docs/DESIGN.md's invariant index names the property each checks.

mod doorbell;
mod holding;
mod schedule;
mod wait;
