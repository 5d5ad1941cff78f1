"""A DLRM-style model on synthetic Zipf(1.1) click data (examples/
dlrm_data.py: 26 categorical features over 10^8 ids each, 13 dense, labels
from a hidden logistic model), trained two ways in the same run:

  psd          2 processes (examples/dlrm.py): the embedding rows on psd
               (2 shards on 127.0.0.1:0, psclient.torch.ShardedEmbedding,
               Adagrad on the server, the next batch prefetched), the MLPs
               all-reduced with torch.distributed gloo;
  in-process   one process, the same model with nn.EmbeddingBag (sparse
               gradients, torch's Adagrad) over a table of exactly the ids
               the data holds, and the same Adam for the MLPs.

Then once more the psd way with each psd in a cgroup v1 memory cgroup of
half the bytes its tables took in the first psd run (--memory-limit the
same; needs root, skipped with one line otherwise).

    /usr/bin/python3 bench/dlrm.py BUILD [--quick] [--no-cgroup]

--quick: 200,000 training examples (full: 1,000,000), 50,000 test. The
last line: "dlrm: psd X ex/s = R of in-process torch; AUC a vs b" (a psd's,
b in-process; the AUCs should lie within 0.005).
"""
import json
import os
import subprocess
import sys
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
ARGS = [a for a in sys.argv[1:] if not a.startswith("--")]
if ARGS:
    os.environ["PS_BUILD_ROOT"] = os.path.abspath(ARGS[0])
sys.path.insert(0, os.path.join(ROOT, "tests", "python"))
sys.path.insert(0, os.path.join(ROOT, "examples"))
import pyenv  # noqa: E402

pyenv.reexec()

import numpy as np  # noqa: E402
import torch  # noqa: E402

import dlrm  # noqa: E402  (examples/dlrm.py)
import dlrm_data  # noqa: E402
import pstest  # noqa: E402
from psclient import Client  # noqa: E402
from psclient.embedding import table_keys  # noqa: E402

QUICK = "--quick" in sys.argv
N_TRAIN = 200_000 if QUICK else 1_000_000
N_TEST = 50_000
CG_ROOT = "/sys/fs/cgroup/memory"


class LocalEmb(torch.nn.Module):
    """nn.EmbeddingBag over the compact index of the data's (feature, id)
    keys; rows uniform in +-1/sqrt(DIM) as psd's table."""

    def __init__(self, rows):
        super().__init__()
        self.bag = torch.nn.EmbeddingBag(rows, dlrm.DIM, mode="sum", sparse=True)
        b = dlrm.DIM ** -0.5
        with torch.no_grad():
            self.bag.weight.uniform_(-b, b)

    def forward(self, idx):
        return self.bag(idx.reshape(-1, 1)).view(idx.shape[0], idx.shape[1], dlrm.DIM)


def in_process(cat, dense, label):
    keys = table_keys(cat, hash_salt=list(range(dlrm_data.CATEGORICAL)))
    uniq = np.unique(keys)
    idx = np.searchsorted(uniq, keys)
    model = dlrm.DLRM(LocalEmb(len(uniq)))
    eopt = torch.optim.Adagrad(model.emb.parameters(), lr=dlrm.EMB_LR,
                               initial_accumulator_value=dlrm.ACC0, eps=dlrm.EPS)
    mopt = torch.optim.Adam(model.mlp_parameters(), lr=dlrm.MLP_LR)
    lossf = torch.nn.BCEWithLogitsLoss()
    t0 = time.monotonic()
    for k in range(0, N_TRAIN, dlrm.BATCH):
        s = slice(k, min(k + dlrm.BATCH, N_TRAIN))
        loss = lossf(model(torch.from_numpy(idx[s]), torch.from_numpy(dense[s])),
                     torch.from_numpy(label[s]))
        eopt.zero_grad()
        mopt.zero_grad()
        loss.backward()
        eopt.step()
        mopt.step()
    took = time.monotonic() - t0
    p = dlrm.predict(model, idx[N_TRAIN:], dense[N_TRAIN:])
    return {"auc": dlrm_data.auc(label[N_TRAIN:], p), "examples_per_second": N_TRAIN / took,
            "seconds": took, "rows": len(uniq)}


