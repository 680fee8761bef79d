-- pgcoord in SQL: functions any driver or language calls inside its own transaction, and that
-- the Rust core calls too, so each rule has one home. Each is named after the table it acts on.
-- SECURITY INVOKER: they run with the caller's privileges on the tables (docs/OPERATIONS.md).
-- Created when missing, never replaced: migrating again changes nothing (cached plans stay), and
-- a later version that changes one adds a new migration. A lease that is not held with the given
-- token raises SQLSTATE PC001; a consumer never opened, PC002; a tick already done, PC003.
DO $migration$
BEGIN

-- The fencing guard: succeeds only while the lease `lease_name` is held with `lease_token` on
-- the server's clock (and by `lease_owner`, when given), and keeps it so until the caller's
-- transaction ends. FOR KEY SHARE conflicts with the token change of a takeover and with a
-- release, not with renewals, so the holder keeps renewing while a guarded transaction runs.
-- Tokens are unique: the token alone names one tenure of one holder; the Rust core names its
-- owner too, so a process that came to believe it holds another's token fences nothing.
IF to_regprocedure('"pgcoord_locks_fence"(text, bigint, text)') IS NULL THEN
    CREATE FUNCTION "pgcoord_locks_fence"(lease_name text, lease_token bigint, lease_owner text DEFAULT NULL)
    RETURNS void
    LANGUAGE plpgsql VOLATILE SECURITY INVOKER AS $fn$
    BEGIN
        PERFORM 1 FROM "pgcoord_locks" AS l
        WHERE l.name = lease_name AND l.token = lease_token AND l.expires_at > clock_timestamp()
          AND (lease_owner IS NULL OR l.owner = lease_owner)
        FOR KEY SHARE;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'lease % is no longer held with token %', quote_literal(lease_name), lease_token
                USING ERRCODE = 'PC001';
        END IF;
    END
    $fn$;
END IF;

-- A lease as it stands: its holder and token (NULL while free), the milliseconds left on the
-- server's clock, its data. No row when the name has none.
IF to_regprocedure('"pgcoord_locks_lease"(text)') IS NULL THEN
    CREATE FUNCTION "pgcoord_locks_lease"(lease_name text)
    RETURNS TABLE (owner text, token bigint, remaining_ms bigint, data bytea)
    LANGUAGE sql STABLE SECURITY INVOKER AS $fn$
        SELECT l.owner, l.token,
               CASE WHEN l.owner IS NULL THEN NULL
                    ELSE greatest(0, (extract(epoch FROM l.expires_at - clock_timestamp()) * 1000))::bigint END,
               l.data
        FROM "pgcoord_locks" AS l WHERE l.name = $1
    $fn$;
END IF;

-- Appends one event to `topic`, in the caller's transaction; its place in the topic's order.
-- With `doorbell`, rings the topic table's channel at commit (a doorbell: readers read the
-- table, never the notification). The jsonb form stores the JSON text, UTF-8.
IF to_regprocedure('"pgcoord_topics_append"(text, bytea, boolean)') IS NULL THEN
    CREATE FUNCTION "pgcoord_topics_append"(topic text, body bytea, doorbell boolean DEFAULT true)
    RETURNS TABLE (xid bigint, "position" bigint)
    LANGUAGE plpgsql VOLATILE SECURITY INVOKER AS $fn$
    #variable_conflict use_column
    BEGIN
        INSERT INTO "pgcoord_topics" AS e (topic, body) VALUES ($1, $2)
        RETURNING e.xid::text::int8, e.position INTO xid, "position";
        -- The topic table's unqualified name, the channel readers listen on.
        IF doorbell THEN
            PERFORM pg_notify((SELECT c.relname::text FROM pg_class AS c
                               WHERE c.oid = '"pgcoord_topics"'::regclass), $1);
        END IF;
        RETURN NEXT;
    END
    $fn$;
END IF;
IF to_regprocedure('"pgcoord_topics_append"(text, jsonb, boolean)') IS NULL THEN
    CREATE FUNCTION "pgcoord_topics_append"(topic text, body jsonb, doorbell boolean DEFAULT true)
    RETURNS TABLE (xid bigint, "position" bigint)
    LANGUAGE sql VOLATILE SECURITY INVOKER AS $fn$
        SELECT * FROM "pgcoord_topics_append"($1, convert_to($2::text, 'UTF8'), $3)
    $fn$;
END IF;

