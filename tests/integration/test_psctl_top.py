"""psctl top against a real local cluster: pscoord on 127.0.0.1:0, one psd,
two workerd workers and an evaluator training the MLP on Fashion-MNIST (the
job is stopped once the checks are done):

  once     `psctl top --once` while the job trains: exit 0, plain text (no
           escape codes), a header (job, generation, workers 2/2 live, global
           step), the job checkpoint (step, age, a manifest that exists),
           and one row per task with its role: the workers alive with
           step > 0, examples/s > 0, a loss and a lag, the psd alive, the
           evaluator's accuracy in (0, 1] once it reported; no step rate in
           a single frame; GetCluster's heartbeat_interval_ms and
           last_checkpoint_age_seconds;
  live     `psctl top` with stdout a pipe for ~2.7 s, then SIGINT: exit 0,
           frames separated by blank lines, at least two of them with a
           worker's steps/s > 0;
  tty      on a pseudo-terminal: frames drawn in place (cursor home, clear
           to the end), q quits with exit 0, the terminal's echo restored;
  lost     the coordinator killed under a live view: a status line naming
           its address, the view keeps running, SIGINT still exits 0;
  errors   an address where nothing answers: one line naming it and exit 1
           (--once and live); --interval 0: a usage error, exit 2.

Prints ok/FAIL per check and "psctl-top: N passed, N failed".
"""
import os
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "interop"))
sys.path.insert(0, os.path.join(HERE, "..", "..", "deploy"))
import pstest  # noqa: E402
from localcluster import LocalCluster  # noqa: E402

PSCTL = os.path.join(pstest.BUILD_ROOT, "tools", "psctl")
FM = "/usr/share/datasets/fashion-mnist"
COLUMNS = ["role", "idx", "state", "step", "rate", "lag", "eps", "loss",
           "acc", "heartbeat"]


def psctl(*args, timeout=30):
    return subprocess.run([PSCTL] + list(args), capture_output=True,
                          text=True, timeout=timeout)


def parse(frame):
    """A frame's header, checkpoint line and rows (dicts keyed by COLUMNS,
    by (role, index))."""
    lines = frame.strip("\n").splitlines()
    header = next((l for l in lines if l.startswith("job ")), "")
    ckpt = next((l for l in lines if l.startswith("checkpoint ")), "")
    rows, table = {}, False
    for l in lines:
        if l.startswith("ROLE "):
            table = True
            continue
        f = l.split()
        if table and len(f) == len(COLUMNS):
            row = dict(zip(COLUMNS, f))
            rows[(row["role"], int(row["idx"]))] = row
    return header, ckpt, rows


def alive(row):
    """Alive: "alive", or "missed:N" when a loaded machine delays a
    heartbeat (still alive to the coordinator)."""
    return row.get("state") == "alive" or row.get("state", "").startswith(
        "missed:")


def num(s):
    try:
        return float(s)
    except ValueError:
        return None


def trained(rows):
    """Both workers have stepped and measured their examples/s (every 2 s
    with --progress 0), and the evaluator has reported."""
    ws = [rows.get(("worker", i)) for i in (0, 1)]
    ev = rows.get(("evaluator", 0))
    return all(w is not None and (num(w["step"]) or 0) > 0 and
               (num(w["eps"]) or 0) > 0 for w in ws) and \
        ev is not None and num(ev["acc"]) is not None


def check_once(r, c):
    deadline = time.monotonic() + 90
    p, rows = None, {}
    while time.monotonic() < deadline:
        p = psctl("top", "--once", "--coordinator", c.coord_addr)
        header, ckpt, rows = parse(p.stdout)
        if p.returncode == 0 and trained(rows) and ckpt != "checkpoint none":
            break
        time.sleep(0.3)
    print(p.stdout, end="")
    header, ckpt, rows = parse(p.stdout)
    r.check(p.returncode == 0 and "\033" not in p.stdout,
            "top --once: exit 0, plain text (exit %d, %s)"
            % (p.returncode, p.stderr.strip()))
    r.check(header.startswith("job top ") and "workers 2/2 live" in header
            and "generation " in header and "global step " in header,
            "top --once: header with job, generation, live workers, global step "
            "(%s)" % header)
    f = ckpt.split(", ")
    r.check(len(f) == 3 and f[0].startswith("checkpoint step ") and
            f[1].endswith(" ago") and os.path.exists(f[2]),
            "top --once: the job checkpoint's step, age and manifest (%s)" % ckpt)
    r.check(set(rows) == {("ps", 0), ("worker", 0), ("worker", 1),
                          ("evaluator", 0)},
            "top --once: one row per task (%s)" % sorted(rows))
    for i in (0, 1):
        w = rows.get(("worker", i), {})
        r.check(alive(w) and (num(w.get("step", "")) or 0) > 0
                and (num(w.get("eps", "")) or 0) > 0 and
                num(w.get("loss", "")) is not None and
                num(w.get("lag", "")) is not None and w.get("rate") == "-",
                "top --once: worker %d alive with step, examples/s, loss, lag "
                "and no rate in one frame (%s)" % (i, w))
    cs = c.cluster_state()
    r.check(cs.heartbeat_interval_ms == 500 and
            0 <= cs.last_checkpoint_age_seconds < 60,
            "GetCluster: heartbeat_interval_ms %d, last_checkpoint_age_seconds "
            "%.0f" % (cs.heartbeat_interval_ms, cs.last_checkpoint_age_seconds))
    ps = rows.get(("ps", 0), {})
    r.check(alive(ps) and ps.get("step") == "-",
            "top --once: the psd alive, no step (%s)" % ps)
    ev = rows.get(("evaluator", 0), {})
    acc = num(ev.get("acc", ""))
    r.check(alive(ev) and acc is not None and 0 < acc <= 1,
            "top --once: the evaluator's accuracy (%s)" % ev)


