//! Hostile identifiers never reach SQL: they are rejected before any statement runs, and the
//! valid ones that reach SQL are quoted.

use pgcoord::ErrorKind;

#[tokio::test]
async fn hostile_table_names_are_rejected_before_sql() {
    let (config, client) = super::setup().await;
    let long = "x".repeat(64);
    for hostile in [
        "x; DROP TABLE y",
        "x\"; DROP TABLE y; --",
        "x'y",
        "x\0y",
        "tâble",
        "",
        long.as_str(),
        "a.b.c",
    ] {
        let err = super::builder()
            .lock_table(hostile)
            .build()
            .expect_err(hostile);
        assert_eq!(err.kind(), ErrorKind::InvalidIdentifier, "{hostile:?}");
    }
    // The configured table still exists: nothing ran.
    let n: i64 = client
        .query_one(
            "SELECT count(*) FROM pg_class WHERE relname = $1",
            &[&config.lock_table().name().as_str()],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, 1);
}

#[tokio::test]
async fn mixed_case_names_are_quoted_and_exact() {
    let config = super::builder()
        .lock_table(pgcoord_testkit::unique_name("MixedCase"))
        .build()
        .unwrap();
    let client = super::connect(&config).await;
    pgcoord::schema::migrate(&client, &config).await.unwrap();
    let found: Option<String> = client
        .query_one(
            "SELECT to_regclass($1)::text",
            &[&config.lock_table().quoted()],
        )
        .await
        .unwrap()
        .get(0);
    assert!(found.is_some(), "quoted mixed-case table exists");
    let folded: Option<String> = client
        .query_one(
            "SELECT to_regclass($1)::text",
            &[&config.lock_table().name().as_str().to_lowercase()],
        )
        .await
        .unwrap()
        .get(0);
    assert!(folded.is_none(), "no case-folded twin was created");
    pgcoord::schema::drop_tables(&client, &config)
        .await
        .unwrap();
}
