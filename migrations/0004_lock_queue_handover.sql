-- pgcoord lease handover: a release hands the lease straight to the waiter first in line.
--
-- A waiter's lost attempt stores, with its place, what its grant would be: its lease
-- (`lease_ms`) and its data (`data`, `replace_data`, as the attempt would have written them).
-- A release whose first live waiter has them grants the lease to that waiter in the same
-- statement and announces the grant, token included, so the waiter's process holds it without
-- another statement. A place without them (a waiter of a version before this file) is
-- announced as before, and that waiter asks itself.
ALTER TABLE "pgcoord_locks_wq" ADD COLUMN IF NOT EXISTS lease_ms bigint;
ALTER TABLE "pgcoord_locks_wq" ADD COLUMN IF NOT EXISTS data bytea;
ALTER TABLE "pgcoord_locks_wq" ADD COLUMN IF NOT EXISTS replace_data boolean NOT NULL DEFAULT false;
