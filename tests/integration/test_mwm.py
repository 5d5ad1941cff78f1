"""multi_worker_mirrored without failures, and its bad input.

Two workers train softmax on Fashion-MNIST with Gloo's ring all-reduce, and
two with halving-doubling; the parameters' checksum, printed by every worker
after every step, must be the same on both at each step (every worker
applies the same averaged gradient), and the job must reach the expected
accuracy. pscoord's KvSet/KvGet are driven directly with Python's grpcio:
a KvGet waits for a key set later, times out naming the missing key, and
bad keys and another job are refused; each key has one writer (a worker
proving its task secret writes only its own rank's keys, the generation is
pscoord's), a generation's addresses are read only by its members, and the
store's caps answer RESOURCE_EXHAUSTED naming them. workerd refuses a member with
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


def vm_rss_mb(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return 0.0


def kv_checks(r):
    pb, pbg, _, _ = pstest.generate_stubs()
    import grpc
    job = mwmjob.Job("kv", heartbeat_timeout="120s")
    D, FP, RE = (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.FAILED_PRECONDITION,
                 grpc.StatusCode.RESOURCE_EXHAUSTED)
    try:
        ch = pstest.channel(job.coord_addr())
        c = pbg.CoordinatorStub(ch)

        def worker(i):
            return c.RegisterTask(pb.RegisterRequest(job_id="job", role=pb.WORKER, index=i),
                                  timeout=5)

        def kset(w, key, value, secret=None):
            return c.KvSet(pb.KvSetRequest(
                job_id="job", key=key, value=value, index=w.index,
                task_secret=w.task_secret if secret is None else secret), timeout=5)

        def kget(w, keys, timeout_ms=0):
            return c.KvGet(pb.KvGetRequest(job_id="job", keys=keys, timeout_ms=timeout_ms,
                                           index=w.index, task_secret=w.task_secret),
                           timeout=timeout_ms / 1000.0 + 10)

        w0, w1 = worker(0), worker(1)
        # A wait answered by a later set.
        got = {}

        def getter():
            got["resp"] = kget(w1, ["model/0", "model/1"], 10000)
        t = threading.Thread(target=getter)
        t.start()
        time.sleep(0.3)
        kset(w0, "model/0", b"1")
        kset(w1, "model/1", b"22")
        t.join(20)
        resp = got.get("resp")
        r.check(resp is not None and list(resp.values) == [b"1", b"22"],
                "KvGet waits for keys set later (%s)" % (list(resp.values) if resp else None))
        t0 = time.monotonic()
        r.refused("KvGet of a key never set", lambda: kget(w0, ["model/0", "model/7"], 300),
                  grpc.StatusCode.DEADLINE_EXCEEDED, "model/7")
        r.check(time.monotonic() - t0 < 3, "its wait ends at its timeout")
        r.refused("KvGet with timeout 0 of a missing key", lambda: kget(w0, ["done"]),
                  grpc.StatusCode.NOT_FOUND, "done")
        r.refused("KvSet of an empty key", lambda: kset(w0, "", b"x"),
                  grpc.StatusCode.INVALID_ARGUMENT, "key")
        r.refused("KvSet of a 2 MiB value", lambda: kset(w0, "model/0", b"x" * (2 << 20)),
                  RE, "cap of 1048576 bytes per value")
        r.refused("KvGet of another job", lambda: c.KvGet(
            pb.KvGetRequest(job_id="other", keys=["a"]), timeout=5), FP, "other")
        # Who may write what (the audit: any worker wrote any key).
        r.refused("KvSet without a task secret", lambda: kset(w0, "model/0", b"x", ""),
                  D, "no task_secret")
        r.refused("KvSet with another worker's secret",
                  lambda: kset(w0, "model/0", b"x", w1.task_secret), D, "not worker[0]'s")
        r.refused("KvGet without a task secret", lambda: c.KvGet(pb.KvGetRequest(
            job_id="job", keys=["model/0"], index=0), timeout=5), D, "no task_secret")
        r.refused("KvSet generation=999999", lambda: kset(w0, "generation", b"999999"),
                  D, "pscoord's")
        r.refused("KvSet of another worker's model key", lambda: kset(w1, "model/0", b"x"),
                  D, "not worker[1]'s")
        r.refused("KvSet of a key outside the rendezvous", lambda: kset(w0, "a", b"x"),
                  D, "not a key of the rendezvous")
        got = pstest.wait_until(
            lambda: c.GetCluster(pb.GetClusterRequest(job_id="job"), timeout=5).group_generation, 10)
        g = c.GetCluster(pb.GetClusterRequest(job_id="job"), timeout=5).group_generation
        gen = int(kget(w0, ["generation"]).values[0])
        r.check(got and gen == g and gen != 999999,
                "the generation is pscoord's: %d, as GetCluster says" % gen)
        members = kget(w0, ["gen/%d/members" % g]).values[0]
        r.check(members == b"0,1", "generation %d: members %s" % (g, members))
        r.refused("a rank address of another rank", lambda: kset(
            w1, "gen/%d/0" % g, b"attacker:6666"), D, "rank 0's")
        r.refused("Gloo's rank_<r> key of another rank", lambda: kset(
            w1, "gen/%d/rank_0" % g, b"evil"), D, "rank 0's")
        r.refused("the NCCL id by a rank other than 0", lambda: kset(
            w1, "gen/%d/nccl_id" % g, b"evil"), D, "rank 0's")
        r.refused("a generation's members", lambda: kset(
            w0, "gen/%d/members" % g, b"0"), D, "pscoord's")
        r.refused("gen/1/0=attacker:6666 (not a current generation)", lambda: kset(
            w0, "gen/1/0", b"attacker:6666"), FP, "generation 1")
        kset(w0, "gen/%d/0" % g, b"w0-addr")
        kset(w1, "gen/%d/1" % g, b"w1-addr")
        r.check(list(kget(w1, ["gen/%d/0" % g, "gen/%d/1" % g]).values) ==
                [b"w0-addr", b"w1-addr"], "each rank writes its own address, both read them")
        # A worker outside generation g does not learn its members' addresses.
        w2 = worker(2)
        pstest.wait_until(lambda: c.GetCluster(pb.GetClusterRequest(job_id="job"),
                                               timeout=5).group_generation > g, 10)
        r.refused("a rank address read by a worker outside its generation",
                  lambda: kget(w2, ["gen/%d/0" % g]), D, "members of generation")
        # Caps: 1 MiB values from as many workers as it takes pass 32 MiB.
        before = vm_rss_mb(job.coord.proc.pid)
        ws = [worker(i) for i in range(3, 43)]
        codes, last = [], ""
        for w in ws:
            try:
                kset(w, "model/%d" % w.index, b"x" * (1 << 20))
                codes.append("ok")
            except grpc.RpcError as e:
                codes.append(e.code())
                last = e.details()
        grown = vm_rss_mb(job.coord.proc.pid) - before
        r.check(codes.count("ok") >= 28 and codes[-1] == RE and
                "cap of 33554432 bytes" in last and grown < 120,
                "40 values of 1 MiB: %d taken, then RESOURCE_EXHAUSTED naming the cap (%s); "
                "pscoord grew %.0f MB" % (codes.count("ok"), last, grown))
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
            job.start(0, ["--workers", "1", "--allreduce-host", host,
                          "--insecure-collective"])
            codes = job.wait(60)
            # --insecure-collective's warning aside: one line.
            out = [x for x in job.log(0).strip().splitlines() if " WARN " not in x]
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


def own_address():
    """One of this machine's own IPv4 addresses outside 127/8, or None."""
    try:
        out = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True,
                             timeout=10).stdout
    except OSError:
        return None
    for line in out.splitlines():
        words = line.split()
        if "inet" in words:
            a = words[words.index("inet") + 1].split("/")[0]
            if not a.startswith("127."):
                return a
    return None


