"""workerd's TensorBoard event files (--logdir), from short real trainings
against a real psd on 127.0.0.1:

- a small reader of its own parses the TFRecord framing, checks both CRCs of
  every record with Debian's python3-crc32c and decodes the Events with
  python3-protobuf (classes generated from proto/tensorboard.proto, whose
  field numbers are checked against TensorFlow's); the chief's and the
  evaluator's figures are compared with what workerd's --json summary says;
- TensorBoard's own loader (EventAccumulator, PyPI's tensorboard in a
  virtualenv under the build directory, made once and reused) reads the same
  runs back; skipped with one line when PyPI cannot be reached;
- a logdir that cannot be written (not a directory, no permission, writes
  failing as on a full disk): one warning line, training goes on, exit 0.

Run with Debian's /usr/bin/python3."""
import json
import math
import os
import re
import resource
import signal
import socket
import struct
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "interop"))
import pstest  # noqa: E402

WORKERD = os.path.join(pstest.BUILD_ROOT, "worker", "workerd")
FM = "/usr/share/datasets/fashion-mnist"
VENV = os.path.join(pstest.BUILD_ROOT, "venv-tb")


def workerd(*args, timeout=180, preexec_fn=None):
    return subprocess.run([WORKERD, *args], capture_output=True, text=True,
                          timeout=timeout, preexec_fn=preexec_fn)


def masked_crc(data):
    import crc32c
    c = crc32c.crc32c(data)
    return ((((c >> 15) | (c << 17)) & 0xffffffff) + 0xa282ead8) & 0xffffffff


def read_records(path):
    """The records of a TFRecord file, each length and data CRC checked.
    Raises ValueError naming the offset of the first bad one."""
    with open(path, "rb") as f:
        data = f.read()
    off, out = 0, []
    while off < len(data):
        if len(data) - off < 16:
            raise ValueError("%s: truncated record at %d" % (path, off))
        (n,) = struct.unpack_from("<Q", data, off)
        (lcrc,) = struct.unpack_from("<I", data, off + 8)
        if lcrc != masked_crc(data[off:off + 8]):
            raise ValueError("%s: length CRC wrong at %d" % (path, off))
        if len(data) - off - 16 < n:
            raise ValueError("%s: record at %d runs past the end" % (path, off))
        body = data[off + 12:off + 12 + n]
        (dcrc,) = struct.unpack_from("<I", data, off + 12 + n)
        if dcrc != masked_crc(body):
            raise ValueError("%s: data CRC wrong at %d" % (path, off))
        out.append(body)
        off += 16 + n
    return out


def event_classes():
    """tensorflow.Event from proto/tensorboard.proto, its field numbers
    checked against TensorFlow's event.proto and summary.proto."""
    from grpc_tools import protoc
    out = pstest.tmpdir("tb-stubs-")
    proto_dir = os.path.join(pstest.SOURCE_ROOT, "proto")
    if protoc.main(["protoc", "-I" + proto_dir, "--python_out=" + out,
                    os.path.join(proto_dir, "tensorboard.proto")]) != 0:
        raise RuntimeError("grpc_tools.protoc failed on tensorboard.proto")
    sys.path.insert(0, out)
    import tensorboard_pb2 as tb
    ev, val = tb.Event.DESCRIPTOR, tb.Summary.Value.DESCRIPTOR
    numbers = {"Event.wall_time": ev.fields_by_name["wall_time"].number,
               "Event.step": ev.fields_by_name["step"].number,
               "Event.file_version": ev.fields_by_name["file_version"].number,
               "Event.summary": ev.fields_by_name["summary"].number,
               "Summary.value": tb.Summary.DESCRIPTOR.fields_by_name["value"].number,
               "Summary.Value.tag": val.fields_by_name["tag"].number,
               "Summary.Value.simple_value": val.fields_by_name["simple_value"].number}
    tf = {"Event.wall_time": 1, "Event.step": 2, "Event.file_version": 3,
          "Event.summary": 5, "Summary.value": 1, "Summary.Value.tag": 1,
          "Summary.Value.simple_value": 2}
    return tb, ev.full_name == "tensorflow.Event" and numbers == tf