def live(c, seconds, during=None):
    p = subprocess.Popen([PSCTL, "top", "--coordinator", c.coord_addr],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    try:
        if during is not None:
            during(p)
        time.sleep(seconds)
        running = p.poll() is None
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=15)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    return running, p.returncode, out, err


def check_live(r, c):
    running, rc, out, err = live(c, 2.7)
    frames = [f for f in out.split("\n\n") if f.strip()]
    rated = 0
    for f in frames:
        _, _, rows = parse(f)
        if any((num(rows.get(("worker", i), {}).get("rate", "-")) or 0) > 0
               for i in (0, 1)):
            rated += 1
    print(out[-1500:], end="")
    r.check(running and rc == 0 and "\033" not in out,
            "top (stdout a pipe): runs until SIGINT, then exit 0 (exit %s, %s)"
            % (rc, err.strip()))
    r.check(len(frames) >= 2 and rated >= 2,
            "top (stdout a pipe): %d frames, %d with a worker's steps/s > 0"
            % (len(frames), rated))


def check_tty(r, c):
    """On a terminal (a pty): frames drawn in place, q quits with exit 0 and
    the terminal's echo is restored."""
    import pty
    import select
    import termios
    master, slave = pty.openpty()
    p = subprocess.Popen([PSCTL, "top", "--coordinator", c.coord_addr],
                         stdin=slave, stdout=slave, stderr=subprocess.PIPE)
    out = b""
    try:
        deadline = time.monotonic() + 1.8
        while time.monotonic() < deadline:
            if select.select([master], [], [], 0.1)[0]:
                out += os.read(master, 65536)
        os.write(master, b"q")
        rc = p.wait(timeout=5)
        while select.select([master], [], [], 0.2)[0]:
            try:
                out += os.read(master, 65536)
            except OSError:
                break
        echo = True
        try:
            echo = bool(termios.tcgetattr(slave)[3] & termios.ECHO)
        except termios.error:
            pass
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        os.close(master)
        os.close(slave)
    text = out.decode(errors="replace")
    r.check(rc == 0 and "\033[H" in text and "\033[J" in text and
            text.count("ROLE ") >= 2 and "q or Ctrl-C quits" in text and echo,
            "top on a terminal: frames drawn in place, q quits with exit 0, "
            "echo restored (exit %s, %d frames)" % (rc, text.count("ROLE ")))


def check_lost(r, c):
    def kill_coord(p):
        time.sleep(1.2)
        c.kill("coordinator", 0)
    running, rc, out, err = live(c, 2.0, kill_coord)
    status = [l for l in out.splitlines() if l.startswith("pscoord at ")]
    r.check(running and rc == 0 and len(status) == 1 and c.coord_addr in
            status[0] and "retrying" in status[0],
            "top: a lost coordinator is a status line; the view goes on and "
            "exits 0 on SIGINT (exit %s, %s)" % (rc, status or err.strip()))


def check_errors(r):
    port = pstest.free_port()
    addr = "127.0.0.1:%d" % port
    for args in (["--once"], []):
        p = psctl("top", "--coordinator", addr, "--rpc-timeout", "2s", *args)
        lines = p.stderr.strip().splitlines()
        r.check(p.returncode == 1 and len(lines) == 1 and
                lines[0].startswith("psctl: cannot reach pscoord at " + addr)
                and p.stdout == "",
                "top %s: nothing at the address: one line, exit 1 (%s)"
                % (" ".join(args), lines[:2]))
    p = psctl("top", "--interval", "0", "--coordinator", addr)
    lines = p.stderr.strip().splitlines()
    r.check(p.returncode == 2 and len(lines) == 1 and "interval" in lines[0],
            "top --interval 0: a usage error (%s)" % lines[:2])


def main():
    r = pstest.Results("psctl-top")
    if not os.path.exists(os.path.join(FM, "train-images-idx3-ubyte.gz")):
        print("skip: %s is missing (apt-get install dataset-fashion-mnist)" % FM)
        sys.exit(77)
    check_errors(r)
    # Many epochs: the job trains for as long as the checks take, and is
    # stopped when they are done.
    c = LocalCluster(pstest.BUILD_ROOT, pstest.tmpdir("psctl-top-"), num_ps=1,
                     num_workers=2, evaluator=True, epochs=200,
                     checkpoint_every="2s", job_id="top")
    c.coord_port = 0
    try:
        c.start()
        for t in (check_once, check_live, check_tty, check_lost):
            try:
                t(r, c)
            except Exception as e:  # one broken case must not hide the others
                import traceback
                traceback.print_exc()
                r.check(False, "%s raised %s: %s" % (t.__name__,
                                                     type(e).__name__, e))
    finally:
        c.stop()
    r.finish()


if __name__ == "__main__":
    main()
