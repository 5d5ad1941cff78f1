"""Checkpoints of a real psd: taken while pushes go on, restored whole; a
checkpoint without its manifest (or with a corrupt one) is never used; a full
disk fails the Checkpoint call with a clear status and leaves the earlier
checkpoints intact. The full disk is a 1 MiB tmpfs mounted on checkpoints/
in a private mount namespace (root only; skipped with a note otherwise)."""
import json
import os
import subprocess
import sys
import threading
import time

import grpc
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pstest  # noqa: E402


def keep_three(pb, pbg):
    """A psd of its own that keeps three checkpoints, holding "w" (8,) at
    lr 1: its pstest.DensePsd, its checkpoints directory, and kept(), the
    steps of the checkpoints there."""
    p = pstest.DensePsd(pb, pbg, "--checkpoint-keep", "3")
    p.stub.CreateVariable(pb.CreateVariableRequest(spec=pstest.spec(
        pb, "w", (8,), lr=1.0)), timeout=10)
    ck = os.path.join(p.dir, "checkpoints")

    def kept():
        return sorted(int(x) for x in os.listdir(ck) if x.isdigit())
    return p, ck, kept


def push_then_restore_newest(pb, stub):
    """Pushes ones to "w", so that it is past every checkpoint, then
    Restore(0): the step Restore loaded and w's version after it."""
    stub.Push(pb.PushRequest(grads=[pstest.grad(pb, "w", np.ones(8))]), timeout=10)
    resp = stub.Restore(pb.RestoreRequest(step=0), timeout=30)
    got = stub.Pull(pb.PullRequest(items=[pb.PullItem(name="w")]), timeout=5)
    return resp.step, got.values[0].version


def forged_steps(pb, pbg, r):
    """The audit's attack (issue 13 b): the steps of the Checkpoint calls
    decide retention. Checkpoints 100, 200 and 300 are taken; three at steps
    near 2^63 must be refused and leave them; an honest 400 must survive its
    own call and be what Restore(0) loads; keep_at_least 10^6 is refused."""
    p, _, kept = keep_three(pb, pbg)
    stub = p.stub

    def ckpt(step, keep=0):
        return stub.Checkpoint(pb.CheckpointRequest(step=step, keep_at_least=keep),
                               timeout=30)

    for st in (100, 200, 300):
        stub.Push(pb.PushRequest(grads=[pstest.grad(pb, "w", np.ones(8))]), timeout=10)
        ckpt(st)
    r.check(kept() == [100, 200, 300], "checkpoints 100, 200 and 300 are taken "
            "at versions 1..3 (%s)" % kept())
    for k in range(3):
        forged = (1 << 63) - 1 - k
        r.refused("Checkpoint at step %d" % forged, lambda f=forged: ckpt(f),
                  grpc.StatusCode.INVALID_ARGUMENT, str(forged), "version 3")
    r.check(kept() == [100, 200, 300], "the refused steps near 2^63 leave 100, 200 "
            "and 300 (%s)" % kept())
    stub.Push(pb.PushRequest(grads=[pstest.grad(pb, "w", np.ones(8))]), timeout=10)
    resp = ckpt(400)
    r.check(resp.step == 400 and kept() == [200, 300, 400],
            "an honest checkpoint at 400 answers OK and survives its own call (%s)"
            % kept())
    step, version = push_then_restore_newest(pb, stub)
    r.check(step == 400 and version == 4,
            "Restore(0) loads checkpoint 400 (step %d, version %d)" % (step, version))
    r.refused("keep_at_least 10^6", lambda: ckpt(500, keep=10 ** 6),
              grpc.StatusCode.INVALID_ARGUMENT, "1000000", "1000")
    r.check(kept() == [200, 300, 400], "the refused keep_at_least wrote nothing (%s)"
            % kept())
    # Steps within the bound (2^40 past the highest version) are still the
    # caller's: three of them outrank 500, which must survive its own call
    # all the same.
    top = (1 << 40) + 4
    for st in (top, top - 1, top - 2):
        ckpt(st)
    resp = ckpt(500)
    r.check(resp.step == 500 and 500 in kept(), "a checkpoint below three newer ones "
            "by step is not deleted by its own call (%s)" % kept())
    r.refused("Checkpoint one step past the bound", lambda: ckpt(top + 1),
              grpc.StatusCode.INVALID_ARGUMENT, str(top + 1))
    r.check(p.stop() == 0, "psd exits 0 on SIGTERM")