-- The events of `topic` after the cursor (after_xid, after_position), in order, at most
-- `max_events`. Gap-free: an event is read only when its transaction is older than the oldest
-- one still running (the snapshot's xmin), so nothing can still commit before what was read.
-- None when retention's mark is past the cursor (the events it would skip were deleted).
IF to_regprocedure('"pgcoord_topics_read"(text, bigint, bigint, bigint)') IS NULL THEN
    CREATE FUNCTION "pgcoord_topics_read"(topic text, after_xid bigint, after_position bigint, max_events bigint)
    RETURNS TABLE (xid bigint, "position" bigint, appended_at timestamptz, body bytea)
    LANGUAGE sql STABLE SECURITY INVOKER AS $fn$
        SELECT e.xid::text::int8, e.position, e.appended_at, e.body
        FROM "pgcoord_topics" AS e
        WHERE e.topic = $1 AND (e.xid, e.position) > ($2::text::xid8, $3)
          AND e.xid < pg_snapshot_xmin(pg_current_snapshot())
          AND NOT (SELECT EXISTS (
              SELECT FROM "pgcoord_topics_trimmed" AS m
              WHERE m.topic = $1 AND (m.xid, m.position) > ($2::text::xid8, $3)))
        ORDER BY e.xid, e.position
        LIMIT $4
    $fn$;
END IF;

-- Moves the cursor of `consumer` of `topic` forward to (xid, position), never back: true when
-- it moved. Run it in the transaction of the handler's effects, after the fence of the
-- consumer's lease, or pass the lease and its token to fence here. PC002 when the consumer was
-- never opened.
IF to_regprocedure('"pgcoord_topics_ack"(text, text, bigint, bigint, text, bigint)') IS NULL THEN
    CREATE FUNCTION "pgcoord_topics_ack"(topic text, consumer text, xid bigint, "position" bigint,
                                         lease_name text DEFAULT NULL, lease_token bigint DEFAULT NULL)
    RETURNS boolean
    LANGUAGE plpgsql VOLATILE SECURITY INVOKER AS $fn$
    BEGIN
        IF lease_name IS NOT NULL OR lease_token IS NOT NULL THEN
            PERFORM "pgcoord_locks_fence"(lease_name, lease_token);
        END IF;
        UPDATE "pgcoord_topics_cursors" AS c SET xid = $3::text::xid8, position = $4, acked_at = clock_timestamp()
        WHERE c.topic = $1 AND c.consumer = $2 AND (c.xid, c.position) < ($3::text::xid8, $4);
        IF FOUND THEN
            RETURN true;
        END IF;
        PERFORM 1 FROM "pgcoord_topics_cursors" AS c WHERE c.topic = $1 AND c.consumer = $2;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'consumer % of topic % was never opened', quote_literal($2), quote_literal($1)
                USING ERRCODE = 'PC002';
        END IF;
        RETURN false;
    END
    $fn$;
END IF;

-- Completes a schedule's tick in the caller's transaction: fences the run (`attempt` under
-- `token` is the tick's current run, still running) and marks it done, with the next tick due
-- when given. PC001 when the run no longer counts (taken over, started again, trimmed); PC003
-- when the tick is already done (do not apply its effects again).
IF to_regprocedure('"pgcoord_schedules_complete"(text, timestamptz, bigint, integer, timestamptz)') IS NULL THEN
    CREATE FUNCTION "pgcoord_schedules_complete"(schedule text, tick timestamptz, token bigint,
                                                 attempt integer, next_tick timestamptz DEFAULT NULL)
    RETURNS void
    LANGUAGE plpgsql VOLATILE SECURITY INVOKER AS $fn$
    DECLARE
        found_state text;
        found_attempts integer;
        found_token bigint;
    BEGIN
        -- Locked as the finish would lock it: nobody takes the run over or starts it again
        -- until the caller's transaction ends.
        PERFORM 1 FROM "pgcoord_schedules" AS r
        WHERE r.schedule = $1 AND r.tick = $2 AND r.token = $3 AND r.attempts = $4
          AND r.state = 'running'
        FOR NO KEY UPDATE;
        IF FOUND THEN
            UPDATE "pgcoord_schedules" AS r
            SET state = 'done', finished_at = now(), error = NULL, next_tick = coalesce($5, r.next_tick)
            WHERE r.schedule = $1 AND r.tick = $2;
            RETURN;
        END IF;
        SELECT r.state, r.attempts, r.token INTO found_state, found_attempts, found_token
        FROM "pgcoord_schedules" AS r WHERE r.schedule = $1 AND r.tick = $2;
        IF found_state = 'done' AND found_token = $3 AND found_attempts = $4 THEN
            RAISE EXCEPTION 'schedule %: its tick is already done by attempt %', quote_literal($1), $4
                USING ERRCODE = 'PC003';
        END IF;
        RAISE EXCEPTION 'schedule %: attempt % of its tick under token % no longer counts (%)',
            quote_literal($1), $4, $3,
            CASE WHEN found_state IS NULL THEN 'no row: trimmed, or never claimed'
                 WHEN found_token <> $3 THEN format('taken over by token %s', found_token)
                 WHEN found_attempts <> $4 THEN format('started again: attempt %s', found_attempts)
                 ELSE format('it ended %s', found_state) END
            USING ERRCODE = 'PC001';
    END
    $fn$;
END IF;

END
$migration$;
