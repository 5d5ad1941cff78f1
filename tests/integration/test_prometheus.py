"""A real Prometheus against a local cluster on 127.0.0.1: pscoord, one psd
and one workerd training, each with /metrics on a free loopback port;
Debian's `prometheus` scrapes the three every second (a prometheus.yml
written in a temporary directory, its TSDB there too, its web API on a free
loopback port). Checks, through Prometheus' HTTP API: /api/v1/targets shows
the three targets up; /api/v1/query gives back psd_push_seconds_count,
workerd_examples_per_second and pscoord_tasks{state="alive"} with plausible
values (> 0). Also `promtool check config` on deploy/prometheus.yml.

Bounded in time (90 s for the cluster and Prometheus to show the figures);
Prometheus and the cluster are stopped whatever happens. Exit 77 (skipped)
with one line without prometheus/promtool or Fashion-MNIST.
"""
import json
import os
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "interop"))
import pstest  # noqa: E402

PSCOORD = os.path.join(pstest.BUILD_ROOT, "coordinator", "pscoord")
WORKERD = os.path.join(pstest.BUILD_ROOT, "worker", "workerd")
FM = "/usr/share/datasets/fashion-mnist"
BUDGET = 90.0


class Proc:
    """A process in its own group, stopped (SIGTERM, then SIGKILL) by stop()
    and at exit, its stderr in a file of the test's directory."""

    def __init__(self, argv, log_path):
        self.log_path = log_path
        with open(log_path, "w") as log:
            self.p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=log, text=True,
                                      start_new_session=True)

    def line(self, prefix):
        """Reads stdout until a line starting with prefix; its number."""
        for line in self.p.stdout:
            if line.startswith(prefix):
                return int(line.split()[1])
        raise RuntimeError("%s exited before printing %s; see %s"
                           % (os.path.basename(self.p.args[0]), prefix.strip(),
                              self.log_path))

    def stop(self):
        if self.p.poll() is None:
            try:
                os.killpg(self.p.pid, signal.SIGTERM)
                self.p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.p.pid, signal.SIGKILL)
                self.p.wait()
            except ProcessLookupError:
                pass
        if self.p.stdout:
            self.p.stdout.close()

    def tail(self):
        with open(self.log_path) as f:
            return f.read()[-2000:]


def api(port, path, **params):
    url = "http://127.0.0.1:%d%s" % (port, path)
    if params:
        url += "?" + urllib.parse.urlencode(params)
    with urllib.request.urlopen(url, timeout=5) as f:
        return json.load(f)


def targets_up(port):
    """{job: health} of Prometheus' active targets (empty while it starts)."""
    try:
        got = api(port, "/api/v1/targets")
    except OSError:
        return {}
    return {t["labels"]["job"]: t["health"] for t in got["data"]["activeTargets"]}


def query(port, expr):
    """An instant query's vector as [(labels, value)] (empty before any
    sample)."""
    try:
        got = api(port, "/api/v1/query", query=expr)
    except OSError:
        return []
    if got.get("status") != "success":
        return []
    return [(s["metric"], float(s["value"][1])) for s in got["data"]["result"]]


def start_cluster(tmp, procs):
    """pscoord, psd and a training workerd; returns their metrics ports."""
    coord = Proc([PSCOORD, "--state-dir", os.path.join(tmp, "coord"),
                  "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0",
                  "--log-level", "warn"], os.path.join(tmp, "pscoord.log"))
    procs.append(coord)
    cport = coord.line("PORT ")
    cmport = coord.line("METRICS_PORT ")
    coord_addr = "127.0.0.1:%d" % cport
    ps = Proc([pstest.psd_path(), "--data-dir", os.path.join(tmp, "ps0"),
               "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0",
               "--coordinator", coord_addr, "--log-level", "warn"],
              os.path.join(tmp, "psd.log"))
    procs.append(ps)
    ps.line("PORT ")
    psmport = ps.line("METRICS_PORT ")
    # Trains until stopped: the test ends it.
    w = Proc([WORKERD, "--coordinator", coord_addr, "--model", "mlp:784-64-10",
              "--epochs", "0", "--steps", "2000000000", "--no-evaluate",
              "--progress", "0", "--json", "--metrics-listen", "127.0.0.1:0",
              "--log-level", "warn"], os.path.join(tmp, "workerd.log"))
    procs.append(w)
    wmport = w.line("METRICS_PORT ")
    return {"pscoord": cmport, "psd": psmport, "workerd": wmport}