def read_run(tb, rundir):
    """(file name, the file_version, [(step, wall_time, {tag: value})]) of
    the one event file in rundir."""
    files = sorted(os.listdir(rundir))
    if len(files) != 1:
        raise ValueError("%s holds %s, not one event file" % (rundir, files))
    events = []
    for body in read_records(os.path.join(rundir, files[0])):
        e = tb.Event()
        e.ParseFromString(body)
        events.append(e)
    if not events or events[0].WhichOneof("what") != "file_version":
        raise ValueError("%s: the first record is not a file_version" % files[0])
    rows = [(e.step, e.wall_time, {v.tag: v.simple_value for v in e.summary.value})
            for e in events[1:] if e.WhichOneof("what") == "summary"]
    return files[0], events[0].file_version, rows


def rising(rows):
    return all(a[0] < b[0] for a, b in zip(rows, rows[1:]))


def check_chief_per_step(r, tb, psd, tmp):
    """--summary-steps 1: one event per step, whose mean loss is the run's
    final_loss (with --json, the mean over every step)."""
    logdir = os.path.join(tmp, "tb1")
    p = workerd("--ps", psd.address, "--steps", "150", "--limit", "12800", "--json",
                "--seed", "3", "--logdir", logdir, "--summary-steps", "1")
    out = pstest.json_summary(p)
    r.check(p.returncode == 0 and out.get("steps") == 150,
            "the chief trains with --logdir (exit %d, %s steps)%s"
            % (p.returncode, out.get("steps"), "" if p.returncode == 0 else p.stderr[-300:]))
    r.check(sorted(os.listdir(logdir)) == ["worker0"],
            "the chief writes DIR/worker0 and nothing else: %s" % sorted(os.listdir(logdir)))
    name, version, rows = read_run(tb, os.path.join(logdir, "worker0"))
    host = socket.gethostname()
    r.check(re.fullmatch(r"events\.out\.tfevents\.\d{10}\.%s" % re.escape(host), name)
            is not None and version == "brain.Event:2",
            "TensorFlow's file name and version: %s, %s" % (name, version))
    tags = {t for _, _, v in rows for t in v}
    losses = [v["loss"] for _, _, v in rows]
    r.check(tags == {"loss", "examples_per_second", "learning_rate"} and
            all(set(v) == tags for _, _, v in rows),
            "every event has loss, examples_per_second and learning_rate: %s"
            % sorted(tags))
    r.check(len(rows) == out.get("steps") and rising(rows) and
            0 <= rows[-1][0] <= out.get("version", -1),
            "one event per step (%d for %s steps), steps rising to %s (the job's "
            "global step, %s at the end)" % (len(rows), out.get("steps"),
                                             rows[-1][0] if rows else None,
                                             out.get("version")))
    mean = sum(losses) / len(losses) if losses else float("nan")
    r.check(all(math.isfinite(x) and x > 0 for x in losses) and
            abs(mean - out.get("final_loss", -1)) < 1e-4 and losses[0] > losses[-1],
            "the losses are finite, fall (%.4f -> %.4f) and average to the summary's "
            "final_loss (%.5f vs %.5f)" % (losses[0], losses[-1], mean,
                                           out.get("final_loss", -1)))
    r.check(all(abs(v["learning_rate"] - 0.1) < 1e-7 and
                math.isfinite(v["examples_per_second"]) and v["examples_per_second"] > 0
                for _, _, v in rows),
            "learning_rate is --lr 0.1, examples_per_second positive (last %.0f)"
            % rows[-1][2]["examples_per_second"])
    return logdir


