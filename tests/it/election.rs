//! Election statements on their own: a resign request reaches the term it names and no later
//! one.

use pgcoord::lease::ReleaseRequest;
use pgcoord::{ErrorKind, LeaseTable};

use super::{LEASE, grant};

#[tokio::test]
async fn a_resign_request_reaches_the_term_it_names_and_no_later_one() {
    let (config, client) = super::setup().await;
    let table = LeaseTable::new(&config);
    // Nobody leads: nothing to ask.
    let asked = table.request_resign(&client, "leader", "ops").await;
    assert_eq!(asked.unwrap(), None);
    let first = grant(&table, &client, "leader", "a", LEASE).await;
    let a = table.owner("a").unwrap();
    assert!(
        !a.resign_requested(&client, "leader", first.token)
            .await
            .unwrap()
    );
    let asked = table.request_resign(&client, "leader", "ops").await;
    assert_eq!(asked.unwrap(), Some(first.token));
    assert!(
        a.resign_requested(&client, "leader", first.token)
            .await
            .unwrap()
    );
    // The term ends; the next one was not asked.
    let release = ReleaseRequest {
        name: "leader",
        token: first.token,
        keep: false,
        announce_always: false,
    };
    a.release(&client, &release).await.unwrap();
    let next = grant(&table, &client, "leader", "b", LEASE).await;
    let b = table.owner("b").unwrap();
    assert!(
        !b.resign_requested(&client, "leader", next.token)
            .await
            .unwrap()
    );
    // A bad name is refused before any SQL.
    let bad = table.request_resign(&client, "", "ops").await.unwrap_err();
    assert_eq!(bad.kind(), ErrorKind::InvalidName);
}