def insecure_collective(r):
    """Gloo and NCCL encrypt nothing: off loopback the all-reduce needs
    --insecure-collective, which is logged and shown by psctl status. The
    whole of 127/8 is loopback."""
    host = own_address()
    # 127.0.0.2 is loopback: no flag needed.
    job = mwmjob.Job("lo2")
    try:
        job.start(0, ["--workers", "1", "--steps", "3", "--allreduce-host", "127.0.0.2"])
        codes = job.wait(60)
        r.check(codes == {0: 0}, "--allreduce-host 127.0.0.2 trains without the flag (%s)"
                % job.log(0).strip().splitlines()[-1:])
    finally:
        job.close()
    if host is None:
        print("SKIP: no non-loopback IPv4 address on this machine")
        return
    job = mwmjob.Job("open")
    try:
        job.start(0, ["--workers", "1", "--steps", "3", "--allreduce-host", host])
        codes = job.wait(60)
        out = job.log(0).strip().splitlines()
        r.check(codes == {0: 2} and len(out) == 1 and "--insecure-collective" in out[0]
                and host in out[0],
                "--allreduce-host %s without --insecure-collective: exit 2, one line "
                "naming the flag (%s, %s)" % (host, codes, out))
    finally:
        job.close()
    job = mwmjob.Job("open-ok")
    try:
        job.start(0, ["--workers", "1", "--steps", "3", "--allreduce-host", host,
                      "--insecure-collective"])
        codes = job.wait(60)
        log = job.log(0)
        r.check(codes == {0: 0} and "--insecure-collective" in log and "plaintext" in log,
                "--allreduce-host %s --insecure-collective trains, with a warning (%s)"
                % (host, log.strip().splitlines()[:2]))
        p = subprocess.run([mwmjob.build_path("tools", "psctl"), "status", "--coordinator",
                            job.coord_addr()], capture_output=True, text=True, timeout=30)
        line = [x for x in p.stdout.splitlines() if x.startswith("collective")]
        r.check(p.returncode == 0 and len(line) == 1 and "worker[0]" in line[0]
                and "--insecure-collective" in line[0],
                "psctl status shows worker[0]'s plaintext collective (%s)" % line)
    finally:
        job.close()


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
    insecure_collective(r)
    r.finish()


if __name__ == "__main__":
    main()
