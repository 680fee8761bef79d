-- pgcoord handover proof: each waiter's place stores the nonce of the attempt that last wrote it.
--
-- A waiter's lost attempt writes a random 64-bit nonce, new for each attempt, with its place; a
-- release that hands the lease to that place announces the nonce with the grant. The waiter's
-- process takes the grant from the announcement only when it carries the nonce of its last
-- refused attempt: that proves the grant was made for this wait after that attempt (so its
-- deadline may count from the attempt), not by an earlier wait, and not written by hand on the
-- channel (a forger would have to read this table). A place without a nonce (a waiter of a
-- version before this file) is handed the lease as before, and that waiter reads the row.
ALTER TABLE "pgcoord_locks_wq" ADD COLUMN IF NOT EXISTS nonce bigint;
