"""multi_worker_mirrored without failures, and its bad input.

Two workers train softmax on Fashion-MNIST with Gloo's ring all-reduce, and
two with halving-doubling; the parameters' checksum, printed by every worker
after every step, must be the same on both at each step (every worker
applies the same averaged gradient), and the job must reach the expected
accuracy. pscoord's KvSet/KvGet are driven directly with Python's grpcio:
a KvGet waits for a key set later, times out naming the missing key, and
bad keys and another job are refused. workerd refuses a member with
another model (naming the first difference), a rendezvous that does not
complete (naming the missing worker), and --strategy flags that contradict.
"""
import os
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "fault"))
import mwmjob  # noqa: E402
import pstest  # noqa: E402

BOUND = 240


def train_pair(r, name, extra):
    job = mwmjob.Job(name)
    try:
        args = ["--workers", "2", "--model", "softmax", "--checksum-every", "1"] + extra
        for i in range(2):
            job.start(i, args)
        codes = job.wait(BOUND)
        r.check(codes == {0: 0, 1: 0}, "%s: both workers exit 0 (%s)" % (name, codes))
        logs = [mwmjob.parse(job.log(i)) for i in range(2)]
        if codes != {0: 0, 1: 0}:
            job.dump()
            return None
        a, b = logs[0]["checksums"], logs[1]["checksums"]
        steps = logs[0]["final"]["job_step"]
        r.check(len(a) == steps and set(a) == set(b) and all(a[s] == b[s] for s in a),
                "%s: identical parameters after each of the %d steps" % (name, steps))
        r.check(logs[0]["final"]["checksum"] == logs[1]["final"]["checksum"],
                "%s: identical final parameters" % name)
        return logs[0]["final"]
    finally:
        job.close()


def kv_checks(r):
    pb, pbg, _, _ = pstest.generate_stubs()
    import grpc
    job = mwmjob.Job("kv")
    try:
        ch = pstest.channel(job.coord_addr())
        c = pbg.CoordinatorStub(ch)
        # A wait answered by a later set.
        got = {}

        def getter():
            got["resp"] = c.KvGet(pb.KvGetRequest(job_id="job", keys=["a", "b"],
                                                  timeout_ms=10000), timeout=20)
        t = threading.Thread(target=getter)
        t.start()
        time.sleep(0.3)
        c.KvSet(pb.KvSetRequest(job_id="job", key="a", value=b"1"), timeout=5)
        c.KvSet(pb.KvSetRequest(job_id="job", key="b", value=b"22"), timeout=5)
        t.join(20)
        resp = got.get("resp")
        r.check(resp is not None and list(resp.values) == [b"1", b"22"],
                "KvGet waits for keys set later (%s)" % (list(resp.values) if resp else None))
        t0 = time.monotonic()
        r.refused("KvGet of a key never set", lambda: c.KvGet(
            pb.KvGetRequest(job_id="job", keys=["a", "never"], timeout_ms=300), timeout=5),
            grpc.StatusCode.DEADLINE_EXCEEDED, "never")
        r.check(time.monotonic() - t0 < 3, "its wait ends at its timeout")
        r.refused("KvGet with timeout 0 of a missing key", lambda: c.KvGet(
            pb.KvGetRequest(job_id="job", keys=["missing"]), timeout=5),
            grpc.StatusCode.NOT_FOUND, "missing")
        r.refused("KvSet of an empty key", lambda: c.KvSet(
            pb.KvSetRequest(job_id="job", key="", value=b"x"), timeout=5),
            grpc.StatusCode.INVALID_ARGUMENT, "key")
        r.refused("KvSet of a 2 MiB value", lambda: c.KvSet(
            pb.KvSetRequest(job_id="job", key="big", value=b"x" * (2 << 20)), timeout=5),
            grpc.StatusCode.INVALID_ARGUMENT, "value")
        r.refused("KvGet of another job", lambda: c.KvGet(
            pb.KvGetRequest(job_id="other", keys=["a"]), timeout=5),
            grpc.StatusCode.FAILED_PRECONDITION, "other")
        cs = c.GetCluster(pb.GetClusterRequest(job_id="job"), timeout=5)
        r.check(cs.group_generation == 0, "no worker alive: generation 0 (%d)" % cs.group_generation)
        ch.close()
    except Exception as e:  # a refusal with another code
        r.check(False, "Kv checks: %s" % e)
    finally:
        job.close()


