"""pscoord's and workerd's Prometheus /metrics against real daemons on
127.0.0.1 (port 0, temporary directories): a job of pscoord, one psd and
one worker that trains, then an evaluator. Every page passes Debian's
`promtool check metrics` with no lint problem, while the worker trains too;
the figures follow the job (tasks by role and state, global step, a job
checkpoint, live workers, step-time histograms, examples/s, loss, the
evaluator's accuracy, and a psd killed: dead, a missed heartbeat).
Bad input: a metrics port already taken stops pscoord and workerd at start
with one line naming the address (exit 1); a value that is not HOST:PORT
likewise (exit 2); a malformed request to pscoord's /metrics gets the
library's 400 and pscoord serves on; "off" serves no endpoint.

The helpers (scrape, parse, promtool) are test_metrics.py's, psd's test.
Exit 77 (skipped) with one line without promtool or Fashion-MNIST.
"""
import os
import re
import signal
import socket
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "interop"))
sys.path.insert(0, HERE)
import pstest  # noqa: E402
from test_metrics import check_page, cumulative, get, parse, raw, scrape  # noqa: E402

PSCOORD = os.path.join(pstest.BUILD_ROOT, "coordinator", "pscoord")
WORKERD = os.path.join(pstest.BUILD_ROOT, "worker", "workerd")
FM = "/usr/share/datasets/fashion-mnist"
# Small and quick: steps of a few milliseconds, so the worker shows a rate
# within seconds and crosses the checkpoint boundaries (every 60 steps) soon.
MODEL = "mlp:784-64-10"


def metrics_port(proc, who):
    """The METRICS_PORT line: right after PORT (pscoord), or first (workerd)."""
    line = proc.stdout.readline()
    if not line.startswith("METRICS_PORT "):
        raise RuntimeError("%s printed %r, not METRICS_PORT" % (who, line))
    return int(line.split()[1])


def poll(port, done, timeout=60.0):
    """Scrapes every 0.2 s until done(page) or the timeout; returns the last
    page parsed."""
    deadline = time.monotonic() + timeout
    page = parse(scrape(port)[2])
    while not done(page) and time.monotonic() < deadline:
        time.sleep(0.2)
        page = parse(scrape(port)[2])
    return page


def run_to_exit(argv, timeout=60):
    """Runs a daemon that is to fail at start; (status, stderr lines, stdout)."""
    p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       timeout=timeout)
    return p.returncode, [l for l in p.stderr.splitlines() if l.strip()], p.stdout


