"""What a worker-token holder cannot do to pscoord's job, against a real
pscoord (and real psd shards, workerd) on 127.0.0.1:0 with temporary
directories:

  place       the first Place is the chief's (worker 0) or an operator's:
              worker 1 and an evaluator are PERMISSION_DENIED naming the
              chief, with or without naming themselves, and so is a worker
              that claims worker 0 with its own secret; nothing is placed
              until the chief proposes; then the others get the same
              placement. Two workerd, the non-chief started first, wait for
              the chief and both train.
  sync        a SYNC variable a worker creates after pscoord told psd the
              job's count names num_workers 1000; its steps still complete
              with the two registered workers' pushes (pscoord's count).
  kv-cap      330 registered workers fill the rendezvous store: the key
              that would be its 4097th is RESOURCE_EXHAUSTED naming the cap
              of 4096 keys; a key already held may still be rewritten.
  collective  a worker registered with insecure_collective is still named
              in `psctl status` after pscoord restarts on its state.

Prints ok/FAIL per check and "coord-trust: N passed, N failed".
"""
import json
import os
import subprocess
import sys
import threading
import time

import grpc
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "interop"))
sys.path.insert(0, HERE)
import pstest  # noqa: E402
import test_pscoord as tp  # noqa: E402  (its helpers: Coord, reg, Beater, psctl)

WORKERD = os.path.join(pstest.BUILD_ROOT, "worker", "workerd")
FM = "/usr/share/datasets/fashion-mnist"
MODEL = [("w", [8, 16]), ("b", [16])]
pb = pbg = r = None


def place_req(job, model, secret, role=None, index=0):
    req = pb.PlaceRequest(job_id=job, task_secret=secret, variables=[
        pb.VariablePlacement(name=n, shape=s) for n, s in model])
    if role is not None:
        req.role = role
        req.index = index
    return req


def check_place():
    W, PS, EV = pb.WORKER, pb.PS, pb.EVALUATOR
    c = tp.start_coord(pstest.tmpdir("trust-place-"), "--job-id", "pl",
                       "--heartbeat-timeout", "60s")
    s = c.stub
    tp.reg(s, "pl", PS, -1, "127.0.0.1:1")
    w0, w1 = tp.reg(s, "pl", W), tp.reg(s, "pl", W)
    ev = tp.reg(s, "pl", EV)
    r.check((w0.index, w1.index) == (0, 1), "place: two workers, 0 and 1")
    first = "may not make the job's first placement"
    for what, req in (
            ("worker[1], naming itself", place_req("pl", MODEL, w1.task_secret, W, 1)),
            ("worker[1], naming no task (an older client)",
             place_req("pl", MODEL, w1.task_secret)),
            ("the evaluator", place_req("pl", MODEL, ev.task_secret, EV, ev.index))):
        ok, why = tp.refused(lambda: s.Place(req, timeout=5),
                             grpc.StatusCode.PERMISSION_DENIED, first, "chief")
        r.check(ok, "place: the first Place from %s is refused naming the chief (%s)"
                % (what, why))
    ok, why = tp.refused(lambda: s.Place(place_req("pl", MODEL, w1.task_secret, W, 0),
                                         timeout=5),
                         grpc.StatusCode.PERMISSION_DENIED, "is not worker[0]'s")
    r.check(ok, "place: worker[1] claiming to be worker[0] with its own secret is "
            "refused (%s)" % why)
    r.check(len(c.cluster().placement) == 0, "place: the refused proposals placed nothing")
    got = s.Place(place_req("pl", MODEL, w0.task_secret, W, 0), timeout=5).placement
    r.check([v.name for v in got] == ["w", "b"], "place: the chief's Place places the model")
    again = s.Place(place_req("pl", MODEL, w1.task_secret, W, 1), timeout=5).placement
    r.check(again == got, "place: worker[1]'s proposal of the same model then gets the "
            "chief's placement")
    ok, why = tp.refused(lambda: s.Place(place_req("pl", [("w", [8, 17])], w1.task_secret,
                                                   W, 1), timeout=5),
                         grpc.StatusCode.FAILED_PRECONDITION, "placed already")
    r.check(ok, "place: another model from worker[1] is refused (%s)" % why)
    c.stop()


