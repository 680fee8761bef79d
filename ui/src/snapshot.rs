//! One look at the database, in two parts read at two paces: every second the leases and their
//! lines (one statement), and every [`REST_EVERY`] the rest — topics and their consumers, what
//! holds readers back, schedules' last runs, stored limits and rate-limit buckets, advisory
//! locks, the database's sessions (eight statements). An open page so costs the database under
//! two statements a second. Each part is read with the core's inspection functions, every
//! statement bounded by the look's deadline; the page's JSON is made of both and the history.

use std::collections::BTreeMap;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use pgcoord::advisory::AdvisoryLockInfo;
use pgcoord::lease::Place;
use pgcoord::rate::{Bucket, RateTable};
use pgcoord::schedule::{RunInfo, ScheduleTable};
use pgcoord::sessions::SessionInfo;
use pgcoord::topic::{ConsumerInfo, HeldBack, TopicInfo, TopicTable};
use pgcoord::{Config, LeaseInfo, LeaseTable, Pool, Result};
use serde_json::{Value, json};

use crate::history::{History, LagSample};

/// How often the slow part of a look is read: 8 statements every 15 s, beside the leases' one
/// about a second, is under 2 statements a second for any number of open pages.
pub(crate) const REST_EVERY: Duration = Duration::from_secs(15);

/// At most this many leases are sent to the page (the first by name); the count says how many
/// there are.
const LEASES_SHOWN: usize = 500;

/// The tables a look reads, their statements rendered once.
pub(crate) struct Tables {
    pub leases: LeaseTable,
    pub topics: TopicTable,
    pub schedules: ScheduleTable,
    pub rates: RateTable,
}

impl Tables {
    pub fn new(config: &Config) -> Tables {
        Tables {
            leases: LeaseTable::new(config),
            topics: TopicTable::new(config),
            schedules: ScheduleTable::new(config),
            rates: RateTable::new(config),
        }
    }
}

/// The part of a look read every second: the leases and their lines.
pub(crate) struct Snapshot {
    at: SystemTime,
    leases: Vec<LeaseInfo>,
    line: Vec<Place>,
}

/// The part read every [`REST_EVERY`].
pub(crate) struct Rest {
    at: SystemTime,
    topics: Vec<(TopicInfo, Vec<ConsumerInfo>)>,
    held_back: Option<HeldBack>,
    schedules: Vec<RunInfo>,
    limits: Vec<(String, u32)>,
    buckets: Vec<Bucket>,
    advisory: Vec<AdvisoryLockInfo>,
    sessions: Vec<SessionInfo>,
}

/// Reads the leases and their lines: one statement, within `within` of now.
pub(crate) async fn take(tables: &Tables, pool: &Pool, within: Duration) -> Result<Snapshot> {
    let client = pool.statements(Some(Instant::now() + within));
    let (leases, line) = tables.leases.list_and_line(&client).await?;
    Ok(Snapshot {
        at: SystemTime::now(),
        leases,
        line,
    })
}

/// Reads the rest: eight statements, each within `within` of now.
pub(crate) async fn take_rest(tables: &Tables, pool: &Pool, within: Duration) -> Result<Rest> {
    let client = pool.statements(Some(Instant::now() + within));
    let mut consumers = tables.topics.all_consumers(&client).await?;
    let topics = (tables.topics.topics(&client).await?.into_iter())
        .map(|topic| {
            let (theirs, others) = consumers.drain(..).partition(|c| c.topic == topic.topic);
            consumers = others;
            (topic, theirs)
        })
        .collect();
    Ok(Rest {
        topics,
        held_back: tables.topics.held_back(&client).await?,
        schedules: tables.schedules.latest(&client).await?,
        limits: tables.leases.limits(&client).await?,
        buckets: tables.rates.buckets(&client).await?,
        advisory: pgcoord::advisory::list(&client).await?,
        sessions: pgcoord::sessions::list(&client).await?,
        at: SystemTime::now(),
    })
}

/// Adds each consumer's lag in `rest` to `history`.
pub(crate) fn remember_lag(rest: &Rest, history: &mut History) {
    let at = epoch(rest.at);
    let mut consumers = Vec::new();
    for (topic, listed) in &rest.topics {
        for consumer in listed {
            let name = format!("{}/{}", topic.topic, consumer.consumer);
            let seconds = consumer
                .oldest_unacked
                .map_or(0.0, |t| age(rest.at, t).as_secs_f64());
            let sample = LagSample {
                at,
                events: consumer.lag_events,
                seconds,
            };
            history.record_lag(&name, sample);
            consumers.push(name);
        }
    }
    history.keep_consumers(&consumers);
}

