"""psctl for scripts, against a real two-shard job on 127.0.0.1:0 (pscoord
and two psd registered with it as its ps tasks, temporary directories):

  json      -o json on every read command (stats, list, status, top --once,
            cluster validate) parses with Python's json, has the fields
            doc/psctl.md lists, and its figures agree with the daemons';
  fan-out   with --coordinator, stats and list ask every shard of the job:
            a shard per psd, totals that are the sums, a SHARD column and a
            TOTAL row in the text;
  mismatch  a psd command sent to pscoord, or a pscoord command sent to psd,
            is one line naming the mismatch and exit 2, not UNIMPLEMENTED;
  exit      0 ok, 1 a failed call, 2 bad usage, as --help states.

Prints ok/FAIL per check and "psctl-json: N passed, N failed".
"""
import json
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "interop"))
import pstest  # noqa: E402

PSCOORD = os.path.join(pstest.BUILD_ROOT, "coordinator", "pscoord")
PSCTL = os.path.join(pstest.BUILD_ROOT, "tools", "psctl")
DOC = os.path.join(pstest.SOURCE_ROOT, "doc", "psctl.md")


def psctl(*args, env=None):
    e = dict(os.environ if env is None else env)
    e.pop("PSD_ADDR", None)
    e.pop("PSCOORD_ADDR", None)
    return subprocess.run([PSCTL, *args], capture_output=True, text=True, timeout=60,
                          env=e)


def as_json(p):
    try:
        return json.loads(p.stdout) if p.returncode == 0 else None
    except ValueError:
        return None


def one_line(p, code, *words):
    lines = [l for l in p.stderr.splitlines() if l.strip()]
    ok = p.returncode == code and len(lines) == 1 and lines[0].startswith("psctl: ") \
        and all(w in lines[0] for w in words)
    return ok, "exit %d, %r" % (p.returncode, lines[0] if lines else p.stderr)


def documented(keys):
    """The keys that doc/psctl.md does not name in backquotes."""
    with open(DOC) as f:
        doc = f.read()
    return sorted(k for k in keys if "`%s`" % k not in doc)