def check_chief_and_evaluator(r, tb, psd, tmp):
    """The default cadence (--summary-steps 10), an evaluator that writes
    DIR/eval, and a worker that is not the chief, which writes nothing."""
    logdir = os.path.join(tmp, "tb2")
    p = workerd("--ps", psd.address, "--steps", "95", "--limit", "12800", "--json",
                "--seed", "4", "--logdir", logdir)
    out = pstest.json_summary(p)
    _, _, rows = read_run(tb, os.path.join(logdir, "worker0"))
    r.check(p.returncode == 0 and len(rows) == 10 and rising(rows) and
            rows[-1][0] == out.get("version"),
            "every 10 steps and once at the end: %d events for %s steps, the last at "
            "the final global step %s" % (len(rows), out.get("steps"), out.get("version")))
    e = workerd("--ps", psd.address, "--role", "evaluator", "--eval-count", "1",
                "--json", "--logdir", logdir)
    ev = pstest.json_summary(e)
    _, _, erows = read_run(tb, os.path.join(logdir, "eval"))
    ok = e.returncode == 0 and len(erows) == 1
    step, _, vals = erows[0] if ok else (None, None, {})
    r.check(ok and set(vals) == {"loss", "accuracy"} and step == ev.get("version") and
            abs(vals["accuracy"] - ev.get("test_accuracy", -1)) < 1e-5 and
            abs(vals["loss"] - ev.get("test_loss", -1)) < 1e-5 and
            abs(vals["accuracy"] - out.get("test_accuracy", -1)) < 1e-4,
            "the evaluator writes DIR/eval: step %s, accuracy %s, loss %s (its --json: "
            "version %s, %s, %s; the worker's own evaluation %s)"
            % (step, vals.get("accuracy"), vals.get("loss"), ev.get("version"),
               ev.get("test_accuracy"), ev.get("test_loss"), out.get("test_accuracy")))
    w = workerd("--ps", psd.address, "--workers", "2", "--task-index", "1",
                "--steps", "20", "--limit", "12800", "--json", "--no-evaluate",
                "--logdir", logdir)
    r.check(w.returncode == 0 and sorted(os.listdir(logdir)) == ["eval", "worker0"] and
            len(os.listdir(os.path.join(logdir, "worker0"))) == 1,
            "worker 1 is not the chief and writes no event file: %s"
            % sorted(os.listdir(logdir)))
    return logdir


def tensorboard_python():
    """The venv's python with PyPI's tensorboard (made once under the build
    directory and reused), or (None, why)."""
    py = os.path.join(VENV, "bin", "python")
    ready = os.path.join(VENV, ".tensorboard-installed")
    if os.path.exists(ready):
        return py, None
    if not os.path.exists(py):
        v = subprocess.run([sys.executable, "-m", "venv", VENV], capture_output=True,
                           text=True, timeout=300)
        if v.returncode != 0:
            return None, "python3 -m venv %s failed: %s" % (
                VENV, (v.stderr or v.stdout).strip().splitlines()[-1:])
    try:
        pip = subprocess.run([py, "-m", "pip", "install", "--disable-pip-version-check",
                              "--quiet", "--timeout", "15", "--retries", "1",
                              "tensorboard"], capture_output=True, text=True, timeout=900)
    except subprocess.TimeoutExpired:
        return None, "pip install tensorboard did not finish in 15 minutes"
    if pip.returncode != 0:
        last = (pip.stderr or pip.stdout).strip().splitlines()
        return None, "PyPI cannot be reached (pip install tensorboard: %s)" % (
            last[-1] if last else "exit %d" % pip.returncode)
    open(ready, "w").close()
    return py, None


LOADER = r"""
import json, sys
from tensorboard.backend.event_processing import event_accumulator as ea
out = {}
for run in sys.argv[1:]:
    acc = ea.EventAccumulator(run, size_guidance={ea.SCALARS: 0})
    acc.Reload()
    out[run] = {t: [[s.step, s.value] for s in acc.Scalars(t)]
                for t in acc.Tags()["scalars"]}
print(json.dumps(out))
"""


