"""A DLRM-style click model trained the hybrid way: its 26 embedding
tables' rows on psd (psclient.torch.ShardedEmbedding, the update on the
server), its MLPs all-reduced between the processes with torch.distributed
(gloo), as TorchRec and PERSIA split a recommendation model.

One process of a job of WORLD (start one per rank, or let bench/dlrm.py
start them):

    build/server/psd --data-dir /tmp/psd0 --listen 127.0.0.1:7070 &
    python3 examples/dlrm_data.py /tmp/clicks.npz 200000
    python3 examples/dlrm.py --psd 127.0.0.1:7070 --data /tmp/clicks.npz \\
        --rank 0 --world 1 --master 127.0.0.1:29500

(psclient installed, e.g. `pip install ./python`; Debian's python3-torch.)
The 26 features share one sparse table, apart by a hash salt per feature;
every id of 10^8 has its row only once it is pushed. Each global batch is
split over the ranks; a rank's loss is its part of the batch's mean, so
that the all-reduced (summed) MLP gradients and the pushed row gradients
are the global batch's. Rank 0 writes the test AUC and the examples per
second of the job (--out, JSON).
"""
import argparse
import json
import os
import sys
import time

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import dlrm_data  # noqa: E402

DIM = 16
BATCH = 2048
EMB_LR = 1.0
MLP_LR = 3e-3
ACC0 = 0.1
EPS = 1e-8


class DLRM(torch.nn.Module):
    """Bottom MLP of the dense features, pairwise dot products of it and the
    26 embeddings, top MLP to a logit. emb maps (B, 26) ids to (B, 26, DIM)."""

    def __init__(self, emb, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.emb = emb
        self.bottom = torch.nn.Sequential(torch.nn.Linear(dlrm_data.DENSE, 64), torch.nn.ReLU(),
                                          torch.nn.Linear(64, DIM), torch.nn.ReLU())
        n = dlrm_data.CATEGORICAL + 1
        self.iu = torch.triu_indices(n, n, offset=1)
        self.top = torch.nn.Sequential(torch.nn.Linear(DIM + n * (n - 1) // 2, 64),
                                       torch.nn.ReLU(), torch.nn.Linear(64, 1))

    def forward(self, cat, dense):
        b = self.bottom(dense)
        z = torch.cat([b[:, None, :], self.emb(cat)], 1)           # (B, 27, DIM)
        inter = torch.bmm(z, z.transpose(1, 2))[:, self.iu[0], self.iu[1]]
        return self.top(torch.cat([b, inter], 1)).squeeze(1)

    def mlp_parameters(self):
        return list(self.bottom.parameters()) + list(self.top.parameters())


def table(seed=7):
    """The one sparse table of the 26 features (Adagrad on psd)."""
    from psclient import Initializer, Optimizer, SparseTable
    b = DIM ** -0.5
    return SparseTable("dlrm", DIM, Initializer.uniform(-b, b, seed=seed),
                       optimizer=Optimizer.adagrad(EMB_LR, ACC0, EPS))


def predict(model, cat, dense, batch=8192):
    out = []
    with torch.no_grad():
        for k in range(0, len(cat), batch):
            out.append(torch.sigmoid(model(torch.from_numpy(cat[k:k + batch]),
                                           torch.from_numpy(dense[k:k + batch]))).numpy())
    return np.concatenate(out)


def main():
    ap = argparse.ArgumentParser(description="one rank of the hybrid DLRM job")
    ap.add_argument("--psd", required=True, help="psd shards, comma-separated")
    ap.add_argument("--data", required=True, help="npz of examples/dlrm_data.py")
    ap.add_argument("--test", type=int, default=0, help="last N examples are the test set")
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--world", type=int, default=1)
    ap.add_argument("--master", default="127.0.0.1:29500")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", help="rank 0: JSON with auc, examples_per_second")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    import datetime
    import torch.distributed as dist
    from psclient import Client
    from psclient.torch import ShardedEmbedding

    d = np.load(a.data)
    cat, dense, label = d["cat"], d["dense"], d["label"]
    n_train = len(cat) - a.test
    dist.init_process_group("gloo", init_method="tcp://" + a.master, rank=a.rank,
                            world_size=a.world, timeout=datetime.timedelta(seconds=300))
    client = Client(a.psd.split(","), worker=a.rank)
    emb = ShardedEmbedding(client, table(), hash_salt=list(range(dlrm_data.CATEGORICAL)))
    model = DLRM(emb)
    opt = torch.optim.Adam(model.mlp_parameters(), lr=MLP_LR)
    lossf = torch.nn.BCEWithLogitsLoss(reduction="sum")
    per = BATCH // a.world

    def part(k):
        lo = k + a.rank * per
        return slice(lo, min(lo + per, n_train))
    starts = [k for k in range(0, n_train, BATCH)]
    dist.barrier()
    t0 = time.monotonic()
    for _ in range(a.epochs):
        emb.prefetch(torch.from_numpy(cat[part(starts[0])]))
        for i, k in enumerate(starts):
            s = part(k)
            n_global = min(BATCH, n_train - k)
            x = torch.from_numpy(cat[s])
            if i + 1 < len(starts):
                nxt = torch.from_numpy(cat[part(starts[i + 1])])
            logits = model(x, torch.from_numpy(dense[s]))
            if i + 1 < len(starts):
                emb.prefetch(nxt)     # the next batch's rows, while this one computes
            loss = lossf(logits, torch.from_numpy(label[s])) / n_global
            opt.zero_grad()
            loss.backward()           # pushes the rows' gradient to psd
            for p in model.mlp_parameters():
                dist.all_reduce(p.grad)
            opt.step()
    dist.barrier()
    took = time.monotonic() - t0
    emb.close()
    if a.rank == 0:
        p = predict(model, cat[n_train:], dense[n_train:])
        res = {"auc": dlrm_data.auc(label[n_train:], p),
               "examples_per_second": a.epochs * n_train / took, "seconds": took}
        print("rank 0: AUC %.4f, %.0f ex/s" % (res["auc"], res["examples_per_second"]),
              flush=True)
        if a.out:
            with open(a.out, "w") as f:
                json.dump(res, f)
    dist.barrier()
    dist.destroy_process_group()
    client.close()


if __name__ == "__main__":
    main()
