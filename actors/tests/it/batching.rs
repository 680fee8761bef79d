//! Group commit for acquires: a burst from one manager shares statements, each caller still gets
//! its own lease.

use std::time::Duration;

use pgcoord_actors::*;

use super::Setup;

/// A burst of acquires from one manager goes to the server in a few statements (group commit),
/// and each caller still gets its own lease, token and data; names another process holds are
/// not granted by the batch but waited for as before.
#[actix_rt::test]
async fn a_burst_of_acquires_is_batched_and_each_caller_gets_its_own_lease() {
    let (setup, admin) = Setup::new(Duration::from_secs(20), Duration::from_secs(5)).await;
    let other = setup.manager("other");
    let taken = other.call(Acquire::new("burst-7")).await.unwrap();
    let taken_token = taken.token();
    let manager = setup.manager("burst");
    let before = manager.send(GetStats::new()).await.unwrap();
    let requests: Vec<_> = (0..2_000)
        .map(|i| manager.send(Acquire::new(format!("burst-{i}")).data(format!("d{i}"))))
        .collect();
    // The name the other manager holds is released a moment later: its caller waits, then gets it.
    let release = async {
        tokio::time::sleep(Duration::from_millis(200)).await;
        taken.release().await.unwrap();
    };
    let (results, ()) =
        futures_util::future::join(futures_util::future::join_all(requests), release).await;
    let leases: Vec<Lease> = results.into_iter().map(|r| r.unwrap().unwrap()).collect();
    let stats = manager.send(GetStats::new()).await.unwrap();
    let statements = stats.acquire_statements - before.acquire_statements;
    assert!(
        statements < 100,
        "{statements} statements for 2,000 acquires"
    );
    let mut tokens: Vec<i64> = leases.iter().map(|l| l.token()).collect();
    tokens.sort();
    tokens.dedup();
    assert_eq!(tokens.len(), 2_000, "a token per lease");
    for (i, lease) in leases.iter().enumerate() {
        assert_eq!(lease.name(), format!("burst-{i}"));
        assert_eq!(lease.data(), Some(format!("d{i}").as_bytes()));
    }
    let sql = format!(
        "SELECT count(*) FROM {} WHERE owner = 'burst' AND name LIKE 'burst-%'",
        setup.quoted_table()
    );
    let owned: i64 = admin.query_one(&sql, &[]).await.unwrap().get(0);
    assert_eq!(owned, 2_000);
    assert!(
        leases[7].token() > taken_token,
        "burst-7 granted after the other's tenure"
    );
}
