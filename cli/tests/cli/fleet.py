"""A Python member of a pgcoord fleet, with psycopg and the migrations' SQL functions only.

Run by `pgcoord lock NAME -- python3 fleet.py` (the lease's name and token in the environment):
it fences a write with the token the Rust holder got, appends events a Rust consumer reads,
reads them back and acks them as a consumer, fenced by the same token; then shows that a stale
token is refused with SQLSTATE PC001 and writes nothing.
"""
import os
import sys

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

name = os.environ["PGCOORD_LEASE_NAME"]
token = int(os.environ["PGCOORD_LEASE_TOKEN"])
locks, topics, resource = (os.environ[k] for k in ("FLEET_LOCK_TABLE", "FLEET_TOPIC_TABLE", "FLEET_RESOURCE"))
fence = sql.Identifier(locks + "_fence")
append = sql.Identifier(topics + "_append")
read = sql.Identifier(topics + "_read")
ack = sql.Identifier(topics + "_ack")

with psycopg.connect(os.environ["FLEET_DSN"]) as conn:
    # A write fenced by the lease: it commits only while the token holds the lease.
    with conn.transaction():
        conn.execute(sql.SQL("SELECT {}(%s, %s)").format(fence), (name, token))
        conn.execute(sql.SQL("INSERT INTO {} VALUES (%s)").format(sql.Identifier(resource)), ("from python",))

    # Events in one transaction (bytes and JSON), then one more in another.
    with conn.transaction():
        conn.execute(sql.SQL("SELECT * FROM {}(%s, %s)").format(append), ("fleet", b"first"))
        conn.execute(sql.SQL("SELECT * FROM {}(%s, %s)").format(append), ("fleet", Jsonb({"n": 2})))
    conn.execute(sql.SQL("SELECT * FROM {}(%s, %s)").format(append), ("fleet", b"third"))
    conn.commit()

    # Read as a consumer and ack through the second event, fenced by the lease's token.
    rows = conn.execute(sql.SQL("SELECT xid, position, body FROM {}(%s, 0, 0, 10)").format(read), ("fleet",)).fetchall()
    print("read", [bytes(body).decode() for (_, _, body) in rows])
    xid, position, _ = rows[1]
    with conn.transaction():
        moved = conn.execute(
            sql.SQL("SELECT {}(%s, %s, %s, %s, %s, %s)").format(ack),
            ("fleet", "python", xid, position, name, token),
        ).fetchone()[0]
    print("acked", moved)

    # A stale token: PC001, and the write in its transaction never commits.
    try:
        with conn.transaction():
            conn.execute(sql.SQL("INSERT INTO {} VALUES (%s)").format(sql.Identifier(resource)), ("stale",))
            conn.execute(sql.SQL("SELECT {}(%s, %s)").format(fence), (name, token - 1))
    except psycopg.Error as e:
        print("refused", e.sqlstate)
    else:
        sys.exit("a stale token was accepted")