def check_place_workerd():
    if not os.path.isdir(FM):
        print("skip place-workerd: no %s" % FM)
        return
    # A static spec of two workers (workerd's data shards need the count
    # before worker 0 registers) and one psd.
    d = tp.start_psd(pstest.tmpdir())
    tmp = pstest.tmpdir("trust-wd-")
    spec = os.path.join(tmp, "cluster.json")
    with open(spec, "w") as f:
        json.dump({"cluster": {"worker": ["127.0.0.1:%d" % tp.free_port() for _ in range(2)],
                               "ps": [d.address]}, "job_id": "wd"}, f)
    c = tp.start_coord(os.path.join(tmp, "state"), "--cluster", spec)

    def worker(i):
        log = open(os.path.join(tmp, "w%d" % i), "w")
        return subprocess.Popen([WORKERD, "--coordinator", c.address, "--job-id", "wd",
                                 "--task-index", str(i), "--model", "mlp:784-32-10",
                                 "--epochs", "0", "--steps", "20", "--no-evaluate",
                                 "--progress", "0", "--log-level", "info"],
                                stdout=subprocess.DEVNULL, stderr=log), log
    p1, l1 = worker(1)
    waited = tp.wait_until(lambda: "waiting for the chief" in
                           open(os.path.join(tmp, "w1")).read(), 20)
    r.check(bool(waited) and len(c.cluster().placement) == 0 and p1.poll() is None,
            "place: workerd worker 1, started alone, waits for the chief's placement")
    p0, l0 = worker(0)
    try:
        rc = (p0.wait(timeout=120), p1.wait(timeout=120))
    except subprocess.TimeoutExpired:
        rc = None
    for p in (p0, p1):
        if p.poll() is None:
            p.kill()
            p.wait()
    l0.close()
    l1.close()
    r.check(rc == (0, 0) and len(c.cluster().placement) > 0,
            "place: then worker 0 places and both train and exit 0 (%s)" % (rc,))
    d.stop()
    c.stop()