def refusals(r):
    # Members with different models: refused at rendezvous.
    job = mwmjob.Job("models")
    try:
        job.start(0, ["--workers", "2", "--model", "softmax"])
        job.start(1, ["--workers", "2", "--model", "mlp:784-32-10"])
        codes = job.wait(60)
        outs = [job.log(i) for i in range(2)]
        r.check(codes == {0: 1, 1: 1} and all("trains another model" in o for o in outs)
                and "softmax" in outs[1] and "mlp:784-32-10" in outs[0],
                "workers with different models exit 1 naming the difference (%s)"
                % outs[0].strip().splitlines()[-1:])
    finally:
        job.close()
    # A rendezvous that cannot complete: the missing worker named.
    job = mwmjob.Job("alone")
    try:
        t0 = time.monotonic()
        job.start(0, ["--workers", "2", "--rendezvous-timeout", "2s"])
        codes = job.wait(60)
        out = job.log(0).strip().splitlines()
        r.check(codes == {0: 1} and "workers missing: 1" in out[-1] and
                time.monotonic() - t0 < 30,
                "a rendezvous without worker 1 ends with one line naming it (%s)" % out[-1:])
    finally:
        job.close()
    # This worker's own --allreduce-host unusable: the process fails at once.
    for host, words in [("10.255.255.1", "cannot listen"),
                        ("nosuchhost.invalid", "nosuchhost.invalid")]:
        job = mwmjob.Job("host")
        try:
            job.start(0, ["--workers", "1", "--allreduce-host", host])
            codes = job.wait(60)
            out = job.log(0).strip().splitlines()
            r.check(codes == {0: 1} and len(out) == 1 and words in out[0],
                    "--allreduce-host %s: exit 1, one line (%s)" % (host, out))
        finally:
            job.close()
    workerd = mwmjob.build_path("worker", "workerd")
    for args, words in [
            (["--strategy", "multi_worker_mirrored"], "needs --coordinator"),
            (["--strategy", "one_device", "--replicas", "2"], "more than one device"),
            (["--strategy", "mirrored", "--local"], "not with --local"),
            (["--strategy", "multi_worker_mirrored", "--coordinator", "127.0.0.1:1",
              "--optimizer", "adam"], "--optimizer adam"),
            (["--strategy", "tpu"], "tpu")]:
        p = subprocess.run([workerd, "--metrics-listen", "off"] + args,
                           capture_output=True, text=True, timeout=30)
        lines = p.stderr.strip().splitlines()
        r.check(p.returncode == 2 and len(lines) == 1 and words in lines[0],
                "%s: exit 2, one line (%s)" % (" ".join(args), lines))
    p = subprocess.run([workerd, "--strategy", "one_device", "--steps", "20", "--limit",
                        "2000", "--model", "softmax", "--metrics-listen", "off", "--json"],
                       capture_output=True, text=True, timeout=60)
    r.check(p.returncode == 0 and '"steps":20' in p.stdout,
            "--strategy one_device trains alone (%s)" % p.stderr.strip()[-200:])


def main():
    r = pstest.Results("mwm")
    ring = train_pair(r, "ring", ["--epochs", "1", "--allreduce-algorithm", "ring"])
    if ring:
        r.check(ring["test_accuracy"] > 0.78, "ring: test accuracy %.4f > 0.78"
                % ring["test_accuracy"])
    train_pair(r, "halving-doubling", ["--steps", "100", "--allreduce-algorithm",
                                       "halving_doubling"])
    kv_checks(r)
    refusals(r)
    r.finish()


if __name__ == "__main__":
    main()
