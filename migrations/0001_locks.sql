-- pgcoord leases: one row per lock name.
--
-- owner, token and expires_at are set while the lease is held and all NULL while it is free
-- (a row kept by keep-on-release). expires_at is on the server's clock. token is the fencing
-- token of the current tenure, drawn from the sequence below when the lease is granted and
-- constant until it ends; its unique constraint also lets a FOR KEY SHARE guard block takeovers
-- without blocking renewals. waiter and waiter_until reserve the next grant for a contender that
-- is waiting, so a releaser cannot take the lock straight back; a released row that someone has
-- reserved stays (free, without data) until the reservation is used or given up. kept marks a row
-- released with keep-on-release, whose data stays.
CREATE SEQUENCE IF NOT EXISTS "pgcoord_locks_rvn" AS bigint MINVALUE 1 NO MAXVALUE NO CYCLE;

CREATE TABLE IF NOT EXISTS "pgcoord_locks" (
    name         varchar(255) PRIMARY KEY,
    owner        varchar(255),
    token        bigint UNIQUE,
    data         bytea,
    acquired_at  timestamptz,
    expires_at   timestamptz,
    waiter       varchar(255),
    waiter_until timestamptz,
    kept         boolean NOT NULL DEFAULT false,
    CHECK ((owner IS NULL) = (token IS NULL) AND (token IS NULL) = (expires_at IS NULL))
);
