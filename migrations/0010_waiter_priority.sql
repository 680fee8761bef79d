-- pgcoord waiters' priority: a waiter's place in line carries a priority, and the line is
-- ordered by it (higher first), then by arrival. A candidate given a higher priority (a preferred
-- holder) is first in line whenever it waits, so it is granted the lease at its next release
-- before anyone who came earlier with a lower one. Fairness among equals is unchanged (arrival
-- order); safety does not depend on the line at all (one holder at a time is the lock table's).
ALTER TABLE "pgcoord_locks_wq" ADD COLUMN IF NOT EXISTS priority integer NOT NULL DEFAULT 0;