def forged_steps_within_bound(pb, pbg, r):
    """The audit's attack: Checkpoint at steps just within the bound of
    2^40 past the highest version (the audit's 2^40+99, +100, +50), outranked every honest
    checkpoint by step, so psd pruned each honest one and Restore(0) loaded
    a forged step. Retention follows creation: the next three honest
    checkpoints (400, 500, 600) are the ones kept, and Restore(0) loads
    600."""
    p, ck, kept = keep_three(pb, pbg)
    stub = p.stub

    def push_and_ckpt(st):
        stub.Push(pb.PushRequest(grads=[pstest.grad(pb, "w", np.ones(8))]), timeout=10)
        return stub.Checkpoint(pb.CheckpointRequest(step=st), timeout=30)

    for st in (100, 200, 300):
        push_and_ckpt(st)
    # The highest version is 3: these are just within the bound of 2^40
    # past it, as 2^40+99 was within it on the audit's psd.
    big = 1 << 40
    for forged in (big + 2, big + 3, big - 47):
        stub.Checkpoint(pb.CheckpointRequest(step=forged), timeout=30)
    for st in (400, 500, 600):
        push_and_ckpt(st)
    r.check(kept() == [400, 500, 600], "after forged steps 2^40+2, +3 and -47 the "
            "honest 400, 500 and 600 are kept (%s)" % kept())
    step, version = push_then_restore_newest(pb, stub)
    r.check(step == 600 and version == 6,
            "Restore(0) loads the newest honest checkpoint 600 (step %d, version %d)"
            % (step, version))
    man = json.load(open(os.path.join(ck, "600", "MANIFEST.json")))
    r.check(man.get("format") == 2 and man.get("sequence", 0) > 0,
            "the manifest records its creation order (%s)" % man)
    r.check(p.stop() == 0, "psd exits 0 on SIGTERM")