def main():
    r = pstest.Results("psctl-json")
    coord = pstest.Daemon([PSCOORD, "--state-dir", pstest.tmpdir("psctl-json-coord-"),
                           "--listen", "127.0.0.1:0", "--job-id", "j",
                           "--heartbeat-interval", "200ms", "--log-level", "warn"])
    caddr = coord.address
    shards = [pstest.start_psd(pstest.tmpdir(), "--coordinator", caddr, "--job-id", "j")
              for _ in range(2)]

    def registered():
        st = as_json(psctl("status", "--coordinator", caddr, "-o", "json"))
        ps = [t for t in (st or {}).get("tasks", []) if t["role"] == "PS" and t["alive"]]
        return st if len(ps) == 2 else None
    status = pstest.wait_until(registered, timeout=20)
    r.check(status is not None, "both psd register with pscoord as ps tasks")
    if status is None:
        r.finish()
    index = {t["address"]: t["index"] for t in status["tasks"] if t["role"] == "PS"}

    # A variable of its own on each shard, and pulls that Stats counts.
    tmp = pstest.tmpdir()
    for k, d in enumerate(shards):
        p = psctl("--server", d.address, "create", "v%d" % k, "--shape", "%d,4" % (k + 2),
                  "--optimizer", "adam" if k else "sgd")
        r.check(p.returncode == 0, "create v%d on %s: %s" % (k, d.address, p.stderr.strip()))
        for _ in range(k + 1):
            psctl("--server", d.address, "pull", "v%d" % k, "-o",
                  os.path.join(tmp, "v%d.npy" % k))

    # stats -o json over the job.
    p = psctl("stats", "--coordinator", caddr, "-o", "json")
    js = as_json(p)
    r.check(js is not None and js.get("job_id") == "j" and len(js.get("shards", [])) == 2,
            "stats --coordinator -o json: one object, job j, two shards (%s)"
            % (p.stderr.strip() or p.stdout[:200]))
    if js is None:
        r.finish()
    got = {s["server"]: s for s in js["shards"]}
    r.check(set(got) == {d.address for d in shards} and
            all(got[a]["shard"] == index[a] for a in got),
            "each shard is named by its index and address as pscoord has them: %s"
            % {a: s["shard"] for a, s in got.items()})
    r.check([s["shard"] for s in js["shards"]] == sorted(index.values()),
            "the shards come in index order")
    r.check(all(got[d.address]["variables"] == 1 for d in shards) and
            js["total"]["variables"] == 2,
            "variables: 1 per shard, total 2 (%s)" % js["total"].get("variables"))
    r.check(js["total"]["pulls"] == sum(s["pulls"] for s in js["shards"]) >= 3 and
            js["total"]["value_bytes"] == (2 * 4 + 3 * 4) * 4 and
            js["total"]["slot_bytes"] == sum(s["slot_bytes"] for s in js["shards"]) > 0,
            "totals are the shards' sums: pulls %s, value_bytes %s, slot_bytes %s"
            % (js["total"]["pulls"], js["total"]["value_bytes"], js["total"]["slot_bytes"]))
    r.check(js["total"]["uptime_seconds"] == min(s["uptime_seconds"] for s in js["shards"])
            and js["total"]["transport_security"] == "plaintext",
            "uptime's total is the youngest shard's; a string all shards share is kept")
    want = {"variables", "value_bytes", "slot_bytes", "pushes", "pulls", "bytes_received",
            "bytes_sent", "resident_bytes", "uptime_seconds", "last_checkpoint_step",
            "sparse_tables", "sparse_rows", "sparse_ram_bytes", "transport_security",
            "shard", "server"}
    r.check(all(want <= set(s) for s in js["shards"]),
            "each shard carries the Stats fields, the sparse ones too: missing %s"
            % sorted(want - set(js["shards"][0])))

    p = psctl("stats", "--server", shards[0].address, "-o", "json")
    one = as_json(p)
    r.check(one is not None and one["job_id"] is None and len(one["shards"]) == 1 and
            one["shards"][0]["shard"] is None and
            one["shards"][0]["server"] == shards[0].address and
            one["total"]["variables"] == 1,
            "stats --server -o json: the same shape, one shard, shard null, job null")

    # list -o json over the job.
    p = psctl("list", "--coordinator", caddr, "-o", "json")
    ls = as_json(p)
    names = {(v["spec"]["name"], v["server"]) for v in (ls or {}).get("variables", [])}
    r.check(ls is not None and names == {("v0", shards[0].address),
                                         ("v1", shards[1].address)},
            "list --coordinator -o json: each variable with its shard (%s)" % sorted(names))
    if ls:
        v1 = [v for v in ls["variables"] if v["spec"]["name"] == "v1"][0]
        r.check(v1["spec"]["shape"] == [3, 4] and v1["spec"]["optimizer"]["kind"] == "ADAM"
                and v1["spec"]["dtype"] == "DTYPE_FLOAT32" and v1["value_bytes"] == 48
                and v1["shard"] == index[shards[1].address]
                and v1["spec"]["optimizer"]["learning_rate"] == 0.01,
                "a variable's spec, sizes and shard: %s" % json.dumps(v1)[:300])
        r.check(ls["total"] == {"variables": 2, "value_bytes": 80,
                                "slot_bytes": sum(v["slot_bytes"] for v in ls["variables"])},
                "list's total: %s" % ls["total"])

    # The text forms have the shard column and the totals.
    p = psctl("stats", "--coordinator", caddr)
    rows = p.stdout.splitlines()
    r.check(p.returncode == 0 and rows[1].split()[0] == "SHARD" and
            rows[-1].split()[:2] == ["TOTAL", "2"] and len(rows) == 5,
            "stats --coordinator: a row per shard and a TOTAL row:\n%s" % p.stdout)
    p = psctl("list", "--coordinator", caddr)
    rows = p.stdout.splitlines()
    r.check(p.returncode == 0 and rows[0].split()[:2] == ["SHARD", "NAME"] and
            re.match(r"TOTAL +2 variables on 2 shards", rows[-1]) is not None,
            "list --coordinator: a SHARD column and a TOTAL line:\n%s" % p.stdout)

    # status and top --once.
    for args in (["status"], ["top", "--once"]):
        p = psctl(*args, "--coordinator", caddr, "-o", "json")
        st = as_json(p)
        r.check(st is not None and st["job_id"] == "j" and st["num_ps"] == 2 and
                "generation" in st and "epoch" not in st and
                all(t["state"] == "alive" for t in st["tasks"]) and
                all("lag" in t for t in st["tasks"]),
                "%s -o json: job, generation (no epoch), tasks with state and lag (%s)"
                % (" ".join(args), p.stderr.strip() or sorted(st or {})))
    p = psctl("status", "--coordinator", caddr)
    r.check(p.returncode == 0 and re.search(r"^generation +\d+$", p.stdout, re.M) and
            "epoch" not in p.stdout,
            "status's text names the membership counter the generation:\n%s" % p.stdout)
    p = psctl("top", "--coordinator", caddr, "-o", "json")
    ok, line = one_line(p, 2, "--once")
    r.check(ok, "top -o json without --once is bad usage: %s" % line)

    # cluster validate.
    spec = os.path.join(tmp, "tf.json")
    with open(spec, "w") as f:
        json.dump({"cluster": {"ps": ["h0:2222", "h1:2222"], "worker": ["w0:2222"]},
                   "task": {"type": "worker", "index": 0}}, f)
    p = psctl("cluster", "validate", spec, "-o", "json")
    cv = as_json(p)
    r.check(cv is not None and cv["tasks"] == 3 and
            cv["cluster"]["ps"] == ["h0:2222", "h1:2222"] and
            cv["task"] == {"type": "worker", "index": 0, "address": "w0:2222"} and
            cv["job_id"] is None,
            "cluster validate -o json: %s" % (cv or p.stderr.strip()))

    # The documented fields: every key the commands print is in doc/psctl.md.
    if os.path.exists(DOC):
        keys = set(js) | set(js["shards"][0]) | set(js["total"])
        if ls:
            keys |= set(ls) | set(ls["variables"][0]) | set(ls["variables"][0]["spec"])
        if st:
            keys |= set(st) | set(st["tasks"][0])
        if cv:
            keys |= set(cv) | set(cv["task"])
        missing = documented(keys)
        r.check(not missing, "doc/psctl.md names every JSON field: missing %s" % missing)

    # The wrong daemon: one line naming the mismatch, exit 2.
    for args, words in ((["stats", "--server", caddr], ["is pscoord, not psd", caddr]),
                        (["list", "--server", caddr], ["is pscoord, not psd"]),
                        (["status", "--coordinator", shards[0].address],
                         ["is psd, not pscoord", shards[0].address]),
                        (["top", "--once", "--coordinator", shards[0].address],
                         ["is psd, not pscoord"]),
                        (["status", "--watch", "--coordinator", shards[0].address],
                         ["is psd, not pscoord"]),
                        (["show", "w", "--server", caddr], ["is pscoord, not psd"])):
        p = psctl(*args)
        ok, line = one_line(p, 2, *words)
        r.check(ok and "UNIMPLEMENTED" not in p.stderr,
                "%s sent to the wrong daemon: %s" % (args[0], line))

    # Exit statuses.
    p = psctl("stats", "--server", "127.0.0.1:%d" % pstest.free_port(), "--rpc-timeout", "2s")
    ok, line = one_line(p, 1, "cannot reach psd")
    r.check(ok, "a failed call exits 1: %s" % line)
    p = psctl("stats", "--coordinator", "127.0.0.1:%d" % pstest.free_port(),
              "--rpc-timeout", "2s")
    ok, line = one_line(p, 1, "cannot reach pscoord")
    r.check(ok, "an unreachable coordinator exits 1: %s" % line)
    for args, words in ((["stats", "-o", "yaml"], ["--output", "yaml"]),
                        (["list", "--server", shards[0].address, "--coordinator", caddr],
                         ["--server", "--coordinator"]),
                        (["status", "--watch", "-o", "json"], ["--watch"])):
        p = psctl(*args)
        ok, line = one_line(p, 2, *words)
        r.check(ok, "bad usage exits 2 (%s): %s" % (" ".join(args), line))
    for args in (["--help"], ["stats", "--help"], ["list", "--help"]):
        p = psctl(*args)
        r.check(p.returncode == 0 and "Exit status: 0 success; 1 " in p.stdout and
                "2 bad usage" in p.stdout,
                "psctl %s states the exit statuses" % " ".join(args))

    for d in shards:
        d.stop()
    coord.stop()
    r.finish()


if __name__ == "__main__":
    main()
