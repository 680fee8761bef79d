use super::*;

fn at(secs: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(secs)
}

fn every(secs: u64) -> Timing {
    Timing::every(Duration::from_secs(secs)).unwrap()
}

fn seen(now: u64, last: Option<u64>) -> Observed {
    Observed {
        now: at(now),
        last: last.map(at),
        unfinished: None,
    }
}

fn policy(catch_up: CatchUp) -> Policy {
    Policy {
        catch_up,
        ..Policy::default()
    }
}

#[test]
fn periodic_ticks_are_multiples_of_the_period_since_the_epoch_plus_the_offset() {
    let t = every(10);
    assert_eq!(t.next_after(at(95)), Some(at(100)));
    assert_eq!(t.next_after(at(100)), Some(at(110)), "strictly after");
    assert_eq!(t.latest_at_or_before(at(100)), Some(at(100)));
    assert_eq!(t.latest_at_or_before(at(109)), Some(at(100)));
    let t = every(10).offset(Duration::from_secs(3)).unwrap();
    assert_eq!(t.next_after(at(95)), Some(at(103)));
    assert_eq!(t.latest_at_or_before(at(102)), Some(at(93)));
    assert_eq!(t.previous(at(103)), Some(at(93)));
}

#[test]
fn bad_timings_are_typed_errors() {
    let short = Timing::every(Duration::from_millis(9)).unwrap_err();
    assert_eq!(short.kind(), ErrorKind::DurationTooSmall);
    let offset = every(10).offset(Duration::from_secs(10)).unwrap_err();
    assert_eq!(offset.kind(), ErrorKind::InvalidConfig);
    let cron = Timing::cron("61 * * * *").unwrap_err();
    assert_eq!(cron.kind(), ErrorKind::InvalidConfig);
    assert!(cron.to_string().contains("61 * * * *"), "{cron}");
    let never = Timing::cron("0 0 30 2 *").unwrap_err();
    assert_eq!(never.kind(), ErrorKind::InvalidConfig);
}

#[test]
fn cron_ticks_in_utc() {
    let t = Timing::cron("30 2 * * *").unwrap(); // 02:30 every day
    let day = 86_400;
    assert_eq!(t.next_after(at(0)), Some(at(2 * 3600 + 1800)));
    assert_eq!(
        t.latest_at_or_before(at(day + 3 * 3600)),
        Some(at(day + 2 * 3600 + 1800))
    );
    let t = Timing::cron("*/5 * * * * *").unwrap(); // seconds first: every 5 s
    assert_eq!(t.next_after(at(101)), Some(at(105)));
}

#[test]
fn a_new_schedule_starts_with_the_first_tick_after_its_runner_started() {
    let p = Policy::default();
    // Started at 95: 90 is not run, 100 is.
    assert_eq!(
        plan(&every(10), &p, &seen(99, None), at(95)),
        Next::WaitUntil(at(100))
    );
    assert_eq!(
        plan(&every(10), &p, &seen(100, None), at(95)),
        Next::Run {
            tick: at(100),
            retry: false
        }
    );
}

#[test]
fn a_tick_that_has_a_row_is_not_run_again() {
    let p = Policy::default();
    assert_eq!(
        plan(&every(10), &p, &seen(105, Some(100)), at(0)),
        Next::WaitUntil(at(110))
    );
}

#[test]
fn missed_ticks_follow_the_catch_up_policy() {
    // Last run 100, now 155: 110..150 were missed.
    let s = seen(155, Some(100));
    let run = |tick| Next::Run {
        tick: at(tick),
        retry: false,
    };
    assert_eq!(
        plan(&every(10), &policy(CatchUp::Latest), &s, at(0)),
        run(150)
    );
    assert_eq!(
        plan(&every(10), &policy(CatchUp::Each { max: 100 }), &s, at(0)),
        run(110)
    );
    assert_eq!(
        plan(&every(10), &policy(CatchUp::Each { max: 2 }), &s, at(0)),
        run(140),
        "the newest two of the missed"
    );
    let grace = |secs| CatchUp::Skip {
        grace: Duration::from_secs(secs),
    };
    assert_eq!(plan(&every(10), &policy(grace(5)), &s, at(0)), run(150));
    assert_eq!(
        plan(&every(10), &policy(grace(4)), &s, at(0)),
        Next::WaitUntil(at(160)),
        "150 is 5 s late"
    );
}

#[test]
fn failed_ticks_are_retried_after_a_doubling_backoff_then_abandoned() {
    let p = Policy {
        catch_up: CatchUp::Latest,
        max_attempts: 3,
        retry_backoff: Duration::from_secs(2),
    };
    let failed = |attempts, finished| {
        Observed {
            now: at(105),
            last: None,
            unfinished: Some(Unfinished {
                tick: at(100),
                state: RunState::Failed,
                attempts,
                finished_at: Some(at(finished)),
            }),
        }
        .with_last(100)
    };
    assert_eq!(
        plan(&every(10), &p, &failed(1, 103), at(0)),
        Next::Run {
            tick: at(100),
            retry: true
        }
    );
    // The second retry waits 4 s.
    assert_eq!(
        plan(&every(10), &p, &failed(2, 103), at(0)),
        Next::WaitUntil(at(107))
    );
    assert_eq!(
        plan(&every(10), &p, &failed(3, 103), at(0)),
        Next::Abandon { tick: at(100) }
    );
    // Left running by a process that is gone: at once.
    let mut orphan = failed(1, 103);
    orphan.unfinished.as_mut().unwrap().state = RunState::Running;
    orphan.unfinished.as_mut().unwrap().finished_at = None;
    assert_eq!(
        plan(&every(10), &p, &orphan, at(0)),
        Next::Run {
            tick: at(100),
            retry: true
        }
    );
}

#[test]
fn a_retry_not_yet_due_does_not_hold_back_a_new_tick() {
    let p = Policy {
        retry_backoff: Duration::from_secs(60),
        ..Policy::default()
    };
    let s = Observed {
        now: at(111),
        last: Some(at(100)),
        unfinished: Some(Unfinished {
            tick: at(100),
            state: RunState::Failed,
            attempts: 1,
            finished_at: Some(at(101)),
        }),
    };
    assert_eq!(
        plan(&every(10), &p, &s, at(0)),
        Next::Run {
            tick: at(110),
            retry: false
        }
    );
}

trait WithLast {
    fn with_last(self, last: u64) -> Observed;
}

impl WithLast for Observed {
    fn with_last(mut self, last: u64) -> Observed {
        self.last = Some(at(last));
        self
    }
}
