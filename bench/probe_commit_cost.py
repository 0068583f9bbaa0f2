"""Where a commit's time goes, apart from the client: two probes behind the issue 4/5 notes.

``pg``: server time of one ``sp_commit`` (a checkpoint with 1 message and 3 new blobs) against
LangGraph's two upserts, each in its own transaction, looped inside the server (a ``DO`` block
with ``COMMIT`` per iteration, ``synchronous_commit=off``): no client, no network, no fsync, so
what is left is the work of the rows themselves. Then each part of ``sp_commit`` alone.

``sqlite``: one fsynced WAL commit (``synchronous=FULL``) that inserts a 400 B row into 1, 2,
4, 6 or 10 tables: what each extra B-tree page a transaction dirties adds to the floor.

    python bench/probe_commit_cost.py pg      # the server of STASHPOINT_BENCH_POSTGRES_URL
    python bench/probe_commit_cost.py sqlite
"""

from __future__ import annotations

import os
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import pg_base, pg_schema

N = 3000

_ARGS = """lpad(i::text, 26, '0'), 'sess', 'main',
    CASE WHEN i = 1 THEN NULL ELSE lpad((i - 1)::text, 26, '0') END,
    decode(repeat('ab', 600), 'hex'), 'digest', true,
    CASE WHEN i = 1 THEN NULL ELSE lpad((i - 1)::text, 26, '0') END,
    '0', NULL, NULL, 'log1', i = 1, 'sess', NULL, 0, i - 1,
    ARRAY[sha256(('m' || i)::bytea)], ARRAY[decode(repeat('cd', 400), 'hex')],
    d, ARRAY[0, 0, 0], ARRAY[100, 200, 300]::bigint[], b, NULL"""

_BLOBS = """ARRAY[decode(repeat('ef', 300) || lpad(i::text, 8, '0'), 'hex'),
    decode(repeat('12', 200) || lpad(i::text, 8, '0'), 'hex'),
    decode(repeat('34', 100) || lpad(i::text, 8, '0'), 'hex')]"""

PG_CASES = {
    "sp_commit (whole checkpoint)": f"PERFORM sp_commit({_ARGS});",
    "LangGraph put: 2 upserts": """
        INSERT INTO lg_blobs VALUES ('t', '', 'messages', i::text, 'msgpack',
            decode(repeat('cd', 500), 'hex')) ON CONFLICT DO NOTHING;
        INSERT INTO lg_cp VALUES ('t', '', lpad(i::text, 26, '0'),
            lpad((i - 1)::text, 26, '0'), jsonb_build_object('counter', i), '{}'::jsonb)
            ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id)
            DO UPDATE SET checkpoint = EXCLUDED.checkpoint, metadata = EXCLUDED.metadata;""",
    "  part: lease check": "PERFORM sp_check_lease('sess', NULL);",
    "  part: gc epoch FOR SHARE": "SELECT value INTO v FROM sp_meta WHERE key = 'gc_epoch' "
    "FOR SHARE;",
    "  part: head compare-and-set": """
        IF i = 1 THEN INSERT INTO sp_heads VALUES ('sess', 'main', lpad(i::text, 26, '0'));
        ELSE UPDATE sp_heads SET checkpoint = lpad(i::text, 26, '0') WHERE session = 'sess'
            AND branch = 'main' AND checkpoint = lpad((i - 1)::text, 26, '0'); END IF;""",
    "  part: log append (tip check + 1 message)": """PERFORM sp_append('log1', i = 1, 'sess',
        NULL, 0, i - 1, ARRAY[sha256(('m' || i)::bytea)],
        ARRAY[decode(repeat('cd', 400), 'hex')], NULL, NULL);""",
    "  part: 3 blobs, ON CONFLICT DO NOTHING": """INSERT INTO sp_blobs(digest, codec, size,
        data) SELECT * FROM unnest(d, ARRAY[0, 0, 0], ARRAY[100, 200, 300]::bigint[], b)
        ON CONFLICT (digest) DO NOTHING;""",
    "  part: checkpoint row (2 indexes)": """INSERT INTO sp_checkpoints(id, session, branch,
        parent, body, digest) VALUES (lpad(i::text, 26, '0'), 'sess', 'main',
        lpad((i - 1)::text, 26, '0'), decode(repeat('ab', 600), 'hex'), 'digest');""",
    "  empty transaction (the loop itself)": "",
}


def probe_pg() -> None:
    import psycopg

    import stashpoint

    print(f"server time per transaction, {N} in a DO loop, synchronous_commit=off (us)")
    for label, stmt in PG_CASES.items():
        with pg_schema(pg_base(), "probe") as url:
            stashpoint.open(url).close()  # the schema and its functions
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute("SET synchronous_commit = off")
                conn.execute(
                    "CREATE TABLE lg_blobs(thread_id text, checkpoint_ns text, channel text, "
                    "version text, type text, blob bytea, "
                    "PRIMARY KEY (thread_id, checkpoint_ns, channel, version))"
                )
                conn.execute(
                    "CREATE TABLE lg_cp(thread_id text, checkpoint_ns text, checkpoint_id "
                    "text, parent_checkpoint_id text, checkpoint jsonb, metadata jsonb, "
                    "PRIMARY KEY (thread_id, checkpoint_ns, checkpoint_id))"
                )
                block = f"""
                    DO $$
                    DECLARE i int; d bytea[]; b bytea[]; v text;
                    BEGIN
                      FOR i IN 1..{N} LOOP
                        d := ARRAY[sha256(('a' || i)::bytea), sha256(('b' || i)::bytea),
                                   sha256(('c' || i)::bytea)];
                        b := {_BLOBS};
                        {stmt}
                        COMMIT;
                      END LOOP;
                    END $$"""
                t0 = time.perf_counter()
                conn.execute(block.encode())
                took = time.perf_counter() - t0
        print(f"{label:45s} {took / N * 1e6:8.1f}")


def probe_sqlite() -> None:
    print("one WAL commit at synchronous=FULL, a 400 B row into each of K tables (ms, median)")
    with tempfile.TemporaryDirectory() as tmp:
        payload = os.urandom(400)
        for k in (1, 2, 4, 6, 10):
            db = sqlite3.connect(Path(tmp) / f"k{k}.db", isolation_level=None)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=FULL")
            for t in range(k):
                db.execute(f"CREATE TABLE t{t}(id INTEGER PRIMARY KEY, v BLOB)")
            times = []
            for _ in range(1500):
                t0 = time.perf_counter()
                db.execute("BEGIN IMMEDIATE")
                for t in range(k):
                    db.execute(f"INSERT INTO t{t}(v) VALUES (?)", (payload,))
                db.execute("COMMIT")
                times.append(time.perf_counter() - t0)
            db.close()
            # past the WAL's first wrap, as a long-running store's is
            print(f"{k:3d} table(s) {statistics.median(times[500:]) * 1000:8.3f}")


if __name__ == "__main__":
    which = sys.argv[1] if len(sys.argv) > 1 else ""
    if which == "pg":
        probe_pg()
    elif which == "sqlite":
        probe_sqlite()
    else:
        sys.exit("usage: probe_commit_cost.py pg|sqlite")
