-- pgcoord resign requests: anyone may ask the leader of an election (the holder of the lease of
-- the same name) to step down. A request names the term it is for (the lease's token), so it
-- never reaches a later term; the leader looks for one at each heartbeat and resigns when it
-- finds one. A request is a wish, not a release: the lease stays held until its holder lets it
-- go, so the leader's work ends before the next term begins. One row per election: a new request
-- replaces the last.
CREATE TABLE IF NOT EXISTS "pgcoord_locks_rr" (
    name         varchar(255) PRIMARY KEY,
    token        bigint NOT NULL,
    requested_by varchar(255) NOT NULL,
    requested_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
