-- pgcoord stored limits: a row per limited semaphore, its number of permits, changeable at run
-- time. A permit is the lease of one slot, "{name}#{i}" for i below `permits`, in the lock table
-- as a plain semaphore's; the slots' rows are made by the statement that sets the limit and are
-- kept free between tenures, so a grant only ever updates a row. `version` moves at every change:
-- a change made from a snapshot older than the last one is refused and asked again. `slots` is
-- the most slots ever made: lowering the limit deletes the slots from it up to there, held or not
-- (their holders lose them). See docs/DESIGN.md, "Stored limits".
CREATE TABLE IF NOT EXISTS "pgcoord_locks_lm" (
    name    varchar(255) PRIMARY KEY,
    permits integer NOT NULL CHECK (permits >= 0),
    version bigint NOT NULL DEFAULT 1,
    slots   integer NOT NULL DEFAULT 0,
    set_at  timestamptz NOT NULL DEFAULT clock_timestamp()
);
