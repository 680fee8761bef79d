-- pgcoord rate limits: a row per key, its bucket as one number.
--
-- `tat` is the key's theoretical arrival time in microseconds since the epoch (GCRA): when its
-- bucket would be full again. Every take locks the row by its upsert and computes from the
-- locked row on the server's clock, so concurrent takes never admit more than the limit.
-- `granted` is what the last take got (what the upsert returns). See docs/DESIGN.md, "Rate limits".
CREATE TABLE IF NOT EXISTS "pgcoord_locks_rl" (
    key     varchar(255) PRIMARY KEY,
    tat     bigint NOT NULL,
    granted bigint NOT NULL
);
