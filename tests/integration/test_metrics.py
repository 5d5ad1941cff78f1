"""psd's Prometheus /metrics against a real psd on 127.0.0.1:0: the page
passes Debian's `promtool check metrics` with no lint problem, and its
figures move with the calls made (pushes, pulls, refusals, waits, commits,
a checkpoint). Bad input: a metrics port already taken stops psd at start
with one line naming the address; a value that is not HOST:PORT likewise;
raw garbage on the metrics socket gets the library's 400 and psd serves the
next scrape and Pull; "off" serves no endpoint.

Exit 77 (skipped) with one line when promtool is not installed
(apt install prometheus).
"""
import os
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import grpc
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "interop"))
import pstest  # noqa: E402

SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$')
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse(text):
    """{(name, ((label, value), ...)): float} of every sample of the page."""
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = SAMPLE.match(line)
        if m is None:
            raise ValueError("not a sample line: %r" % line)
        labels = tuple(sorted(LABEL.findall(m.group(2) or "")))
        out[(m.group(1), labels)] = float(m.group(3))
    return out


def get(page, name, **labels):
    return page.get((name, tuple(sorted(labels.items()))))


def metrics_port(d):
    """The METRICS_PORT line psd prints right after PORT (read with
    readline: it may sit in the pipe's buffer already, where select would
    not see it; the test's timeout bounds the read)."""
    line = d.proc.stdout.readline()
    if not line.startswith("METRICS_PORT "):
        raise RuntimeError("psd printed %r after PORT, not METRICS_PORT" % line)
    return int(line.split()[1])


def scrape(port):
    with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=10) as f:
        return f.status, f.headers.get("Content-Type", ""), f.read().decode()


def http_status(port, path, method="GET"):
    req = urllib.request.Request("http://127.0.0.1:%d%s" % (port, path), method=method,
                                 data=b"x" if method == "POST" else None)
    try:
        with urllib.request.urlopen(req, timeout=10) as f:
            return f.status
    except urllib.error.HTTPError as e:
        return e.code


def raw(port, data):
    """Sends data on a fresh connection; returns the answer's first line."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(data)
        s.shutdown(socket.SHUT_WR)
        got = pstest.recv_all(s)
    return got.split(b"\r\n", 1)[0].decode(errors="replace")


def run_psd(*args, timeout=30):
    """Runs psd to its exit (a start that fails); returns (status, stderr lines)."""
    argv = [pstest.psd_path(), "--data-dir", pstest.tmpdir(), "--listen", "127.0.0.1:0",
            "--log-level", "warn"] + list(args)
    p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       timeout=timeout)
    return p.returncode, [l for l in p.stderr.splitlines() if l.strip()]


def check_page(r, promtool, port, what):
    """Scrapes, checks the page with promtool; returns it parsed."""
    status, ctype, text = scrape(port)
    r.check(status == 200 and ctype.startswith("text/plain; version=0.0.4"),
            "%s: GET /metrics is 200 %s" % (what, ctype))
    p = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True,
                       text=True, timeout=60)
    problems = (p.stdout + p.stderr).strip()
    r.check(p.returncode == 0 and problems == "",
            "%s: promtool check metrics passes with no problem%s"
            % (what, (": " + problems) if problems else ""))
    return parse(text)


def cumulative(page, name):
    """Whether name's buckets rise with le and +Inf equals _count."""
    buckets = sorted((float(dict(k[1])["le"]), v) for k, v in page.items()
                     if k[0] == name + "_bucket")
    counts = [v for _, v in buckets]
    return (len(buckets) > 1 and counts == sorted(counts) and buckets[-1][0] == float("inf")
            and counts[-1] == get(page, name + "_count"))


