"""The Node.js runner, run inside a sandbox (stdlib only): calls a JavaScript
function with each test's arguments in a `node` process, and compares what
comes back with the expected values here, in Python.

The expected values never enter the node process: it gets the solution and
the arguments, and answers each call as JSON on a pipe of its own (fd 3),
so that nothing the solution prints or forges can pass a case it did not
compute. A call that does not answer within `call_s` ends the process; the
cases after it fail as timeouts. PARAMS:

    {"solution": JS, "entry": NAME, "calls": [[args...], ...], "expected": [value, ...], "call_s": S}

The result is one JSON line after the marker: per-case results, the
output the solution printed (for an observation), and its error if it did
not load.
"""

import json
import os
import select
import subprocess
import sys
import time

MARKER = "@@SARL-NODE@@"

HARNESS = r"""
const fs = require("fs");
const out = (o) => fs.writeSync(3, JSON.stringify(o) + "\n");
const P = JSON.parse(fs.readFileSync(0, "utf8"));
let fn;
try {
  fn = new Function(P.solution + "\n;return typeof " + P.entry + " === 'function' ? " + P.entry + " : undefined;")();
} catch (e) {
  out({ load: String(e && e.stack || e).slice(0, 400) });
  process.exit(0);
}
if (typeof fn !== "function") { out({ load: "no function named " + P.entry }); process.exit(0); }
out({ ready: true });
P.calls.forEach((args, i) => {
  try {
    const v = fn(...args);
    out(v === undefined ? { i, error: "returned undefined" } : { i, ok: v });
  } catch (e) {
    out({ i, error: String(e && e.name || e).slice(0, 100) + ": " + String(e && e.message || "").slice(0, 100) });
  }
});
"""


def same(a, b):
    """JSON values equal as JavaScript means them: 2 and 2.0 alike, true and 1 not."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def main(p):
    r, w = os.pipe()
    # the harness writes its answers to fd 3: make the pipe's write end fd 3 in the child
    proc = subprocess.Popen(
        ["node", "-e", HARNESS],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        pass_fds=(3,),
        preexec_fn=lambda: os.dup2(w, 3),
        cwd="/sandbox",
    )
    os.close(w)
    assert proc.stdin is not None
    proc.stdin.write(json.dumps({"solution": p["solution"], "entry": p["entry"], "calls": p["calls"]}).encode())
    proc.stdin.close()
    buf, load = b"", None
    answers = {}  # type: dict[int, dict]
    n = len(p["calls"])
    deadline = time.monotonic() + p["call_s"] + 2.0  # start-up, then one call's time per answer
    ready = ended = False
    while len(answers) < n and load is None:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        got, _, _ = select.select([r], [], [], left)
        if not got:
            break
        chunk = os.read(r, 1 << 16)
        if not chunk:
            ended = True
            break
        buf += chunk
        while b"\n" in buf:
            line, _, buf = buf.partition(b"\n")
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            if not isinstance(msg, dict):
                continue
            if "load" in msg and not ready:
                load = str(msg["load"])
            elif msg.get("ready"):
                ready = True
            elif isinstance(msg.get("i"), int) and msg["i"] not in answers:
                answers[msg["i"]] = msg
                deadline = time.monotonic() + p["call_s"]
    proc.kill()
    printed = proc.stdout.read(4000).decode(errors="replace") if proc.stdout else ""
    proc.wait()
    cases = []
    for i, want in enumerate(p["expected"]):
        a = answers.get(i)
        if load is not None:
            cases.append({"ok": False, "why": "did not load"})
        elif a is None and ended:
            cases.append({"ok": False, "why": "crash: the node process ended", "crash": True})
        elif a is None:
            cases.append({"ok": False, "why": "timeout"})
        elif "error" in a:
            cases.append({"ok": False, "why": str(a["error"])[:200], "crash": True})
        else:
            ok = same(a.get("ok"), want)
            cases.append({"ok": ok, "why": "" if ok else "wrong value", "got": json.dumps(a.get("ok"))[:200]})
    return {"cases": cases, "load_error": load, "printed": printed[-2000:]}


if __name__ == "__main__":
    # what the solution printed is in the payload: "@" escaped, the marker occurs once
    out = json.dumps(main(globals()["PARAMS"])).replace("@", "\\u0040")
    sys.stdout.write("\n" + MARKER + out + "\n")
