"""psd's caps and DeleteVariable, against a real psd on 127.0.0.1:0 with small
caps given on the command line (issue #13 e):

- a CreateVariable over --max-bytes (the audit's 1 GiB one among them) or
  over --max-variables is refused at once with RESOURCE_EXHAUSTED naming the
  limit and its value, allocates nothing, and leaves the variables as they
  were; an identical re-create at the cap still answers OK;
- with --max-waiting-pulls N, the N+1st waiting pull is refused at once, and one
  client may keep only a quarter of them waiting;
- a waiting pull whose client set no deadline (or a long one) is answered
  DEADLINE_EXCEEDED after --max-pull-wait;
- --max-streams caps one connection's calls in flight: one beyond waits
  (client side) while another connection is served;
- DeleteVariable frees the bytes (a create that was over the cap then
  fits), answers a pull and a sync push waiting on the variable (NOT_FOUND,
  ABORTED, naming it), is NOT_FOUND for an unknown name, and the variable
  is gone after psd is killed (-9) and restarted, with the caps counting
  what the store holds."""
import os
import signal
import sys
import time

import grpc
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pstest  # noqa: E402

C = grpc.StatusCode
KIB = 1024


def pull_req(pb, name, min_version=0):
    return pb.PullRequest(items=[pb.PullItem(name=name, min_version=min_version)])


def names(pb, stub):
    lv = stub.ListVariables(pb.ListVariablesRequest(), timeout=5)
    return sorted(v.spec.name for v in lv.variables)


def outcome(fut, wait):
    """(code, details, seconds until answered) of a call future, or
    (None, "still waiting", wait) when it is not answered within wait s."""
    t0 = time.monotonic()
    try:
        fut.result(timeout=wait)
        return C.OK, "", time.monotonic() - t0
    except grpc.FutureTimeoutError:
        fut.cancel()
        return None, "still waiting after %.0f s" % wait, wait
    except grpc.RpcError as e:
        return e.code(), e.details() or "", time.monotonic() - t0


def caps_on_create(pb, stub, r):
    """--max-variables 3, --max-bytes 64K: a (16 KiB) and b (16 KiB with its
    momentum slot) fit; big (32 KiB + 4 B) and a 1 GiB one do not."""
    def create(name, shape, **kw):
        return stub.CreateVariable(pb.CreateVariableRequest(
            spec=pstest.spec(pb, name, shape, **kw)), timeout=30)

    create("a", (4096,), init=pb.Initializer(kind=pb.Initializer.CONSTANT, value=3.0))
    create("b", (2048,), opt=pb.Optimizer(kind=pb.Optimizer.MOMENTUM, learning_rate=0.1))
    stub.Push(pb.PushRequest(grads=[pstest.grad(pb, "a", np.ones(4096))]), timeout=5)

    def snapshot():
        got = stub.Pull(pull_req(pb, "a"), timeout=5)
        return names(pb, stub), got.values[0].version, pstest.value(got.values[0]).tobytes()

    before = snapshot()
    r.refused("a create over --max-bytes", lambda: create("big", (8193,)),
              C.RESOURCE_EXHAUSTED, "'big'", "32.0 KiB more would hold 64.0 KiB",
              "--max-bytes 64.0 KiB")
    r.check(snapshot() == before, "the refused create changed nothing")
    # The audit's attack: one call that made psd allocate 1 GiB for good.
    t0 = time.monotonic()
    r.refused("a 1 GiB create over --max-bytes", lambda: create("huge", ((1 << 28) - 1024,)),
              C.RESOURCE_EXHAUSTED, "'huge'", "1.0 GiB more", "--max-bytes 64.0 KiB")
    took = time.monotonic() - t0
    rss = stub.Stats(pb.StatsRequest(), timeout=5).resident_bytes
    r.check(took < 2 and rss < (256 << 20),
            "refused at once (%.2f s), with nothing allocated (resident %.0f MiB)"
            % (took, rss / 2**20))
    r.check(snapshot() == before, "the 1 GiB create changed nothing")
    again = create("a", (4096,), init=pb.Initializer(kind=pb.Initializer.CONSTANT, value=3.0))
    r.check(not again.created and again.version == 1,
            "an identical re-create answers OK at the cap (created=%s, version %d)"
            % (again.created, again.version))

    create("c", (1,))
    before = snapshot()
    r.refused("a create over --max-variables", lambda: create("d", (1,)),
              C.RESOURCE_EXHAUSTED, "'d'", "holds 3 variables", "--max-variables 3")
    r.check(snapshot() == before, "the refused create changed nothing")


