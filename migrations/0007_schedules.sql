-- pgcoord schedules: a row per tick of a schedule that was started.
--
-- A tick is claimed by the process holding the schedule's lease, under the lease's token; the
-- row, unique per (schedule, tick), keeps a tick that is done from being run again, and an
-- attempt whose process stopped is found 'running' by the next holder and started again.
-- See docs/DESIGN.md, "Schedules".
CREATE TABLE IF NOT EXISTS "pgcoord_schedules" (
    schedule    varchar(255) NOT NULL,
    tick        timestamptz NOT NULL,
    state       text NOT NULL CHECK (state IN ('running', 'done', 'failed', 'abandoned')),
    attempts    integer NOT NULL,
    token       bigint NOT NULL,
    owner       varchar(255) NOT NULL,
    started_at  timestamptz NOT NULL,
    finished_at timestamptz,
    error       text,
    next_tick   timestamptz,
    PRIMARY KEY (schedule, tick)
);