def main():
    pb, pbg, _, _ = pstest.generate_stubs()
    r = pstest.Results("psd-checkpoint")
    data = pstest.tmpdir()
    d = pstest.start_psd(data, "--checkpoint-keep", "3")
    ch = pstest.channel(d.address)
    stub = pbg.ParameterServerStub(ch)
    for name, shape in (("a", (1000,)), ("b", (64, 64))):
        stub.CreateVariable(pb.CreateVariableRequest(spec=pstest.spec(
            pb, name, shape, lr=1.0)), timeout=10)

    stop = threading.Event()

    def pusher(i):
        c = pstest.channel(d.address)
        s = pbg.ParameterServerStub(c)
        g = [pstest.grad(pb, "a", np.ones(1000)), pstest.grad(pb, "b", np.ones((64, 64)))]
        while not stop.is_set():
            s.Push(pb.PushRequest(worker=i, grads=g), timeout=10)
        c.close()

    threads = [threading.Thread(target=pusher, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    time.sleep(0.3)
    steps = []
    for _ in range(4):
        resp = stub.Checkpoint(pb.CheckpointRequest(step=0), timeout=30)
        steps.append(resp.step)
        time.sleep(0.1)
    stop.set()
    for t in threads:
        t.join()
    r.check(steps == sorted(steps) and steps[0] > 0,
            "four checkpoints while pushes go on, at steps %s" % steps)
    ck = os.path.join(data, "checkpoints")
    kept = sorted(int(x) for x in os.listdir(ck) if x.isdigit())
    r.check(kept == steps[-3:], "--checkpoint-keep 3 keeps the last three (%s)" % kept)
    man = json.load(open(os.path.join(ck, str(steps[-1]), "MANIFEST.json")))
    r.check(man.get("step") == steps[-1] and man.get("variables") == 2,
            "the manifest names its step and variables (%s)" % man)

    now = stub.Pull(pb.PullRequest(items=[pb.PullItem(name="a")]), timeout=5).values[0].version
    resp = stub.Restore(pb.RestoreRequest(step=steps[-2]), timeout=30)
    got = stub.Pull(pb.PullRequest(items=[pb.PullItem(name="a"), pb.PullItem(name="b")]),
                    timeout=5)
    va, vb = got.values
    r.check(resp.step == steps[-2] and resp.variables == 2,
            "Restore loads checkpoint %d with 2 variables" % steps[-2])
    r.check(va.version < now, "the restored version %d is the checkpoint's, not the "
            "live %d" % (va.version, now))
    r.check(bool(np.all(pstest.value(va) == -float(va.version))) and
            bool(np.all(pstest.value(vb) == -float(vb.version))),
            "each variable in a checkpoint taken under pushes is whole "
            "(a at %d, b at %d)" % (va.version, vb.version))

    # A newer directory without a manifest, and one with a corrupt manifest,
    # are never taken for checkpoints.
    os.makedirs(os.path.join(ck, "999999"))
    open(os.path.join(ck, "999999", "data.mdb"), "wb").write(b"\0" * 4096)
    bad = os.path.join(ck, "888888")
    os.makedirs(bad)
    open(os.path.join(bad, "data.mdb"), "wb").write(b"\0" * 4096)
    open(os.path.join(bad, "MANIFEST.json"), "w").write('{"format": 1, "step": 888888, "va')
    resp = stub.Restore(pb.RestoreRequest(step=0), timeout=30)
    r.check(resp.step == steps[-1], "Restore of the latest skips directories without a "
            "whole manifest (restored %d)" % resp.step)
    r.refused("restoring a checkpoint without a manifest",
              lambda: stub.Restore(pb.RestoreRequest(step=999999), timeout=30),
              grpc.StatusCode.NOT_FOUND, "999999")
    r.refused("restoring a missing checkpoint",
              lambda: stub.Restore(pb.RestoreRequest(step=12345), timeout=30),
              grpc.StatusCode.NOT_FOUND)
    # A checkpoint runs on its own thread: pulls are answered while a big
    # one is written (psd serves calls on one thread by default). So does a
    # big CreateVariable (drawing 128 MiB of normal values), and a Restore.
    def pulls_during(call):
        """Runs call() on a thread while this one pulls 'a'; returns call's
        result, its duration in ms, and the pulls that started after it and
        were answered well before it ended (none if it held the only
        serving thread)."""
        span = {}
        def run():
            span["t0"] = time.monotonic()
            span["out"] = call()
            span["t1"] = time.monotonic()
        th = threading.Thread(target=run)
        th.start()
        pulls = []
        while th.is_alive():
            a0 = time.monotonic()
            stub.Pull(pb.PullRequest(items=[pb.PullItem(name="a")]), timeout=30)
            pulls.append((a0, time.monotonic()))
        th.join()
        if "t1" not in span:
            return None, 0.0, 0
        during = sum(1 for a0, a1 in pulls
                     if a0 > span["t0"] and a1 < span["t1"] - 0.05)
        return span["out"], (span["t1"] - span["t0"]) * 1e3, during

    created, ms, during = pulls_during(lambda: stub.CreateVariable(
        pb.CreateVariableRequest(spec=pstest.spec(
            pb, "big", (4096, 8192), init=pb.Initializer(kind=pb.Initializer.NORMAL,
                                                          seed=1))), timeout=60).created)
    got = stub.ListVariables(pb.ListVariablesRequest(), timeout=30)
    big = [v for v in got.variables if v.spec.name == "big"]
    r.check(during > 0 and created is True and len(big) == 1 and
            list(big[0].spec.shape) == [4096, 8192],
            "pulls are answered while a %.0f ms CreateVariable draws 128 MiB of "
            "initial values (%d of them), and it is created" % (ms, during))
    big_step, ms, during = pulls_during(lambda: stub.Checkpoint(
        pb.CheckpointRequest(step=0), timeout=120).step)
    r.check(during > 0, "pulls are answered while a %.0f ms checkpoint of a 128 MiB "
            "variable is written (%d of them)" % (ms, during))

    # The Restore runs on the same thread, after any checkpoint queued before
    # it, and loads the 128 MiB checkpoint and writes it into the live store
    # while pulls are answered; only the swap holds them.
    before_a = stub.Pull(pb.PullRequest(items=[pb.PullItem(name="a")]), timeout=30)
    resp, ms, during = pulls_during(lambda: stub.Restore(
        pb.RestoreRequest(step=big_step), timeout=120))
    after_a = stub.Pull(pb.PullRequest(items=[pb.PullItem(name="a")]), timeout=30)
    r.check(during > 0 and resp is not None and resp.variables >= 2 and
            after_a.values[0].value.data == before_a.values[0].value.data,
            "pulls are answered while a %.0f ms Restore of a 128 MiB checkpoint runs "
            "(%d of them), and it restores" % (ms, during))

    # A caller that keeps more job checkpoints (pscoord --checkpoint-keep 5)
    # asks psd to keep as many of its own, beyond its --checkpoint-keep 3.
    def complete():
        """The checkpoints psd counts: a manifest that parses."""
        out = []
        for x in os.listdir(ck):
            try:
                json.load(open(os.path.join(ck, x, "MANIFEST.json")))
                out.append(int(x))
            except (OSError, ValueError):
                pass
        return sorted(out)
    kept_before = complete()
    more = [max(kept_before) + 1000 + k for k in range(3)]
    for st in more:
        stub.Checkpoint(pb.CheckpointRequest(step=st, keep_at_least=5), timeout=30)
    kept5 = complete()
    r.check(kept5 == sorted(set(kept_before + more))[-5:], "keep_at_least 5 keeps "
            "the last five, beyond --checkpoint-keep 3 (%s)" % kept5)
    stub.Checkpoint(pb.CheckpointRequest(step=more[-1] + 1), timeout=30)
    kept3 = complete()
    r.check(kept3 == (more + [more[-1] + 1])[-3:], "without it psd prunes to its own 3 "
            "again (%s)" % kept3)
    ch.close()
    r.check(d.stop() == 0, "psd exits 0 on SIGTERM")

    forged_steps(pb, pbg, r)
    forged_steps_within_bound(pb, pbg, r)

    # A full disk.
    data2 = pstest.tmpdir()
    os.makedirs(os.path.join(data2, "checkpoints"))
    probe = subprocess.run(["unshare", "-m", "--propagation", "private", "true"],
                           capture_output=True)
    if probe.returncode != 0:
        print("skip full-disk case: cannot make a mount namespace (%s)"
              % probe.stderr.decode().strip())
        r.finish()
    wrapper = ["unshare", "-m", "--propagation", "private", "sh", "-c",
               'mount -t tmpfs -o size=1m tmpfs "$0/checkpoints" && exec "$@"', data2]
    d2 = pstest.start_psd(data2, wrapper=wrapper)
    ch = pstest.channel(d2.address)
    stub = pbg.ParameterServerStub(ch)
    stub.CreateVariable(pb.CreateVariableRequest(spec=pstest.spec(pb, "small", (100,),
                                                                  lr=1.0)), timeout=10)
    stub.Push(pb.PushRequest(grads=[pstest.grad(pb, "small", np.ones(100))]), timeout=10)
    first = stub.Checkpoint(pb.CheckpointRequest(step=1), timeout=30)
    r.check(first.step == 1, "a checkpoint that fits is written (%d bytes)" % first.bytes)
    stub.CreateVariable(pb.CreateVariableRequest(spec=pstest.spec(pb, "big", (512, 1024),
                                                                  lr=1.0)), timeout=10)
    r.refused("a checkpoint on a full disk",
              lambda: stub.Checkpoint(pb.CheckpointRequest(step=2), timeout=30),
              grpc.StatusCode.RESOURCE_EXHAUSTED, "full")
    stub.Push(pb.PushRequest(grads=[pstest.grad(pb, "small", np.ones(100))]), timeout=10)
    resp = stub.Restore(pb.RestoreRequest(step=0), timeout=30)
    got = stub.Pull(pb.PullRequest(items=[pb.PullItem(name="small")]), timeout=5)
    r.check(resp.step == 1 and got.values[0].version == 1 and
            bool(np.all(pstest.value(got.values[0]) == -1.0)),
            "the earlier checkpoint is intact and restores (step %d)" % resp.step)
    ch.close()
    r.check(d2.stop() == 0, "psd exits 0 on SIGTERM")
    r.finish()


if __name__ == "__main__":
    main()
