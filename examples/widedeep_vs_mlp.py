#!/usr/bin/env python3
"""Trains a model through the local cluster (deploy/localcluster.py) on
Fashion-MNIST and prints its test accuracy: the wide-and-deep model on
psd's sparse tables beside the MLP (doc/sparse.md, "Wide and deep").

    /usr/bin/python3 examples/widedeep_vs_mlp.py BUILD_DIR [--model widedeep]
        [--epochs 5] [--ps 2] [--workers 1]

One line per model: `MODEL: test accuracy A after E epochs (S s)`, and for
widedeep the rows its tables hold on each shard.
"""
import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                                "deploy"))
from localcluster import LocalCluster  # noqa: E402


def run(build, model, epochs, ps, workers, extra):
    with tempfile.TemporaryDirectory(prefix="widedeep-") as root:
        c = LocalCluster(build, root, num_ps=ps, num_workers=workers, evaluator=False,
                         model=model, epochs=epochs, worker_args=extra)
        t0 = time.monotonic()
        try:
            c.start()
            res = c.wait_workers(timeout=3600)
            rows = table_rows(c) if model.startswith("widedeep") else None
        finally:
            c.stop()
        accs = []
        for i, (rc, summary) in sorted(res.items()):
            if rc != 0 or summary is None:
                sys.exit("%s: worker %d exited %s; log in %s" % (model, i, rc, root))
            accs.append(summary["test_accuracy"])
        print("%s: test accuracy %.4f after %d epochs (%.0f s)%s" %
              (model, accs[0], epochs, time.monotonic() - t0,
               "; table rows per shard %s" % rows if rows else ""), flush=True)


def table_rows(c):
    """Stats.sparse_rows of each shard (both tables)."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                                    "tests", "interop"))
    import pstest  # noqa: E402
    try:
        pb, pbg, _, _ = pstest.generate_stubs()
    except ImportError as e:  # grpc_tools: Debian's python3-grpc-tools
        return "unknown (%s)" % e
    rows = []
    for port in c.ps_ports:
        ch = c.channel("127.0.0.1:%d" % port)
        try:
            rows.append(pbg.ParameterServerStub(ch).Stats(pb.StatsRequest(),
                                                          timeout=10).sparse_rows)
        finally:
            ch.close()
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("--model", action="append",
                    help="model spec (repeatable; default: widedeep and mlp:784-256-256-10)")
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--ps", type=int, default=2)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--limit", type=int, default=0, help="training examples (0 = all)")
    a = ap.parse_args()
    extra = ["--limit", str(a.limit)] if a.limit else []
    for m in a.model or ["widedeep", "mlp:784-256-256-10"]:
        run(a.build, m, a.epochs, a.ps, a.workers, extra)


if __name__ == "__main__":
    main()
