-- pgcoord lease waiters: who waits for which lease, in arrival order.
--
-- A waiter that lost an attempt puts itself in line (name, waiter = its owner identity) and
-- refreshes `until` at every attempt it loses; only the first live waiter in line (or anyone,
-- when nobody waits) may take a free lease, a grant takes its waiter out of the line, and a
-- release announces the waiter first in line, so only that process wakes. A waiter that gives up
-- leaves the line; one that dies stays until `until` passes. The line is fairness, not safety —
-- one holder at a time is the lock table's — so the table is UNLOGGED: after a crash it is empty
-- and waiters line up again at their next attempt. Replaces the lock table's one-deep
-- waiter/waiter_until reservation, whose columns remain unused.
CREATE UNLOGGED TABLE IF NOT EXISTS "pgcoord_locks_wq" (
    name      varchar(255) NOT NULL,
    waiter    varchar(255) NOT NULL,
    queued_at timestamptz  NOT NULL,
    until     timestamptz  NOT NULL,
    PRIMARY KEY (name, waiter)
);
