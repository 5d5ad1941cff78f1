"""Non-finite results (issue 13 f), against a real psd: the three attacks of
the issue, refused by default with INVALID_ARGUMENT and nothing changed,
and the old behaviour with --allow-nonfinite. numpy's float32 arithmetic is
the oracle for which push overflows and for Adam's values."""
import os
import sys

import grpc
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pstest  # noqa: E402

C = grpc.StatusCode
F32 = np.float32


def adam_ref(grads, lr=0.01, b1=0.9, b2=0.999, eps=1e-7):
    """psd's Adam (server/optim.h) in float32, lr_t in double as psd does."""
    n = len(grads[0])
    lr, b1, b2, eps = F32(lr), F32(b1), F32(b2), F32(eps)
    w, m, v = (np.zeros(n, F32) for _ in range(3))
    for t, g in enumerate(grads, 1):
        g = np.asarray(g, F32)
        lr_t = F32(float(lr) * np.sqrt(1 - float(b2) ** t) / (1 - float(b1) ** t))
        m = b1 * m + (F32(1) - b1) * g
        v = b2 * v + (F32(1) - b2) * g * g
        w = w - lr_t * m / (np.sqrt(v) + eps)
    return w


class Psd(pstest.DensePsd):
    def create(self, name, shape, opt):
        return self.stub.CreateVariable(self.pb.CreateVariableRequest(
            spec=pstest.spec(self.pb, name, shape, opt=opt)), timeout=5)


def refusal(fn):
    """(code, message) of a refused call, or (None, None) if accepted."""
    try:
        fn()
        return None, None
    except grpc.RpcError as e:
        return e.code(), e.details() or ""


def sgd_overflow(r, p, strict):
    """120 pushes of 3.4e38 at lr 0.01 with SGD."""
    opt = p.pb.Optimizer(kind=p.pb.Optimizer.SGD, learning_rate=0.01)
    p.create("big", (2,), opt)
    g = np.full(2, 3.4e38, F32)
    ref = np.zeros(2, F32)
    first_bad = None  # the 1-based push that overflows in float32
    for k in range(1, 121):
        with np.errstate(over="ignore"):
            nxt = ref - F32(0.01) * g
        if first_bad is None and not np.all(np.isfinite(nxt)):
            first_bad = k
        if not strict or first_bad is None:
            ref = nxt
    refused = []
    for k in range(1, 121):
        code, msg = refusal(lambda: p.push("big", g))
        if code is not None:
            refused.append((k, code, msg))
    version, val = p.pull("big")
    if strict:
        r.check(first_bad is not None and refused and refused[0][0] == first_bad,
                "SGD: the push that would overflow is refused: push %s (numpy "
                "says push %s overflows)" % (refused[0][0] if refused else None,
                                             first_bad))
        r.check(all(c == C.INVALID_ARGUMENT for _, c, _ in refused)
                and len(refused) == 120 - first_bad + 1,
                "SGD: it and every later push are INVALID_ARGUMENT (%d refused)"
                % len(refused))
        msg = refused[0][2] if refused else ""
        r.check("'big'" in msg and "element 0" in msg and "non-finite" in msg
                and "--allow-nonfinite" in msg,
                "SGD: the message names the variable and the element: %s" % msg)
        r.check(np.all(np.isfinite(val)) and np.array_equal(val, ref)
                and version == first_bad - 1,
                "SGD: the value stays finite and equal to the last good one "
                "(%s, version %d)" % (val, version))
    else:
        r.check(not refused and np.all(np.isneginf(val)),
                "--allow-nonfinite: SGD takes every push and reaches -inf (%s)" % val)


def adam_overflow(r, p, strict):
    """Adam whose second moment would overflow: g^2 * (1 - beta2) > FLT_MAX."""
    opt = p.pb.Optimizer(kind=p.pb.Optimizer.ADAM, learning_rate=0.01)
    p.create("adam", (2,), opt)
    p.push("adam", [1.0, 1.0])
    before = p.pull("adam")
    code, msg = refusal(lambda: p.push("adam", [1.0, 3e38]))
    after = p.pull("adam")
    p.push("adam", [1.0, 1.0])
    _, later = p.pull("adam")
    if strict:
        r.check(code == C.INVALID_ARGUMENT and "'adam'" in msg and "element 1" in msg,
                "Adam: the overflowing push is INVALID_ARGUMENT naming element 1 "
                "(%s %r)" % (code and code.name, msg))
        r.check(after[0] == before[0] and np.array_equal(after[1], before[1]),
                "Adam: version and value unchanged (%d %s)" % (after[0], after[1]))
        want = adam_ref([[1, 1], [1, 1]])
        r.check(np.allclose(later, want, rtol=1e-6, atol=0),
                "Adam: slots unchanged and the element still moves: the next "
                "push gives %s, Adam from untouched slots gives %s" % (later, want))
    else:
        r.check(code is None, "--allow-nonfinite: Adam takes the overflowing push")
        r.check(later[1] == after[1][1] and later[0] != after[1][0],
                "--allow-nonfinite: element 1 never moves again (%s then %s)"
                % (after[1], later))


def main():
    pb, pbg, _, _ = pstest.generate_stubs()
    r = pstest.Results("psd-nonfinite")

    p = Psd(pb, pbg)
    code, msg = refusal(lambda: p.create("huge", (2,), pb.Optimizer(
        kind=pb.Optimizer.SGD, learning_rate=1e38)))
    r.check(code == C.INVALID_ARGUMENT and "learning_rate" in msg
            and "1e+38" in msg and "1000" in msg,
            "a learning rate of 1e38 is refused at create, naming the field, "
            "the value and the bound (%s %r)" % (code and code.name, msg))
    code, _ = refusal(lambda: p.pull("huge"))
    r.check(code == C.NOT_FOUND, "... and no variable was made")
    sgd_overflow(r, p, True)
    adam_overflow(r, p, True)
    st = p.stub.Stats(pb.StatsRequest(), timeout=5)
    r.check(st.nonfinite_refused >= 21, "Stats counts the refused updates (%d)"
            % st.nonfinite_refused)
    r.check(p.stop() == 0, "psd exits 0 on SIGTERM")

    p = Psd(pb, pbg, "--allow-nonfinite")
    sgd_overflow(r, p, False)
    adam_overflow(r, p, False)
    p.stop()
    r.finish()


if __name__ == "__main__":
    main()