def caps_on_pulls(pb, pbg, address, r):
    """--max-waiting-pulls 4, --max-pull-wait 3s: four pulls from four
    clients wait for a version that never comes (one with no client
    deadline), a fifth is refused at once; the four are answered
    DEADLINE_EXCEEDED after ~3 s. One client may keep only a quarter of
    them waiting (here 1): its next waiting pull is refused naming that,
    while another client's is still admitted (one worker parked them all
    before, refusing everyone else's)."""
    # Each its own connection: grpcio shares one between channels to the
    # same target unless told not to.
    own = list(pstest.CHANNEL_OPTIONS) + [("grpc.use_local_subchannel_pool", 1)]
    stubs = [pbg.ParameterServerStub(grpc.insecure_channel(address, options=own))
             for _ in range(7)]
    stub = stubs[4]
    issued = time.monotonic()
    waiting = [stubs[i].Pull.future(pull_req(pb, "a", 100), timeout=None if i == 0 else 60)
               for i in range(4)]
    time.sleep(0.5)
    t0 = time.monotonic()
    r.refused("the 5th waiting pull with --max-waiting-pulls 4",
              lambda: stub.Pull(pull_req(pb, "a", 100), timeout=30),
              C.RESOURCE_EXHAUSTED, "--max-waiting-pulls 4")
    r.check(time.monotonic() - t0 < 2, "refused at once (%.2f s)" % (time.monotonic() - t0))
    got = stub.Pull(pull_req(pb, "a", 1), timeout=5)
    r.check(got.values[0].version == 1, "a pull whose version is there is still answered")
    for i, fut in enumerate(waiting):
        code, msg, _ = outcome(fut, 15)
        after = time.monotonic() - issued
        r.check(code == C.DEADLINE_EXCEEDED and "--max-pull-wait 3 s" in msg
                and "'a'" in msg and 2.9 <= after < 10,
                "waiting pull %d (%s) is answered after --max-pull-wait (%.1f s): %s %r"
                % (i, "no client deadline" if i == 0 else "client deadline 60 s",
                   after, code and code.name, msg))
    # One client's share: its second waiting pull is refused, another's
    # first is admitted.
    mine = stubs[5].Pull.future(pull_req(pb, "a", 2), timeout=20)
    time.sleep(0.3)
    r.refused("a client's second waiting pull (its share of --max-waiting-pulls 4 is 1)",
              lambda: stubs[5].Pull(pull_req(pb, "a", 2), timeout=10),
              C.RESOURCE_EXHAUSTED, "this client", "--max-waiting-pulls 4")
    other = stubs[6].Pull.future(pull_req(pb, "a", 2), timeout=20)
    time.sleep(0.3)
    stub.Push(pb.PushRequest(grads=[pstest.grad(pb, "a", np.ones(4096))]), timeout=5)
    codes = [outcome(f, 15)[0] for f in (mine, other)]
    r.check(codes == [C.OK, C.OK], "their places are free again: the client's first and "
            "another client's waiting pulls are admitted and answered (%s)"
            % [c and c.name for c in codes])


def answered_on_delete(pb, stub, r, fut, name, code_want, what):
    """Deletes variable `name` while call `fut` waits on it: the call is
    answered within 5 s with code_want, naming the variable and why."""
    time.sleep(0.3)
    stub.DeleteVariable(pb.DeleteVariableRequest(name=name), timeout=10)
    code, msg, took = outcome(fut, 10)
    r.check(code == code_want and "'%s'" % name in msg and "deleted" in msg and took < 5,
            "%s waiting on a deleted variable is answered: %s %r"
            % (what, code and code.name, msg))