def cgroup_wrapper(name, limit):
    cg = os.path.join(CG_ROOT, name)
    os.mkdir(cg)
    with open(os.path.join(cg, "memory.limit_in_bytes"), "w") as f:
        f.write(str(limit))
    return cg, ["/bin/sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', cg]


def read_cg(cg, name):
    with open(os.path.join(cg, name)) as f:
        return f.read().strip()


def psd_run(data, label, limit=0):
    """Two psd shards (each in a memory cgroup of `limit` bytes when
    given) and the 2 processes of examples/dlrm.py; returns rank 0's
    result, with each shard's table bytes (LMDB in use)."""
    cgs, shards = [], []
    for k in range(2):
        wrapper = None
        args = []
        if limit:
            cg, wrapper = cgroup_wrapper("psd-dlrm-%d-%d" % (os.getpid(), k), limit)
            cgs.append(cg)
            args = ["--memory-limit", str(limit)]
        shards.append(pstest.start_psd(pstest.tmpdir("dlrm-psd-"), *args, wrapper=wrapper))
    addrs = ",".join(s.address for s in shards)
    out = os.path.join(pstest.tmpdir("dlrm-out-"), "rank0.json")
    port = pstest.free_port()
    example = os.path.join(ROOT, "examples", "dlrm.py")
    procs = [subprocess.Popen([sys.executable, example, "--psd", addrs, "--data", data,
                               "--test", str(N_TEST), "--rank", str(r), "--world", "2",
                               "--master", "127.0.0.1:%d" % port, "--out", out])
             for r in range(2)]
    try:
        rcs = [p.wait(timeout=3600) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    with Client(addrs.split(",")) as c:
        st = c.stats()
    alive = all(s.proc.poll() is None for s in shards)
    res = json.load(open(out)) if rcs == [0, 0] and os.path.exists(out) else None
    # The rows' bytes are in the segment files; LMDB holds their catalog
    # (written behind the applies, so nearly empty right after a run).
    info = {"table_bytes": [int(s.sparse_disk_bytes + s.sparse_segment_live_bytes)
                            for s in st],
            "rows": sum(int(s.sparse_rows) for s in st), "alive": alive, "rcs": rcs}
    for cg in cgs:
        info.setdefault("max_usage", []).append(int(read_cg(cg, "memory.max_usage_in_bytes")))
        info.setdefault("failcnt", []).append(int(read_cg(cg, "memory.failcnt")))
    for s in shards:
        s.stop()
    for cg in cgs:
        pstest.rmdir_soon(cg)
    print("%s: %s %s" % (label, json.dumps(res), json.dumps(info)), flush=True)
    return res, info


def main():
    t0 = time.monotonic()
    cat, dense, label = dlrm_data.generate(N_TRAIN + N_TEST, seed=1)
    data = os.path.join(pstest.tmpdir("dlrm-data-"), "clicks.npz")
    np.savez(data, cat=cat, dense=dense, label=label)
    print("data: %d train + %d test examples, click rate %.3f, made in %.1f s"
          % (N_TRAIN, N_TEST, label.mean(), time.monotonic() - t0), flush=True)
    ref = in_process(cat, dense, label)
    print("in-process torch: AUC %.4f, %.0f ex/s (%d rows)"
          % (ref["auc"], ref["examples_per_second"], ref["rows"]), flush=True)
    res, info = psd_run(data, "psd")
    if res is None:
        sys.exit("dlrm: the psd run failed (exit %s)" % info["rcs"])
    print("psd: AUC %.4f, %.0f ex/s, %d rows, tables %s MiB per shard"
          % (res["auc"], res["examples_per_second"], info["rows"],
             [b >> 20 for b in info["table_bytes"]]), flush=True)
    if "--no-cgroup" in sys.argv:
        print("skip: cgroup run (--no-cgroup)")
    elif os.geteuid() != 0 or not os.access(CG_ROOT, os.W_OK):
        print("skip: cgroup run: needs root and a writable %s" % CG_ROOT)
    else:
        limit = max(32 << 20, min(info["table_bytes"]) // 2)
        cres, cinfo = psd_run(data, "psd-cgroup", limit)
        if cres is None:
            print("psd in a %d MiB cgroup: FAILED (exit %s, psd alive %s)"
                  % (limit >> 20, cinfo["rcs"], cinfo["alive"]))
        else:
            print("psd in a %d MiB memory cgroup per shard (tables %s MiB): AUC %.4f, "
                  "%.0f ex/s, peak %s MiB, failcnt %s, psd alive %s"
                  % (limit >> 20, [b >> 20 for b in cinfo["table_bytes"]], cres["auc"],
                     cres["examples_per_second"], [m >> 20 for m in cinfo["max_usage"]],
                     cinfo["failcnt"], cinfo["alive"]), flush=True)
    print("dlrm: psd %.0f ex/s = %.2f of in-process torch; AUC %.4f vs %.4f"
          % (res["examples_per_second"], res["examples_per_second"] / ref["examples_per_second"],
             res["auc"], ref["auc"]))


if __name__ == "__main__":
    main()
