//! What someone who can connect does with NOTIFY and LISTEN alone: forged probes, forged
//! payload-store references, forged "not here" answers and doorbell floods. Each must cost a
//! bounded amount and never hide a fault, drop a message silently, or handle one twice.

use std::time::{Duration, Instant};

use pgcoord_actors::*;
use pgcoord_testkit::unique_name;

use super::Setup;

/// A listener whose session cannot hear its own probes stays found deaf — replaced again and
/// again, never said to be listening — while an adversary NOTIFYs forged probes to it: the
/// largest number there is, and probes the listener really sent, heard by LISTENing where
/// they go and replayed later.
#[actix_rt::test]
async fn forged_and_replayed_probes_do_not_hide_a_deaf_listener() {
    let (setup, admin) = Setup::new(Duration::from_secs(10), Duration::from_secs(2)).await;
    // Deaf: its session is in another database than the one its pool sends probes in (a
    // NOTIFY reaches only its own database), where anyone can still NOTIFY it.
    let other = unique_name("deaf");
    (admin.batch_execute(&format!("CREATE DATABASE \"{other}\"")))
        .await
        .unwrap();
    let mut session = setup.pg.clone();
    session.dbname(&other);
    let config = (setup.builder("deaf"))
        .session_pg_config(&session)
        .ping_interval(Duration::from_millis(100))
        .ping_timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let listener = ListenerActor::new(config, None);
    let reply = listener.reply_channel().clone();
    let listener = listener.start_supervised();

    // The adversary hears the real probes where they are sent, and NOTIFYs the deaf session.
    let ears = setup.builder("ears").build().unwrap();
    let (_ears, mut heard) = super::listen_on(&ears, &[&reply]).await;
    let mouth = setup
        .builder("mouth")
        .session_pg_config(&session)
        .build()
        .unwrap();
    let (mouth, _) = super::listen_on(&mouth, &[]).await;
    let forging = tokio::spawn(async move {
        let mut seen: Vec<(Instant, String)> = Vec::new();
        loop {
            while let Ok(text) = heard.try_recv() {
                let payload = text.split_once(": ").unwrap().1.to_owned();
                seen.push((Instant::now(), payload));
            }
            let mut forged = vec![format!("pgcoord-probe {}", u64::MAX)];
            // Replays of probes heard long enough ago that none is still awaited (a probe is
            // awaited for about a second here): a replay proves nothing then.
            let old = seen
                .iter()
                .filter(|(at, _)| at.elapsed() > Duration::from_secs(3));
            forged.extend(old.map(|(_, p)| p.clone()));
            for text in forged {
                mouth
                    .execute("SELECT pg_notify($1, $2)", &[&reply.as_str(), &text])
                    .await
                    .unwrap();
            }
            // Slower than the ping timeout: the forgeries alone do not keep a probe waiting.
            tokio::time::sleep(Duration::from_millis(400)).await;
        }
    });

    // While it goes on, the listener keeps being replaced and never says it listens.
    let stats = async || listener.send(GetStats::new()).await.unwrap();
    let started = stats().await.connections;
    let deadline = Instant::now() + Duration::from_secs(8);
    while Instant::now() < deadline {
        let now = stats().await;
        assert!(!now.listening, "said to listen: {now:?}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let replaced = stats().await.connections - started;
    forging.abort();
    // About one every second here (found deaf, then the backoff); a stuck one makes none.
    assert!(replaced >= 3, "replaced {replaced} times in 8 s");
}