def delete_frees(pb, pbg, stub, r):
    """DeleteVariable: bytes given back, waits on it answered, NOT_FOUND for
    an unknown name."""
    got = stub.DeleteVariable(pb.DeleteVariableRequest(name="b"), timeout=10)
    r.check(got.bytes == 16 * KIB, "deleting b frees its 16 KiB (%d)" % got.bytes)
    r.check(names(pb, stub) == ["a", "c"], "b is no longer listed (%s)" % names(pb, stub))
    r.refused("a pull of the deleted variable", lambda: stub.Pull(pull_req(pb, "b"), timeout=5),
              C.NOT_FOUND, "'b'")
    big = stub.CreateVariable(pb.CreateVariableRequest(spec=pstest.spec(pb, "big", (8193,))),
                              timeout=10)
    r.check(big.created, "the create that was over --max-bytes fits now")
    r.refused("deleting an unknown variable",
              lambda: stub.DeleteVariable(pb.DeleteVariableRequest(name="nope"), timeout=5),
              C.NOT_FOUND, "'nope'")

    # A pull waiting on c is answered when c is deleted.
    fut = stub.Pull.future(pull_req(pb, "c", 5), timeout=30)
    answered_on_delete(pb, stub, r, fut, "c", C.NOT_FOUND, "a pull")

    # A sync push waiting for its step is answered when the variable goes.
    stub.CreateVariable(pb.CreateVariableRequest(spec=pstest.spec(
        pb, "s", (4,), consistency=pb.SYNC, num_workers=2)), timeout=10)
    fut = stub.Push.future(pb.PushRequest(worker=0, step=0, grads=[
        pstest.grad(pb, "s", np.ones(4))]), timeout=30)
    answered_on_delete(pb, stub, r, fut, "s", C.ABORTED, "a sync push")


def restart(pb, pbg, data, r, d):
    """Killed with -9 right after its deletes, psd restarts without them,
    and its caps count what the store holds."""
    d.stop(signal.SIGKILL)
    d = pstest.start_psd(data, "--max-variables", "3", "--max-bytes", "64K")
    stub = pbg.ParameterServerStub(pstest.channel(d.address))
    r.check(names(pb, stub) == ["a", "big"],
            "after kill -9 and a restart only a and big are there (%s)" % names(pb, stub))
    r.refused("after the restart, a create over --max-bytes",
              lambda: stub.CreateVariable(pb.CreateVariableRequest(
                  spec=pstest.spec(pb, "x", (4096,))), timeout=10),
              C.RESOURCE_EXHAUSTED, "--max-bytes 64.0 KiB")
    r.check(d.stop() == 0, "psd exits 0 on SIGTERM")


def streams_cap(pb, pbg, r):
    """--max-streams 2: two waiting pulls fill a connection; a third call on
    it waits for a stream, while another connection is answered."""
    d = pstest.start_psd(pstest.tmpdir(), "--max-streams", "2")
    ch = pstest.channel(d.address)
    stub = pbg.ParameterServerStub(ch)
    stub.CreateVariable(pb.CreateVariableRequest(spec=pstest.spec(pb, "w", (2,))), timeout=10)
    waiting = [stub.Pull.future(pull_req(pb, "w", 9), timeout=20) for _ in range(2)]
    time.sleep(0.5)
    r.refused("a third call on a connection with 2 calls in flight",
              lambda: stub.Pull(pull_req(pb, "w"), timeout=1.5), C.DEADLINE_EXCEEDED)
    # Its own subchannel pool: a connection of its own, not the shared one.
    other = grpc.insecure_channel(d.address, options=pstest.CHANNEL_OPTIONS + [
        ("grpc.use_local_subchannel_pool", 1)])
    got = pbg.ParameterServerStub(other).Pull(pull_req(pb, "w"), timeout=5)
    r.check(got.values[0].version == 0, "another connection is served meanwhile")
    for fut in waiting:
        fut.cancel()
    r.check(d.stop() == 0, "psd exits 0 on SIGTERM")


def main():
    pb, pbg, _, _ = pstest.generate_stubs()
    r = pstest.Results("psd-caps")
    data = pstest.tmpdir()
    d = pstest.start_psd(data, "--max-variables", "3", "--max-bytes", "64K",
                         "--max-waiting-pulls", "4", "--max-pull-wait", "3s")
    stub = pbg.ParameterServerStub(pstest.channel(d.address))
    caps_on_create(pb, stub, r)
    caps_on_pulls(pb, pbg, d.address, r)
    delete_frees(pb, pbg, stub, r)
    restart(pb, pbg, data, r, d)
    streams_cap(pb, pbg, r)
    r.finish()


if __name__ == "__main__":
    main()