/// Adds each held lease's term in `snapshot` to `history`.
pub(crate) fn remember(snapshot: &Snapshot, history: &mut History) {
    let at = epoch(snapshot.at);
    let mut names = Vec::new();
    for lease in &snapshot.leases {
        if let (Some(owner), Some(token), true) = (&lease.owner, lease.token, lease.is_held()) {
            history.record_holder(&lease.name, owner, token, at);
        }
        names.push(lease.name.clone());
    }
    history.keep_leases(&names, at);
}

/// The page's JSON: both parts, with each lease's terms and each consumer's lag series.
pub(crate) fn render(snapshot: &Snapshot, rest: &Rest, history: &History, actions: bool) -> Value {
    let leases: Vec<Value> = (snapshot.leases.iter().take(LEASES_SHOWN))
        .map(|lease| {
            let waiters: Vec<Value> = (snapshot.line.iter())
                .filter(|place| place.name == lease.name)
                .map(|place| {
                    json!({
                        "waiter": place.waiter,
                        "priority": place.priority,
                        "waited": secs(place.waited),
                        "left": secs(place.left),
                    })
                })
                .collect();
            let terms: Vec<Value> = (history.terms(&lease.name).into_iter().flatten())
                .map(|t| json!({ "owner": t.owner, "token": t.token, "since": t.since }))
                .collect();
            json!({
                "name": lease.name,
                "owner": lease.owner,
                "token": lease.token,
                "held": lease.is_held(),
                "left": lease.remaining.map(secs),
                "data": crate::shown(lease.data.as_deref()),
                "waiters": waiters,
                "terms": terms,
            })
        })
        .collect();
    let topics: Vec<Value> = (rest.topics.iter())
        .map(|(topic, consumers)| {
            let consumers: Vec<Value> = (consumers.iter())
                .map(|c| {
                    json!({
                        "consumer": c.consumer,
                        "cursor": c.cursor.to_string(),
                        "lag_events": c.lag_events,
                        "lag_seconds": c.oldest_unacked.map(|t| secs(age(rest.at, t))),
                        "acked_ago": secs(age(rest.at, c.acked_at)),
                    })
                })
                .collect();
            json!({
                "topic": topic.topic,
                "events": topic.events,
                "oldest_age": secs(age(rest.at, topic.oldest)),
                "newest_age": secs(age(rest.at, topic.newest)),
                "consumers": consumers,
            })
        })
        .collect();
    let held_back = rest.held_back.as_ref().map(|h| {
        json!({ "pid": h.pid, "prepared": h.prepared, "database": h.database, "age": secs(h.age) })
    });
    let schedules: Vec<Value> = (rest.schedules.iter())
        .map(|run| {
            json!({
                "schedule": run.schedule,
                "tick": epoch(run.tick),
                "state": run.state.as_str(),
                "attempts": run.attempts,
                "owner": run.owner,
                "token": run.token,
                "next_tick": run.next_tick.map(epoch),
                "error": run.error,
            })
        })
        .collect();
    let lag: Vec<Value> = history
        .lag()
        .map(|(name, series)| {
            let samples: Vec<Value> = (series.iter())
                .map(|s| json!([s.at, s.events, s.seconds]))
                .collect();
            json!({ "consumer": name, "samples": samples })
        })
        .collect();
    json!({
        "at": epoch(snapshot.at),
        "rest_at": epoch(rest.at),
        "actions": actions,
        "pools": pools(snapshot, history),
        "lease_count": snapshot.leases.len(),
        "leases": leases,
        "topics": topics,
        "held_back": held_back,
        "schedules": schedules,
        "lag": lag,
        "limits": limits(snapshot, rest),
        "rates": (rest.buckets.iter())
            .map(|b| json!({ "key": b.key, "full_in": secs(b.full_in), "granted": b.granted }))
            .collect::<Vec<_>>(),
        "advisory": (rest.advisory.iter())
            .map(|a| json!({
                "key": a.key, "mode": a.mode, "held": a.granted, "pid": a.pid,
                "application": a.application,
            }))
            .collect::<Vec<_>>(),
        "fleet": fleet(snapshot, rest),
    })
}

