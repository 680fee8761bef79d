-- pgcoord durable topics: an append-only log per topic, and each consumer's cursor.
--
-- An event's place in its topic's order is (xid, position): the appending transaction's id and a
-- number drawn when it appended. Readers read only events whose transaction is older than every
-- transaction still running (pg_snapshot_xmin), so an event that commits late is never skipped:
-- nothing can still appear before what they have read. See docs/DESIGN.md, "Durable topics".
CREATE TABLE IF NOT EXISTS "pgcoord_topics" (
    topic       varchar(255) NOT NULL,
    xid         xid8 NOT NULL DEFAULT pg_current_xact_id(),
    position    bigint GENERATED ALWAYS AS IDENTITY,
    appended_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    body        bytea NOT NULL,
    PRIMARY KEY (topic, xid, position)
);

-- A consumer has read and acknowledged its topic through (xid, position).
CREATE TABLE IF NOT EXISTS "pgcoord_topics_cursors" (
    topic     varchar(255) NOT NULL,
    consumer  varchar(255) NOT NULL,
    xid       xid8 NOT NULL,
    position  bigint NOT NULL,
    acked_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (topic, consumer)
);

-- Retention deleted a topic's events through (xid, position), at most: a cursor before it has
-- missed events, which is an error, never a silent jump.
CREATE TABLE IF NOT EXISTS "pgcoord_topics_trimmed" (
    topic    varchar(255) PRIMARY KEY,
    xid      xid8 NOT NULL,
    position bigint NOT NULL
);