def check_sync_count():
    W, PS = pb.WORKER, pb.PS
    d = tp.start_psd(pstest.tmpdir())
    ch = pstest.channel(d.address)
    ps = pbg.ParameterServerStub(ch)
    # The model's SYNC variable, as workerd creates it for a job of 2.
    ps.CreateVariable(pb.CreateVariableRequest(spec=pstest.spec(
        pb, "w", (4,), lr=1.0, consistency=pb.SYNC, num_workers=2)), timeout=10)
    c = tp.start_coord(pstest.tmpdir("trust-sync-"), "--job-id", "sy",
                       "--heartbeat-interval", "100ms", "--heartbeat-timeout", "5s")
    s = c.stub
    p0 = tp.reg(s, "sy", PS, -1, d.address)
    beat = tp.Beater(s, "sy")
    beat.add(PS, 0, p0.incarnation)
    for _ in range(2):
        w = tp.reg(s, "sy", W)
        beat.add(W, w.index, w.incarnation)
    r.check(c.wait_log("sync steps wait for 2 workers", 5),
            "sync: pscoord tells psd that its job has 2 workers")
    # A worker creates a SYNC variable for a job of 1000 workers (within
    # psd's --max-sync-workers): its steps must not wait for 1000 pushes.
    ps.CreateVariable(pb.CreateVariableRequest(spec=pstest.spec(
        pb, "big", (4,), lr=1.0, consistency=pb.SYNC, num_workers=1000)), timeout=10)
    result = {}

    def push(worker):
        try:
            resp = ps.Push(pb.PushRequest(worker=worker, step=0, grads=[
                pstest.grad(pb, "big", np.ones(4))]), timeout=5)
            result[worker] = list(resp.versions)
        except grpc.RpcError as e:
            result[worker] = e.code().name
    ts = [threading.Thread(target=push, args=(i,)) for i in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(10)
    r.check(result == {0: [1], 1: [1]},
            "sync: a variable whose spec names 1000 workers steps with the 2 registered "
            "workers' pushes, pscoord's count (%s)" % result)
    beat.stop()
    ch.close()
    c.stop()
    d.stop()


def check_kv_cap():
    W = pb.WORKER
    n = 330
    c = tp.start_coord(pstest.tmpdir("trust-kv-"), "--job-id", "kv",
                       "--heartbeat-timeout", "600s", "--log-level", "warn")
    s = c.stub
    secrets = [tp.reg(s, "kv", W).task_secret for _ in range(n)]

    def kv_set(w, key, value=b"x"):
        return s.KvSet(pb.KvSetRequest(job_id="kv", key=key, value=value, index=w,
                                       task_secret=secrets[w]), timeout=10)

    def generation():
        try:
            got = s.KvGet(pb.KvGetRequest(job_id="kv", keys=["generation"], index=0,
                                          task_secret=secrets[0], timeout_ms=0),
                          timeout=5)
            return int(got.values[0])
        except grpc.RpcError:
            return 0
    kv_set(0, "started")
    g = tp.wait_until(generation, 10)
    # Two more generations of the same members (a member reports each
    # failed): the store keeps the rank keys of the last three.
    for k in range(2):
        kv_set(0, "gen/%d/failed" % (g + k))
        tp.wait_until(lambda: generation() == g + k + 1, 10)
    r.check(generation() == g + 2, "kv-cap: three generations of %d workers (%d..%d)"
            % (n, g, g + 2))
    held = 7  # generation, 3 x members, 2 x failed, started
    refusal = None
    for w in range(n):
        keys = ["model/%d" % w] + ["gen/%d/%s%d" % (g + k, pre, w) for k in range(3)
                                   for pre in ("", "rank_", "sync/", "sync/rank_")]
        for key in keys:
            try:
                kv_set(w, key)
                held += 1
            except grpc.RpcError as e:
                refusal = (key, e.code(), e.details())
                break
        if refusal:
            break
    r.check(refusal is not None and refusal[1] == grpc.StatusCode.RESOURCE_EXHAUSTED and
            "4096 keys" in refusal[2] and held == 4096,
            "kv-cap: the key past 4096 is RESOURCE_EXHAUSTED naming the cap (%d held; %s)"
            % (held, refusal and "%s: %s" % (refusal[1].name, refusal[2])))
    ok, why = tp.refused(lambda: kv_set(n - 1, "model/%d" % (n - 1)),
                         grpc.StatusCode.RESOURCE_EXHAUSTED, "4096")
    r.check(ok, "kv-cap: so is another new key (%s)" % why)
    try:
        kv_set(0, "model/0", b"again")
        rewritten = True
    except grpc.RpcError:
        rewritten = False
    r.check(rewritten, "kv-cap: a key already held is still rewritten")
    c.stop()


def check_collective():
    state = pstest.tmpdir("trust-coll-")
    c = tp.start_coord(state, "--job-id", "co", "--heartbeat-timeout", "60s")
    c.stub.RegisterTask(pb.RegisterRequest(job_id="co", role=pb.WORKER, index=-1,
                                           address="10.0.0.5:4000",
                                           insecure_collective=True), timeout=5)

    def collective():
        p = tp.psctl("status", "--coordinator", c.address)
        return tp.label(p.stdout, "collective")
    before = collective()
    r.check(before is not None and "worker[0]" in before,
            "collective: psctl status names worker[0]'s plaintext all-reduce (%s)" % before)
    c.stop()
    c = tp.start_coord(state, "--job-id", "co", "--heartbeat-timeout", "60s")
    after = collective()
    r.check(after == before, "collective: still named after pscoord restarts (%s)" % after)
    c.stop()


def main():
    global pb, pbg, r
    pb, pbg, _, _ = pstest.generate_stubs()
    r = pstest.Results("coord-trust")
    tp.pb, tp.pbg, tp.r = pb, pbg, r
    try:
        r.run([check_place, check_place_workerd, check_sync_count, check_kv_cap,
               check_collective])
    finally:
        for x in tp.LIVE:
            x.kill()
    r.finish()


if __name__ == "__main__":
    main()
