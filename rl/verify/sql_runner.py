"""The SQL runner, run inside a sandbox (stdlib only): builds a task's SQLite
database from its SQL script, then either runs one query for the policy (the
`sql` tool) or grades an answer query against the reference query.

The database is opened read-only for every query the policy wrote (an
authorizer refuses ATTACH, PRAGMA writes and every change), each query is cut
after a budget of virtual-machine steps, and at most `max_rows` rows come
back. Grading compares results as lists of rows (floats rounded to 6
places), as multisets unless the question asks for an order. PARAMS:

    {"op": "build", "script": SQL, "db": PATH}
    {"op": "query", "db": PATH, "query": SQL, "max_rows": N}
    {"op": "grade", "script": SQL, "reference": SQL, "answer": SQL, "ordered": BOOL}

The result is one JSON line after the marker.
"""

import json
import os
import sqlite3
import sys

MARKER = "@@SARL-SQL@@"
STEPS = 20_000_000
"""Virtual-machine steps one query may take (about a second or two here)."""


def _deny_writes(action, *args):
    allowed = {
        sqlite3.SQLITE_SELECT,
        sqlite3.SQLITE_READ,
        sqlite3.SQLITE_FUNCTION,
        sqlite3.SQLITE_RECURSIVE,
    }
    return sqlite3.SQLITE_OK if action in allowed else sqlite3.SQLITE_DENY


def build(script, db):
    if os.path.exists(db):
        os.unlink(db)
    conn = sqlite3.connect(db)
    conn.executescript(script)
    conn.commit()
    conn.close()


def run_query(db, query, max_rows):
    """(column names, rows, more rows left out) of a read-only query."""
    conn = sqlite3.connect("file:%s?mode=ro" % db, uri=True)
    left = [STEPS // 1000]

    def budget():
        left[0] -= 1
        return left[0] <= 0  # non-zero aborts the query

    conn.set_progress_handler(budget, 1000)
    conn.set_authorizer(_deny_writes)
    try:
        cur = conn.execute(query)
        rows = cur.fetchmany(max_rows + 1)
        names = [d[0] for d in cur.description or []]
    finally:
        conn.close()
    return names, [list(r) for r in rows[:max_rows]], len(rows) > max_rows


def norm(rows):
    return [[round(v, 6) if isinstance(v, float) else v for v in r] for r in rows]


def key(row):
    return json.dumps(row, default=str)


def grade(p):
    db = "/tmp/grade.db"
    build(p["script"], db)
    _, want, _ = run_query(db, p["reference"], 100_000)
    try:
        _, got, more = run_query(db, p["answer"], 100_000)
    except sqlite3.Error as e:
        return {"ok": False, "why": "the answer query failed: %s" % str(e)[:200]}
    if more:
        return {"ok": False, "why": "the answer returns more than 100000 rows"}
    want, got = norm(want), norm(got)
    if not p["ordered"]:
        want, got = sorted(want, key=key), sorted(got, key=key)
    if got == want:
        return {"ok": True, "why": ""}
    return {
        "ok": False,
        "why": "%d rows, expected %d%s" % (len(got), len(want), "" if len(got) != len(want) else " with other values"),
    }


def main(p):
    try:
        if p["op"] == "build":
            build(p["script"], p["db"])
            return {"ok": True}
        if p["op"] == "query":
            names, rows, more = run_query(p["db"], p["query"], p["max_rows"])
            return {"columns": names, "rows": rows, "more": more}
        return grade(p)
    except sqlite3.Error as e:
        # "interrupted": the step budget cut the query (a runaway recursive CTE, a huge join)
        return {"error": "%s: %s" % (type(e).__name__, str(e)[:300]), "cut": "interrupted" in str(e)}


if __name__ == "__main__":
    out = json.dumps(main(globals()["PARAMS"]), default=str)
    sys.stdout.write("\n" + MARKER + out + "\n")