/// Each stored limit with its permits held now (its slots `{name}#{i}` held).
fn limits(snapshot: &Snapshot, rest: &Rest) -> Vec<Value> {
    (rest.limits.iter())
        .map(|(name, limit)| {
            let in_use = (snapshot.leases.iter())
                .filter(|lease| lease.is_held())
                .filter_map(|lease| lease.name.strip_prefix(name.as_str()))
                .filter_map(|slot| slot.strip_prefix('#'))
                .filter(|i| !i.is_empty() && i.bytes().all(|b| b.is_ascii_digit()))
                .count();
            json!({ "name": name, "limit": limit, "in_use": in_use })
        })
        .collect()
}

/// The processes seen holding leases (each with how many), and the database's sessions: the
/// listeners among them (`… listener`) say whether each process's doorbell is connected.
fn fleet(snapshot: &Snapshot, rest: &Rest) -> Value {
    let mut holders: BTreeMap<&str, usize> = BTreeMap::new();
    for lease in snapshot.leases.iter().filter(|l| l.is_held()) {
        if let Some(owner) = lease.owner.as_deref() {
            *holders.entry(owner).or_default() += 1;
        }
    }
    let sessions: Vec<Value> = (rest.sessions.iter())
        .map(|s| {
            json!({
                "application": s.application,
                "pid": s.pid,
                "state": s.state,
                "connected": secs(s.connected),
                "in_state": s.in_state.map(secs),
            })
        })
        .collect();
    json!({
        "holders": holders.into_iter()
            .map(|(owner, leases)| json!({ "owner": owner, "leases": leases }))
            .collect::<Vec<_>>(),
        "sessions": sessions,
    })
}

/// The worker pools, from their leases (the runtime names them `{pool}/members/{owner}`, its
/// weight the data, and `{pool}/keys/{key}`): each member with its weight and the keys it
/// holds, the keys nobody holds, and how many keys changed hands in the last minute (terms seen
/// after a key's first).
fn pools(snapshot: &Snapshot, history: &History) -> Vec<Value> {
    #[derive(Default)]
    struct Pool<'a> {
        members: BTreeMap<&'a str, u32>,
        keys: BTreeMap<&'a str, Vec<&'a str>>,
        unheld: Vec<&'a str>,
        moves: usize,
    }
    let minute_ago = epoch(snapshot.at) - 60.0;
    let mut pools: BTreeMap<&str, Pool> = BTreeMap::new();
    for lease in &snapshot.leases {
        let holder = lease.owner.as_deref().filter(|_| lease.is_held());
        if let Some((pool, owner)) = lease.name.split_once("/members/") {
            if holder.is_some() {
                // Weighs 1 without a weight stored, as the pool counts it.
                let weight = lease.value::<u32>().ok().flatten().unwrap_or(1);
                pools.entry(pool).or_default().members.insert(owner, weight);
            }
        } else if let Some((pool, key)) = lease.name.split_once("/keys/") {
            let entry = pools.entry(pool).or_default();
            match holder {
                Some(owner) => entry.keys.entry(owner).or_default().push(key),
                None => entry.unheld.push(key),
            }
            let terms = history.terms(&lease.name).into_iter().flatten();
            entry.moves += terms.skip(1).filter(|t| t.since >= minute_ago).count();
        }
    }
    (pools.into_iter())
        .filter(|(_, pool)| !pool.members.is_empty() || !pool.keys.is_empty())
        .map(|(name, pool)| {
            let mut owners: Vec<&str> = pool.members.keys().copied().collect();
            // A key's holder whose member lease is gone (it is leaving): shown too.
            owners.extend(pool.keys.keys().filter(|o| !pool.members.contains_key(*o)));
            let members: Vec<Value> = (owners.into_iter())
                .map(|owner| {
                    json!({
                        "owner": owner,
                        "member": pool.members.contains_key(owner),
                        "weight": pool.members.get(owner),
                        "keys": pool.keys.get(owner).cloned().unwrap_or_default(),
                    })
                })
                .collect();
            json!({
                "pool": name,
                "members": members,
                "unheld": pool.unheld,
                "moves_last_minute": pool.moves,
            })
        })
        .collect()
}

fn epoch(t: SystemTime) -> f64 {
    t.duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64()
}

/// How long before `now` `then` was (0 for a time after it: clocks differ).
fn age(now: SystemTime, then: SystemTime) -> Duration {
    now.duration_since(then).unwrap_or_default()
}

/// Seconds with a tenth's precision.
fn secs(d: Duration) -> f64 {
    (d.as_secs_f64() * 10.0).round() / 10.0
}
