-- pgcoord payload store: payloads too large for a notification travel by key.
--
-- Rows expire instead of being deleted on read, because every process listening on a channel
-- may need to read the same payload.
CREATE TABLE IF NOT EXISTS "pgcoord_payloads" (
    key        uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    data       bytea NOT NULL,
    expires_at timestamptz NOT NULL
);
