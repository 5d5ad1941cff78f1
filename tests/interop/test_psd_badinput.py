"""Bad input to a real psd: each gets the right status code and a message
naming the problem, and nothing stored changes."""
import os
import sys

import grpc
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pstest  # noqa: E402


def main():
    pb, pbg, _, _ = pstest.generate_stubs()
    r = pstest.Results("psd-badinput")
    psd = pstest.DensePsd(pb, pbg, "--max-message", "1M")
    ch, stub = psd.ch, psd.stub
    ident = lambda b: b  # noqa: E731

    stub.CreateVariable(pb.CreateVariableRequest(spec=pstest.spec(
        pb, "w", (4, 3), lr=1.0,
        init=pb.Initializer(kind=pb.Initializer.CONSTANT, value=2.0))), timeout=5)
    stub.Push(pb.PushRequest(grads=[pstest.grad(pb, "w", np.ones((4, 3)))]), timeout=5)
    stub.CreateVariable(pb.CreateVariableRequest(spec=pstest.spec(pb, "bw", (3,))),
                        timeout=5)

    def snapshot():
        got = stub.Pull(pb.PullRequest(items=[pb.PullItem(name="w"),
                                              pb.PullItem(name="bw")]), timeout=5)
        lv = stub.ListVariables(pb.ListVariablesRequest(), timeout=5)
        return ([(v.version, pstest.value(v).tobytes()) for v in got.values],
                [v.spec.name for v in lv.variables])

    before = snapshot()

    def expect(what, fn, code, *words):
        try:
            fn()
            r.check(False, "%s: refused (it was accepted)" % what)
            return
        except grpc.RpcError as e:
            msg = e.details() or ""
            ok = e.code() == code and all(w in msg for w in words)
            r.check(ok, "%s -> %s %r" % (what, e.code().name, msg))
        r.check(snapshot() == before, "%s: nothing stored changed" % what)

    def push(*grads, step=0):
        return lambda: stub.Push(pb.PushRequest(step=step, grads=list(grads)), timeout=5)

    def create(s):
        return lambda: stub.CreateVariable(pb.CreateVariableRequest(spec=s), timeout=5)

    C = grpc.StatusCode
    expect("push to an unknown variable",
           push(pstest.grad(pb, "nope", np.ones(3))), C.NOT_FOUND, "'nope'")
    expect("pull of an unknown variable",
           lambda: stub.Pull(pb.PullRequest(items=[pb.PullItem(name="nope")]), timeout=5),
           C.NOT_FOUND, "'nope'")
    expect("gradient with the wrong element count",
           push(pstest.grad(pb, "w", np.ones(11))), C.INVALID_ARGUMENT,
           "11 elements", "12")
    expect("gradient with the wrong shape",
           push(pstest.grad(pb, "w", np.ones((3, 4)))), C.INVALID_ARGUMENT,
           "(3, 4)", "(4, 3)")
    wrong_dtype = pb.Gradient(name="w", grad=pb.Tensor(
        dtype=pb.DTYPE_FLOAT16, shape=[4, 3], data=b"\0" * 24))
    expect("gradient with the wrong dtype", push(wrong_dtype), C.INVALID_ARGUMENT,
           "FLOAT16")
    odd = pb.Gradient(name="w", grad=pb.Tensor(dtype=pb.DTYPE_FLOAT32, data=b"\0" * 47))
    expect("gradient with a partial element", push(odd), C.INVALID_ARGUMENT, "47 bytes")
    for bad in (np.nan, np.inf, -np.inf):
        g = np.ones((4, 3), dtype=np.float32)
        g[2, 1] = bad
        expect("gradient holding %s" % bad, push(pstest.grad(pb, "w", g)),
               C.INVALID_ARGUMENT, "NaN or Inf")
    expect("a push naming a variable twice",
           push(pstest.grad(pb, "w", np.ones((4, 3))), pstest.grad(pb, "w", np.ones((4, 3)))),
           C.INVALID_ARGUMENT, "two gradients")
    expect("a push with no gradients", push(), C.INVALID_ARGUMENT, "no gradients")
    big = pb.Gradient(name="w", grad=pb.Tensor(dtype=pb.DTYPE_FLOAT32,
                                              data=b"\0" * (2 << 20)))
    expect("a message over the limit", push(big), C.RESOURCE_EXHAUSTED)
    for method in ("Push", "Pull", "CreateVariable", "Checkpoint"):
        raw = ch.unary_unary("/ps.v1.ParameterServer/" + method,
                             request_serializer=ident, response_deserializer=ident)
        expect("%s with bytes that are not a message" % method,
               lambda raw=raw: raw(b"\xff\xff\xff\xff\x0f\x08", timeout=5),
               C.INVALID_ARGUMENT, method)
    # A name with a NUL byte: protobuf-c would cut it there, creating "a"
    # for "a\0b" and answering "bw\0x" with bw. Checkpoint and Restore take
    # no names.
    expect("CreateVariable of 'a\\0b'", create(pstest.spec(pb, "a\0b", (3,))),
           C.INVALID_ARGUMENT, "spec.name has a NUL byte at 1")
    expect("Pull of 'bw\\0x'",
           lambda: stub.Pull(pb.PullRequest(items=[pb.PullItem(name="w"),
                                                   pb.PullItem(name="bw\0x")]), timeout=5),
           C.INVALID_ARGUMENT, "items[1].name has a NUL byte at 2")
    expect("Push to 'bw\\0x'", push(pstest.grad(pb, "bw\0x", np.ones(3))),
           C.INVALID_ARGUMENT, "grads[0].name has a NUL byte at 2")
    expect("Push to 'w\\0' beside a good gradient",
           push(pstest.grad(pb, "bw", np.ones(3)), pstest.grad(pb, "w\0", np.ones((4, 3)))),
           C.INVALID_ARGUMENT, "grads[1].name has a NUL byte at 1")
    expect("an empty name", create(pstest.spec(pb, "", (3,))), C.INVALID_ARGUMENT, "empty")
    expect("an over-long name", create(pstest.spec(pb, "x" * 300, (3,))),
           C.INVALID_ARGUMENT, "255")
    expect("a zero dimension", create(pstest.spec(pb, "z", (3, 0))),
           C.INVALID_ARGUMENT, "dimension 1 is 0")
    expect("a negative dimension", create(pstest.spec(pb, "z", (-2,))),
           C.INVALID_ARGUMENT, "dimension 0 is -2")
    expect("a variable too big for one message", create(pstest.spec(pb, "z", (1 << 20,))),
           C.INVALID_ARGUMENT, "--max-message")
    expect("no dtype", create(pb.VariableSpec(name="z", shape=[3])),
           C.INVALID_ARGUMENT, "DTYPE_UNSPECIFIED")
    expect("a negative learning rate", create(pstest.spec(pb, "z", (3,), lr=-1.0)),
           C.INVALID_ARGUMENT, "learning_rate")
    expect("momentum of 1.5", create(pstest.spec(pb, "z", (3,), opt=pb.Optimizer(
        kind=pb.Optimizer.MOMENTUM, learning_rate=0.1, momentum=1.5))),
        C.INVALID_ARGUMENT, "momentum")
    expect("adam beta2 of 1", create(pstest.spec(pb, "z", (3,), opt=pb.Optimizer(
        kind=pb.Optimizer.ADAM, learning_rate=0.1, beta2=1.0))),
        C.INVALID_ARGUMENT, "beta2")
    expect("uniform with maxval <= minval", create(pstest.spec(pb, "z", (3,), init=pb.Initializer(
        kind=pb.Initializer.UNIFORM, minval=1.0, maxval=0.5))),
        C.INVALID_ARGUMENT, "maxval")
    expect("a sparse table of shape (2, 3)", create(pstest.spec(pb, "z", (2, 3), sparse=True)),
           C.INVALID_ARGUMENT, "sparse table 'z'", "[dim]")
    expect("the same name with another shape", create(pstest.spec(pb, "w", (4, 4), lr=1.0,
        init=pb.Initializer(kind=pb.Initializer.CONSTANT, value=2.0))),
        C.ALREADY_EXISTS, "shape (4, 4), existing (4, 3)")
    expect("the same name with another optimizer", create(pstest.spec(pb, "w", (4, 3), opt=pb.Optimizer(
        kind=pb.Optimizer.ADAM, learning_rate=1.0),
        init=pb.Initializer(kind=pb.Initializer.CONSTANT, value=2.0))),
        C.ALREADY_EXISTS, "ADAM", "SGD")
    resp = stub.CreateVariable(pb.CreateVariableRequest(spec=pstest.spec(
        pb, "w", (4, 3), lr=1.0,
        init=pb.Initializer(kind=pb.Initializer.CONSTANT, value=2.0))), timeout=5)
    r.check(not resp.created and resp.version == 1,
            "an identical spec is accepted again (created=%s, version %d)"
            % (resp.created, resp.version))
    expect("a pull waiting past its deadline",
           lambda: stub.Pull(pb.PullRequest(items=[pb.PullItem(name="w", min_version=9)]),
                             timeout=0.3),
           C.DEADLINE_EXCEEDED)
    st = stub.Stats(pb.StatsRequest(), timeout=5)
    r.check(st.nonfinite_refused == 3, "Stats counts 3 non-finite gradients (%d)"
            % st.nonfinite_refused)
    r.check(st.bad_requests >= 20, "Stats counts the bad requests (%d)" % st.bad_requests)
    r.check(psd.stop() == 0, "psd exits 0 on SIGTERM")

    # --allow-nonfinite accepts what the default refuses.
    d2 = pstest.start_psd(pstest.tmpdir(), "--allow-nonfinite")
    ch2 = pstest.channel(d2.address)
    s2 = pbg.ParameterServerStub(ch2)
    s2.CreateVariable(pb.CreateVariableRequest(spec=pstest.spec(pb, "w", (2,))), timeout=5)
    resp = s2.Push(pb.PushRequest(grads=[pstest.grad(pb, "w", [np.nan, 1.0])]), timeout=5)
    r.check(list(resp.versions) == [1], "--allow-nonfinite applies a NaN gradient")
    ch2.close()
    d2.stop()
    r.finish()


if __name__ == "__main__":
    main()