def write_config(tmp, ports):
    path = os.path.join(tmp, "prometheus.yml")
    with open(path, "w") as f:
        f.write("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
                "scrape_configs:\n")
        for job, port in sorted(ports.items()):
            f.write("  - job_name: %s\n    static_configs:\n"
                    "      - targets: ['127.0.0.1:%d']\n" % (job, port))
    return path


def wait_for(fn, deadline):
    """Calls fn every 0.5 s until it is truthy or the deadline; its last value."""
    v = fn()
    while not v and time.monotonic() < deadline:
        time.sleep(0.5)
        v = fn()
    return v


def main():
    prometheus, promtool = pstest.need_programs("prometheus", "promtool", apt="prometheus")
    pstest.need_file(os.path.join(FM, "train-images-idx3-ubyte.gz"), "dataset-fashion-mnist")
    r = pstest.Results("prometheus")
    p = subprocess.run([promtool, "check", "config",
                        os.path.join(pstest.SOURCE_ROOT, "deploy", "prometheus.yml")],
                       capture_output=True, text=True, timeout=60)
    r.check(p.returncode == 0, "promtool check config deploy/prometheus.yml: %s"
            % (p.stdout + p.stderr).strip().splitlines()[-1:])

    tmp = pstest.tmpdir("ps-prometheus-")
    procs = []
    deadline = time.monotonic() + BUDGET
    try:
        ports = start_cluster(tmp, procs)
        web = pstest.free_port()
        prom = Proc([prometheus, "--config.file", write_config(tmp, ports),
                     "--storage.tsdb.path", os.path.join(tmp, "tsdb"),
                     "--web.listen-address", "127.0.0.1:%d" % web,
                     "--log.level", "warn"], os.path.join(tmp, "prometheus.log"))
        # Stopped first: it scrapes the others.
        procs.insert(0, prom)

        up = wait_for(lambda: (lambda t: t if len(t) == 3 and all(
            h == "up" for h in t.values()) else None)(targets_up(web)), deadline)
        r.check(up is not None, "Prometheus shows pscoord, psd and workerd up: %s"
                % (up or targets_up(web)))
        for expr, what in (("psd_push_seconds_count", "psd's pushes"),
                           ("workerd_examples_per_second", "the worker's rate"),
                           ('sum(pscoord_tasks{state="alive"})', "tasks alive")):
            got = wait_for(lambda: [v for _, v in query(web, expr) if v > 0], deadline)
            r.check(bool(got), "query %s (%s) gives back %s > 0" % (expr, what, got))
        alive = {m.get("role"): v for m, v in
                 query(web, 'sum by (role) (pscoord_tasks{state="alive"})') if v > 0}
        r.check(alive == {"ps": 1.0, "worker": 1.0},
                "pscoord_tasks: one ps and one worker alive, as Prometheus has it (%s)"
                % alive)
    except (OSError, RuntimeError, subprocess.SubprocessError) as e:
        r.check(False, "the cluster and Prometheus run: %s" % e)
    finally:
        # Prometheus first (it scrapes the rest), then the worker before the
        # shard it pushes to, the coordinator last.
        for proc in procs[:1] + procs[:0:-1]:
            proc.stop()
    if r.failed:
        for proc in procs:
            print("--- %s\n%s" % (proc.log_path, proc.tail()))
    r.check(all(proc.p.returncode is not None for proc in procs),
            "Prometheus and the cluster are stopped")
    r.finish()


if __name__ == "__main__":
    main()