def start_workerd(*args):
    p = subprocess.Popen([WORKERD, "--model", MODEL, "--log-level", "warn"] + list(args),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def kill():
        if p.poll() is None:
            p.kill()
            p.wait()
    import atexit
    atexit.register(kill)
    return p


def tasks(page, role, state):
    return get(page, "pscoord_tasks", role=role, state=state)


def check_coordinator_fresh(r, promtool, mport):
    page = check_page(r, promtool, mport, "fresh pscoord")
    total = sum(v for (n, _), v in page.items() if n == "pscoord_tasks")
    r.check(total == 0 and tasks(page, "worker", "alive") == 0 and
            tasks(page, "ps", "never_seen") == 0,
            "a fresh dynamic pscoord: pscoord_tasks all 0, every role and state shown")
    r.check(get(page, "pscoord_job_checkpoint_last_step") == 0 and
            get(page, "pscoord_global_step") == 0 and
            str(get(page, "pscoord_eval_accuracy")) == "nan",
            "no checkpoint, step 0, eval accuracy NaN")


def check_worker(r, promtool, wport, cport):
    """The worker's page while it trains, and pscoord's beside it."""
    page = poll(wport, lambda p: (get(p, "workerd_examples_per_second") or 0) > 0 and
                (get(p, "workerd_step_pull_seconds_count") or 0) > 0)
    page = check_page(r, promtool, wport, "workerd while it trains")
    steps = get(page, "workerd_steps_total") or 0
    # One step may land between the two reads of the scrape.
    examples = get(page, "workerd_examples_total") or 0
    r.check(steps > 0 and abs(examples - steps * 64) <= 64,
            "workerd_steps_total %s, workerd_examples_total %s (64 a step)"
            % (steps, examples))
    r.check((get(page, "workerd_examples_per_second") or 0) > 0,
            "workerd_examples_per_second %s" % get(page, "workerd_examples_per_second"))
    loss = get(page, "workerd_loss")
    r.check(loss is not None and 0 < loss < 10, "workerd_loss %s" % loss)
    for h in ("compute", "wait", "push", "pull"):
        name = "workerd_step_%s_seconds" % h
        r.check(cumulative(page, name) and get(page, name + "_count") > 0,
                "%s: %s observations, buckets cumulative" % (name, get(page, name + "_count")))
    r.check(get(page, "workerd_step_compute_seconds_sum") > 0,
            "workerd_step_compute_seconds_sum %s" % get(page, "workerd_step_compute_seconds_sum"))

    cpage = poll(cport, lambda p: (get(p, "pscoord_job_checkpoint_last_step") or 0) > 0 and
                 (get(p, "pscoord_global_step") or 0) > 0, timeout=30)
    cpage = check_page(r, promtool, cport, "pscoord with a training job")
    r.check(tasks(cpage, "worker", "alive") == 1 and tasks(cpage, "ps", "alive") == 1 and
            get(cpage, "pscoord_live_workers") == 1 and get(cpage, "pscoord_ps_shards") == 1,
            "pscoord_tasks: one worker and one ps alive; pscoord_live_workers 1")
    r.check(get(cpage, "pscoord_global_step") > 0 and get(cpage, "pscoord_cluster_generation") > 0,
            "pscoord_global_step %s, pscoord_cluster_generation %s"
            % (get(cpage, "pscoord_global_step"), get(cpage, "pscoord_cluster_generation")))
    step = get(cpage, "pscoord_job_checkpoint_last_step")
    age = get(cpage, "pscoord_job_checkpoint_age_seconds")
    r.check(step > 0 and
            get(cpage, "pscoord_job_checkpoints_total", result="ok") >= 1 and
            age is not None and 0 <= age < 30 and
            get(cpage, "pscoord_job_checkpoint_last_timestamp_seconds") > time.time() - 60,
            "a job checkpoint at step %s, %s s ago" % (step, age))


def check_evaluator(r, promtool, coord_addr, cport):
    e = start_workerd("--coordinator", coord_addr, "--role", "evaluator",
                      "--eval-interval", "200ms", "--metrics-listen", "127.0.0.1:0")
    eport = metrics_port(e, "the evaluator")
    page = poll(eport, lambda p: (get(p, "workerd_evaluations_total") or 0) >= 1)
    page = check_page(r, promtool, eport, "workerd evaluator")
    acc = get(page, "workerd_eval_accuracy")
    r.check(get(page, "workerd_evaluations_total") >= 1 and acc is not None and 0.1 < acc <= 1,
            "evaluator: workerd_evaluations_total %s, workerd_eval_accuracy %s"
            % (get(page, "workerd_evaluations_total"), acc))
    r.check(get(page, "workerd_steps_total") is None,
            "the evaluator's page has no training families")
    cpage = poll(cport, lambda p: str(get(p, "pscoord_eval_accuracy")) != "nan", timeout=10)
    ca = get(cpage, "pscoord_eval_accuracy")
    r.check(ca is not None and 0.1 < ca <= 1 and get(cpage, "pscoord_eval_step") > 0,
            "pscoord_eval_accuracy %s at step %s" % (ca, get(cpage, "pscoord_eval_step")))
    e.send_signal(signal.SIGTERM)
    r.check(e.wait(timeout=30) == 0, "the evaluator stops cleanly with the endpoint up")


def check_bad_input(r, state):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        addr = "127.0.0.1:%d" % taken.getsockname()[1]
        rc, lines, _ = run_to_exit([PSCOORD, "--state-dir", state, "--listen", "127.0.0.1:0",
                                    "--log-level", "warn", "--metrics-listen", addr])
        r.check(rc == 1 and len(lines) == 1 and addr in lines[0] and
                lines[0].startswith("pscoord: "),
                "pscoord, metrics port taken: exit %s, %s" % (rc, lines))
        rc, lines, _ = run_to_exit([WORKERD, "--metrics-listen", addr, "--local"])
        r.check(rc == 1 and len(lines) == 1 and addr in lines[0] and
                lines[0].startswith("workerd: "),
                "workerd, metrics port taken: exit %s, %s" % (rc, lines))
    rc, lines, _ = run_to_exit([PSCOORD, "--state-dir", state, "--listen", "127.0.0.1:0",
                                "--log-level", "warn", "--metrics-listen", "localhost"])
    r.check(rc == 2 and len(lines) == 1 and "localhost" in lines[0],
            "pscoord --metrics-listen localhost: exit %s, %s" % (rc, lines))
    rc, lines, _ = run_to_exit([WORKERD, "--metrics-listen", "localhost", "--local"])
    r.check(rc == 2 and len(lines) == 1 and "localhost" in lines[0],
            "workerd --metrics-listen localhost: exit %s, %s" % (rc, lines))
    rc, lines, out = run_to_exit([WORKERD, "--local", "--model", MODEL, "--limit", "640",
                                  "--json", "--metrics-listen", "off"], timeout=120)
    r.check(rc == 0 and "METRICS_PORT" not in out,
            "workerd --metrics-listen off: no METRICS_PORT (exit %s)" % rc)


def main():
    promtool = pstest.need_programs("promtool", apt="prometheus")
    pstest.need_file(os.path.join(FM, "train-images-idx3-ubyte.gz"), "dataset-fashion-mnist")
    r = pstest.Results("metrics-daemons")
    state = pstest.tmpdir("pscoord-state-")

    coord = pstest.Daemon([PSCOORD, "--state-dir", state, "--listen", "127.0.0.1:0",
                           "--log-level", "warn", "--heartbeat-interval", "100ms",
                           "--heartbeat-timeout", "1s", "--checkpoint-every-steps", "60",
                           "--metrics-listen", "127.0.0.1:0"])
    cport = metrics_port(coord.proc, "pscoord")
    r.check(cport > 0 and cport != coord.port,
            "pscoord prints METRICS_PORT %d after PORT" % cport)
    check_coordinator_fresh(r, promtool, cport)

    ps = pstest.start_psd(pstest.tmpdir(), "--coordinator", coord.address,
                          "--checkpoint-root", pstest.tmpdir("psd-ckpt-"),
                          "--metrics-listen", "off")
    w = start_workerd("--coordinator", coord.address, "--epochs", "0", "--steps", "100000000",
                      "--concurrent-pull", "--no-evaluate", "--progress", "0",
                      "--json", "--metrics-listen", "127.0.0.1:0")
    wport = metrics_port(w, "workerd")
    r.check(wport > 0, "workerd prints METRICS_PORT %d first" % wport)
    check_worker(r, promtool, wport, cport)
    check_evaluator(r, promtool, coord.address, cport)
    w.send_signal(signal.SIGTERM)
    r.check(w.wait(timeout=30) == 0, "the worker stops cleanly with the endpoint up")

    ps.kill()
    page = poll(cport, lambda p: tasks(p, "ps", "dead") == 1 and
                tasks(p, "worker", "dead") == 1, timeout=15)
    r.check(tasks(page, "ps", "dead") == 1 and tasks(page, "ps", "alive") == 0 and
            get(page, "pscoord_missed_heartbeats_total", role="ps") == 1 and
            get(page, "pscoord_missed_heartbeats_total", role="worker") == 1 and
            get(page, "pscoord_live_workers") == 0,
            "psd killed, worker gone: dead in pscoord_tasks, "
            "pscoord_missed_heartbeats_total{role=\"ps\"} %s"
            % get(page, "pscoord_missed_heartbeats_total", role="ps"))

    # HTTP/1.1 without a Host header: malformed, the library's 400.
    first = raw(cport, b"GET /metrics HTTP/1.1\r\n\r\n")
    r.check(re.match(r"HTTP/1\.[01] 400", first) is not None and scrape(cport)[0] == 200,
            "a malformed request to pscoord's /metrics: %s; it scrapes on" % first)
    r.check(coord.stop() == 0, "pscoord stops cleanly with the endpoint up")
    check_bad_input(r, pstest.tmpdir("pscoord-bad-"))
    r.finish()


if __name__ == "__main__":
    main()