def check_tensorboard_loader(r, tb, runs):
    """TensorBoard's EventAccumulator reads each run as the reader above."""
    py, why = tensorboard_python()
    if py is None:
        print("skip: TensorBoard's own loader: %s" % why, flush=True)
        return
    p = subprocess.run([py, "-c", LOADER, *runs], capture_output=True, text=True,
                       timeout=300)
    if p.returncode != 0:
        r.check(False, "EventAccumulator reads the runs: %s" % p.stderr.strip()[-500:])
        return
    got = json.loads(p.stdout.strip().splitlines()[-1])
    for run in runs:
        _, _, rows = read_run(tb, run)
        want = {}
        for step, _, vals in rows:
            for tag, x in vals.items():
                want.setdefault(tag, []).append([step, x])
        r.check(got.get(run) == want,
                "TensorBoard's EventAccumulator reads %s: tags %s, %d steps each, the "
                "same steps and values" % (os.path.relpath(run, os.path.dirname(
                    os.path.dirname(run))), sorted(got.get(run, {})),
                    len(next(iter(want.values()), []))))


def warnings(p):
    return [l for l in p.stderr.splitlines() if l.strip()]


def check_unwritable(r, psd, tmp):
    """A logdir that cannot be written: one warning naming the path and
    the reason, training goes on, exit 0."""
    plain = os.path.join(tmp, "plain-file")
    with open(plain, "w") as f:
        f.write("not a directory\n")
    cases = [("a regular file", plain, "Not a directory", None, [])]
    if os.geteuid() != 0:
        ro = os.path.join(tmp, "read-only")
        os.mkdir(ro, 0o555)
        cases.append(("a directory without write permission", ro, "Permission denied",
                      None, []))
    else:
        print("note: running as root, which writes anywhere; the permission case "
              "did not run", flush=True)

    def limit_writes():
        # As on a full disk: writes past 400 bytes fail (EFBIG, not a signal).
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (400, 400))
    # --shm off: a memfd shared with psd would count against the limit too.
    cases.append(("writes that fail mid-run (as on a full disk)",
                  os.path.join(tmp, "full"), "File too large", limit_writes,
                  ["--summary-steps", "1", "--shm", "off"]))
    for what, logdir, reason, pre, extra in cases:
        p = workerd("--ps", psd.address, "--steps", "40", "--limit", "6400", "--json",
                    "--no-evaluate", "--logdir", logdir, *extra, preexec_fn=pre)
        out = pstest.json_summary(p)
        lines = warnings(p)
        r.check(p.returncode == 0 and out.get("steps") == 40 and len(lines) == 1 and
                logdir in lines[0] and reason in lines[0] and "WARN" in lines[0],
                "--logdir on %s: trains on (exit %d, %s steps), one warning: %s"
                % (what, p.returncode, out.get("steps"),
                   lines[0] if len(lines) == 1 else lines))


def main():
    r = pstest.Results("tensorboard")
    if not os.path.exists(os.path.join(FM, "train-images-idx3-ubyte.gz")):
        print("skip: %s is missing (apt-get install dataset-fashion-mnist)" % FM)
        sys.exit(77)
    tb, numbers_ok = event_classes()
    r.check(numbers_ok, "proto/tensorboard.proto has TensorFlow's names and field "
            "numbers (Event 1, 2, 3, 5; Summary 1; Summary.Value 1, 2)")
    tmp = pstest.tmpdir("tb-test-")
    psd = pstest.start_psd(pstest.tmpdir())
    tb1 = check_chief_per_step(r, tb, psd, tmp)
    psd.stop()
    psd = pstest.start_psd(pstest.tmpdir())
    tb2 = check_chief_and_evaluator(r, tb, psd, tmp)
    check_unwritable(r, psd, tmp)
    psd.stop()
    check_tensorboard_loader(r, tb, [os.path.join(tb1, "worker0"),
                                     os.path.join(tb2, "worker0"),
                                     os.path.join(tb2, "eval")])
    r.finish()


if __name__ == "__main__":
    main()
