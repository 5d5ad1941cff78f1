"""workerd's run-time pick of OpenBLAS's kernels (worker/backend.h,
ps_backend_cpu_pick_core): OpenBLAS picks by the CPU's family and model
and takes a model it does not know for a Prescott (SSE3 kernels); workerd
then picks by the CPU's features instead and starts again, once.

The oracle is the kernel's own list of the CPU's features (/proc/cpuinfo)
and OpenBLAS's own word on what it runs (OPENBLAS_VERBOSE=2 prints
"Core: NAME" as the library loads): the kernels workerd ends up on must
be at least as wide as the CPU allows; a user's OPENBLAS_CORETYPE is kept;
the loss after a few steps is the same on either kernel (to float32
rounding of a different summation order)."""
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "interop"))
import pstest  # noqa: E402

WORKERD = os.path.join(pstest.BUILD_ROOT, "worker", "workerd")
RANK = {"sandybridge": 1, "haswell": 2, "zen": 2, "skylakex": 3, "cooperlake": 3,
        "sapphirerapids": 3}


def cpu_rank():
    with open("/proc/cpuinfo") as f:
        flags = set(next((ln.split(":", 1)[1].split() for ln in f
                          if ln.startswith("flags")), []))
    if {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= flags:
        return 3, "AVX-512"
    if {"avx2", "fma"} <= flags:
        return 2, "AVX2 and FMA"
    return (1, "AVX") if "avx" in flags else (0, "none of AVX")


def run(coretype=None):
    """workerd --local for a few steps: (its cores as OpenBLAS printed
    them, one per start, the final loss, the pid lines of its log)."""
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_CORETYPE"}
    env["OPENBLAS_VERBOSE"] = "2"
    if coretype is not None:
        env["OPENBLAS_CORETYPE"] = coretype
    p = subprocess.run([WORKERD, "--local", "--steps", "20", "--progress", "0",
                        "--log-level", "info"], capture_output=True, text=True,
                       timeout=120, env=env)
    out = p.stdout + p.stderr
    cores = re.findall(r"^Core: (\S+)", out, re.M)
    loss = re.search(r"done: .* loss ([0-9.]+)", out)
    done = re.findall(r"^worker 0: done", out, re.M)
    return p.returncode, cores, float(loss.group(1)) if loss else None, len(done)


def main():
    r = pstest.Results("blas-core")
    rc, cores, loss, done = run()
    if not cores:
        print("skipped: this workerd has no OpenBLAS (OPENBLAS_VERBOSE printed no core)")
        sys.exit(77)
    want, what = cpu_rank()
    got = RANK.get(cores[-1].lower(), 0)
    r.check(rc == 0 and got >= want and done == 1,
            "workerd runs OpenBLAS's %s kernels on a CPU with %s (OpenBLAS alone took "
            "it for a %s; %d start(s), one run)" % (cores[-1], what, cores[0], len(cores)))
    r.check(len(cores) == (2 if RANK.get(cores[0].lower(), 0) < want else 1),
            "workerd starts again only when OpenBLAS's own pick is narrower: %s" % cores)
    rc2, cores2, loss2, _ = run("Prescott")
    r.check(rc2 == 0 and cores2 == ["Prescott"],
            "a user's OPENBLAS_CORETYPE=Prescott is kept: %s" % cores2)
    r.check(loss is not None and loss2 is not None and abs(loss - loss2) < 1e-3,
            "the loss after 20 steps is the same on %s and Prescott kernels (%s, %s)"
            % (cores[-1], loss, loss2))
    r.finish()


if __name__ == "__main__":
    main()