def main():
    promtool = pstest.need_programs("promtool", apt="prometheus")
    pb, pbg, _, _ = pstest.generate_stubs()
    r = pstest.Results("metrics")

    d = pstest.start_psd(pstest.tmpdir(), "--metrics-listen", "127.0.0.1:0")
    mport = metrics_port(d)
    r.check(mport > 0 and mport != d.port, "psd prints METRICS_PORT %d after PORT" % mport)
    stub = pbg.ParameterServerStub(pstest.channel(d.address))

    page = check_page(r, promtool, mport, "fresh psd")
    r.check(get(page, "psd_variables") == 0 and get(page, "psd_pushes_total") == 0 and
            get(page, "psd_push_seconds_count") == 0,
            "a fresh psd shows no variable and no push")

    stub.CreateVariable(pb.CreateVariableRequest(spec=pstest.spec(pb, "w", (4, 3))),
                        timeout=10)
    pushes, pulls = 5, 3
    for _ in range(pushes):
        stub.Push(pb.PushRequest(grads=[pstest.grad(pb, "w", np.ones((4, 3)))]), timeout=10)
    for _ in range(pulls):
        stub.Pull(pb.PullRequest(items=[pb.PullItem(name="w")]), timeout=10)
    try:
        stub.Push(pb.PushRequest(grads=[pstest.grad(pb, "nope", np.ones(3))]), timeout=10)
    except grpc.RpcError:
        pass
    # A Pull waiting for the next version shows as waiting until a push.
    fut = stub.Pull.future(pb.PullRequest(items=[pb.PullItem(name="w",
                                                              min_version=pushes + 1)]),
                           timeout=20)
    waiting = None
    for _ in range(100):
        waiting = get(parse(scrape(mport)[2]), "psd_pulls_waiting")
        if waiting == 1:
            break
        time.sleep(0.05)
    r.check(waiting == 1, "a Pull waiting for a version: psd_pulls_waiting 1")
    stub.Push(pb.PushRequest(grads=[pstest.grad(pb, "w", np.ones((4, 3)))]), timeout=10)
    pushes += 1
    fut.result(timeout=20)
    pulls += 1
    stub.Checkpoint(pb.CheckpointRequest(step=0), timeout=30)
    time.sleep(0.3)  # past a commit interval: the write-behind is done

    page = check_page(r, promtool, mport, "after calls")
    want = {
        ("psd_calls_total", "Push"): pushes + 1,
        ("psd_calls_total", "Pull"): pulls,
        ("psd_calls_total", "CreateVariable"): 1,
        ("psd_calls_total", "Checkpoint"): 1,
    }
    for (name, method), n in want.items():
        got = get(page, name, method=method)
        r.check(got == n, '%s{method="%s"} is %s (want %d)' % (name, method, got, n))
    for name, n in (("psd_pushes_total", pushes), ("psd_push_seconds_count", pushes),
                    ("psd_pulls_total", pulls), ("psd_pull_seconds_count", pulls),
                    ("psd_gradient_bytes_total", pushes * 48),
                    ("psd_value_bytes_sent_total", pulls * 48),
                    ("psd_variables", 1), ("psd_elements", 12), ("psd_value_bytes", 48),
                    ("psd_pulls_waiting", 0), ("psd_checkpoint_seconds_count", 1),
                    ("psd_checkpoint_last_step", pushes),
                    ("psd_write_behind_lag_seconds", 0)):
        got = get(page, name)
        r.check(got == n, "%s is %s (want %d)" % (name, got, n))
    r.check(get(page, "psd_refused_total", reason="not_found") == 1 and
            get(page, "psd_refused_total", reason="invalid_argument") == 0,
            "the push to an unknown variable: psd_refused_total{reason=\"not_found\"} 1")
    r.check(get(page, "psd_received_bytes_total", method="Push") > pushes * 48,
            "psd_received_bytes_total{method=\"Push\"} holds the pushes' bytes")
    for h in ("psd_push_seconds", "psd_pull_seconds", "psd_commit_seconds",
              "psd_checkpoint_seconds"):
        r.check(cumulative(page, h), "%s: buckets cumulative, +Inf equals _count" % h)
    r.check(get(page, "psd_push_seconds_sum") > 0, "psd_push_seconds_sum > 0")
    r.check(get(page, "psd_commit_seconds_count") >= 1 and get(page, "psd_commits_total") >= 1,
            "the write-behind committed: psd_commit_seconds_count %s"
            % get(page, "psd_commit_seconds_count"))
    r.check(get(page, "psd_checkpoint_last_bytes") > 0,
            "psd_checkpoint_last_bytes %s" % get(page, "psd_checkpoint_last_bytes"))
    rss = get(page, "psd_resident_memory_bytes")
    r.check(rss is not None and rss > get(page, "psd_value_bytes"),
            "psd_resident_memory_bytes %s beside psd_value_bytes" % rss)

    # A sparse table: every sparse counter of Stats on the page, by the
    # same count.
    stub.CreateVariable(pb.CreateVariableRequest(spec=pstest.spec(
        pb, "emb", (4,), sparse=True)), timeout=10)
    g = np.ones((3, 4), np.float32)
    stub.SparsePush(pb.SparsePushRequest(grads=[pb.SparseGradient(
        name="emb", ids=[1, 2, 3], grad=pb.Tensor(dtype=pb.DTYPE_FLOAT32, shape=[3, 4],
                                                  data=g.tobytes()))]), timeout=10)
    stub.SparsePull(pb.SparsePullRequest(items=[pb.SparsePullItem(
        name="emb", ids=[1, 2, 9])]), timeout=10)
    time.sleep(0.3)
    page = check_page(r, promtool, mport, "with a sparse table")
    st = stub.Stats(pb.StatsRequest(), timeout=10)
    for name, field in (("psd_sparse_tables", "sparse_tables"),
                        ("psd_sparse_rows", "sparse_rows"),
                        ("psd_sparse_ram_bytes", "sparse_ram_bytes"),
                        ("psd_sparse_index_bytes", "sparse_index_bytes"),
                        ("psd_sparse_rows_unsaved", "sparse_rows_unsaved"),
                        ("psd_sparse_rows_pulled_total", "sparse_rows_pulled"),
                        ("psd_sparse_rows_pushed_total", "sparse_rows_pushed"),
                        ("psd_sparse_admitted_total", "sparse_admitted"),
                        ("psd_sparse_not_admitted_total", "sparse_not_admitted"),
                        ("psd_sparse_evicted_total", "sparse_evicted"),
                        ("psd_sparse_cold_reads_total", "sparse_rows_read_lmdb")):
        got, want = get(page, name), getattr(st, field)
        r.check(got == want, "%s is %s, Stats' %s %s" % (name, got, field, want))
    r.check(get(page, "psd_sparse_rows") == 3 and get(page, "psd_sparse_rows_pulled_total") == 3
            and get(page, "psd_sparse_ram_hits_total") >= 2
            and get(page, "psd_sparse_ram_misses_total") >= 4
            and get(page, "psd_sparse_commits_total") >= 1
            and get(page, "psd_sparse_row_bytes") == 3 * (16 + 4 * 4),
            "the sparse series count 3 rows of 32 bytes, hits, misses and a commit")
    ram_rows = sum(v.sparse_ram_rows for v in stub.ListVariables(
        pb.ListVariablesRequest(), timeout=10).variables)
    r.check(get(page, "psd_sparse_ram_rows") == ram_rows == 3,
            "psd_sparse_ram_rows is %s, ListVariables' %s" % (get(page, "psd_sparse_ram_rows"),
                                                             ram_rows))
    for name in ("psd_sparse_disk_bytes", "psd_sparse_log_bytes",
                 "psd_sparse_ram_budget_bytes", "psd_sparse_refused_rows_total",
                 "psd_sparse_commit_rows_per_second"):
        r.check(get(page, name) is not None, "%s is on the page" % name)

    r.check(http_status(mport, "/") == 404 and http_status(mport, "/metrics/x") == 404,
            "another path is 404")
    r.check(http_status(mport, "/metrics", "POST") == 405, "POST /metrics is 405")
    for junk in (b"garbage garbage garbage\r\n\r\n",
                 b"GET /metrics HTTP/1.1\r\n\r\n",  # HTTP/1.1 without Host
                 b"GET /metrics HTTP/1.1\r\nHost: x\r\nno colon here\r\n\r\n",
                 b"GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n"):
        first = raw(mport, junk)
        r.check(re.match(r"HTTP/1\.[01] 400", first) is not None,
                "malformed request %r: %s" % (junk[:32], first))
    # Binary bytes with no request line in them: the library just closes.
    first = raw(mport, b"\x16\x03\x01\x02\x00\x01\xfc\x03\x03" * 8 + b"\r\n\r\n")
    r.check(first == "" or re.match(r"HTTP/1\.[01] 400", first) is not None,
            "a TLS hello on the metrics port: closed or 400 (%r)" % first)
    r.check(scrape(mport)[0] == 200 and d.proc.poll() is None,
            "after the malformed requests psd still serves /metrics")
    got = stub.Pull(pb.PullRequest(items=[pb.PullItem(name="w")]), timeout=10)
    r.check(got.values[0].version == pushes, "... and a Pull")
    r.check(d.stop() == 0, "psd stops cleanly with the endpoint up")

    # Bad input at start.
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        addr = "127.0.0.1:%d" % taken.getsockname()[1]
        rc, lines = run_psd("--metrics-listen", addr)
    r.check(rc == 1 and len(lines) == 1 and addr in lines[0],
            "metrics port taken: exit %s, %s" % (rc, lines))
    rc, lines = run_psd("--metrics-listen", "localhost")
    r.check(rc == 2 and len(lines) == 1 and "'localhost' is not HOST:PORT" in lines[0],
            "--metrics-listen localhost: exit %s, %s" % (rc, lines))

    off = pstest.start_psd(pstest.tmpdir(), "--metrics-listen", "off")
    off.stop()
    rest = off.proc.stdout.read()
    r.check("METRICS_PORT" not in rest, "--metrics-listen off: no endpoint, no METRICS_PORT")
    r.finish()


if __name__ == "__main__":
    main()
