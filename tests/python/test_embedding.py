"""psclient.torch.ShardedEmbeddingBag and ShardedEmbedding against real psd
on 127.0.0.1:0 (2 shards), with Debian's python3-torch, torch's own layers
and optimizers as the oracle (the reference table starts from the rows psd
answers for the same ids, so that the two start equal):

  sgd       a bag layer (sum, per_sample_weights, ids over all of int64)
            and a Linear trained 6 steps with SGD: every step's output and
            in the end every row equal nn.EmbeddingBag + torch.optim.SGD's
            to float32 rounding; each step pulls each shard once and pushes
            each unique id once (Stats);
  adagrad   mode mean with a padding id, Adagrad on psd and torch.optim.
            Adagrad on the reference, the same; the padding row is never
            stored;
  offsets   1-D ids with offsets (an empty bag among them), mode mean: the
            output and the rows after a step equal nn.EmbeddingBag's;
  shared    ShardedEmbedding of [batch, 3] ids, three features sharing one
            table through per-feature offsets, against nn.Embedding; then
            two features sharing one through hash salts keep apart rows;
  prefetch  the sgd run with each next batch prefetched: the same values
            (rows pushed after a prefetch began are pulled again);
  loader    batches from a DataLoader with 2 worker processes: the same;
  gloo      2 processes, the Linear all-reduced with torch.distributed
            (gloo) and the table on psd: both end with the same Linear, and
            the rows and Linear equal one process applying both workers'
            gradients per step;
  badinput  float and int16 ids are a TypeError naming the dtype with
            nothing sent; a table of another dim is one line naming both;
            with psd killed mid-epoch the next step retries within the
            client's budget and raises PsError naming the shard's address.

Prints ok/FAIL per check and "python-embedding: N passed, N failed"; exits
77 (skip) with one line where torch is missing. EMB_ONLY=NAME runs one part
(EMB_TIMES=N times; gloo only keeps its tables apart between repeats).
"""
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import pyenv  # noqa: E402

pyenv.reexec()

import numpy as np  # noqa: E402

import pstest  # noqa: E402

torch = pyenv.import_torch()

from psclient import Client, Initializer, Optimizer, PsError, Retry, SparseTable  # noqa: E402
from psclient.torch import ShardedEmbedding, ShardedEmbeddingBag  # noqa: E402

r = pstest.Results("python-embedding")
DIM, B, N, STEPS = 8, 16, 5, 6
torch.manual_seed(0)
torch.set_num_threads(1)


def psd():
    return pstest.Daemon([pstest.psd_path(), "--data-dir", pstest.tmpdir("pyemb-"),
                          "--listen", "127.0.0.1:0", "--log-level", "warn"])


def close(a, b, rtol=1e-5, atol=1e-6):
    a = a.detach().numpy() if isinstance(a, torch.Tensor) else np.asarray(a)
    b = b.detach().numpy() if isinstance(b, torch.Tensor) else np.asarray(b)
    return a.shape == b.shape and bool(np.allclose(a, b, rtol=rtol, atol=atol))


def batches(universe, seed, steps=STEPS, psw=False, pad=None):
    """Bags of ids drawn from universe (repeats within and across bags),
    targets, and per-sample weights."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(steps):
        ids = rng.choice(universe, (B, N))
        if pad is not None:
            ids[rng.random((B, N)) < 0.3] = pad
        w = rng.uniform(0.5, 1.5, (B, N)).astype(np.float32) if psw else None
        y = rng.standard_normal((B, 1)).astype(np.float32)
        out.append((torch.from_numpy(ids), None if w is None else torch.from_numpy(w),
                    torch.from_numpy(y)))
    return out


class Ref(torch.nn.Module):
    """torch's own layer over the universe's rows (as psd starts them)."""

    def __init__(self, universe, rows, lin, mode, pad_index=None):
        super().__init__()
        self.universe = np.asarray(universe)
        self.order = np.argsort(self.universe)
        self.emb = torch.nn.EmbeddingBag(len(universe), DIM, mode=mode, padding_idx=pad_index)
        with torch.no_grad():
            self.emb.weight.copy_(torch.from_numpy(rows))
            if pad_index is not None:
                self.emb.weight[pad_index] = 0
        self.lin = lin

    def index(self, ids):
        u = self.universe[self.order]
        return torch.from_numpy(self.order[np.searchsorted(u, ids.numpy())])

    def forward(self, ids, psw=None):
        return self.lin(self.emb(self.index(ids), per_sample_weights=psw))


def linear(seed):
    torch.manual_seed(seed)
    return torch.nn.Linear(DIM, 1)


def copy_of(lin):
    c = torch.nn.Linear(lin.in_features, lin.out_features)
    c.load_state_dict(lin.state_dict())
    return c


def train_pair(c, table, opt, torch_opt, mode, data, universe, pad=None, prefetch=False,
               psw=False, label=""):
    """Trains the psd model and the reference on data; checks each step's
    output and the rows at the end."""
    emb = ShardedEmbeddingBag(c, table, mode=mode, padding_idx=pad, optimizer=opt)
    lin = linear(1)
    pad_index = None
    if pad is not None:
        pad_index = int(np.flatnonzero(np.asarray(universe) == pad)[0])
    rows = c.sparse_pull({table.name: np.asarray(universe)})[table.name]
    ref = Ref(universe, rows, copy_of(lin), mode, pad_index)
    dense_opt = torch_opt(lin.parameters())
    ref_opt = torch_opt(ref.parameters())
    same = True
    for k, (ids, w, y) in enumerate(data):
        if prefetch and k == 0:
            emb.prefetch(ids)
        out = lin(emb(ids, per_sample_weights=w))
        if prefetch and k + 1 < len(data):
            emb.prefetch(data[k + 1][0])
        want = ref(ids, w)
        same &= close(out, want)
        dense_opt.zero_grad()
        ref_opt.zero_grad()
        torch.nn.functional.mse_loss(out, y).backward()
        torch.nn.functional.mse_loss(want, y).backward()
        dense_opt.step()
        ref_opt.step()
    emb.close()
    keep = np.asarray(universe) != pad if pad is not None else slice(None)
    got = c.sparse_pull({table.name: np.asarray(universe)[keep]})[table.name]
    rows_ok = close(got, ref.emb.weight.detach().numpy()[keep])
    r.check(same and rows_ok and close(lin.weight, ref.lin.weight),
            "%s: %d steps' outputs, the rows and the Linear equal torch's to float32 rounding"
            " (max row diff %.2g)" % (label, len(data), float(np.max(np.abs(
                got - ref.emb.weight.detach().numpy()[keep])))))
    return emb


def universe_of(seed, n=40):
    rng = np.random.default_rng(seed)
    u = np.unique(np.concatenate([rng.integers(-2 ** 63, 2 ** 63 - 1, n - 4, dtype=np.int64),
                                  np.array([0, 1, -1, 2 ** 63 - 1], np.int64)]))
    return u


def test_sgd(c):
    u = universe_of(1)
    t = SparseTable("bag_sgd", DIM, Initializer.uniform(-0.5, 0.5, seed=7))
    data = batches(u, 2, psw=True)
    before = [s.sparse_rows_pushed for s in c.stats()]
    pulls = [s.sparse_rows_pulled for s in c.stats()]
    train_pair(c, t, Optimizer.sgd(0.1), lambda p: torch.optim.SGD(p, lr=0.1), "sum", data, u,
               psw=True, label="sgd")
    pushed = sum(s.sparse_rows_pushed for s in c.stats()) - sum(before)
    pulled = sum(s.sparse_rows_pulled for s in c.stats()) - sum(pulls)
    uniq = sum(len(np.unique(ids.numpy())) for ids, _, _ in data)
    # The final check pulls len(u) rows and the reference's start len(u).
    r.check(pushed == uniq and pulled == uniq + 2 * len(u),
            "sgd: each step pulls and pushes each unique id once (%d rows pushed, %d pulled; "
            "%d unique ids in %d ids)" % (pushed, pulled - 2 * len(u), uniq, STEPS * B * N))


def test_adagrad(c):
    u = universe_of(3)
    pad = int(u[5])
    t = SparseTable("bag_ada", DIM, Initializer.uniform(-0.5, 0.5, seed=8))
    data = batches(u, 4, pad=pad)
    stored = sum(s.sparse_rows for s in c.stats())
    train_pair(c, t, Optimizer.adagrad(0.1, 0.1, 1e-10),
               lambda p: torch.optim.Adagrad(p, lr=0.1, initial_accumulator_value=0.1,
                                             eps=1e-10),
               "mean", data, u, pad=pad, label="adagrad (mean, padding_idx)")
    seen = np.unique(np.concatenate([ids.numpy().reshape(-1) for ids, _, _ in data]))
    added = sum(s.sparse_rows for s in c.stats()) - stored
    r.check(pad in seen and added == len(seen) - 1,
            "adagrad: the padding id's row was never pushed (%d rows stored for %d ids "
            "besides it)" % (added, len(seen) - 1))


def test_offsets(c):
    u = universe_of(13)
    rng = np.random.default_rng(14)
    t = SparseTable("bag_off", DIM, Initializer.uniform(-0.5, 0.5, seed=15))
    emb = ShardedEmbeddingBag(c, t, mode="mean", optimizer=Optimizer.sgd(0.1))
    ref = Ref(u, c.sparse_pull({"bag_off": u})["bag_off"], None, "mean")
    opt = torch.optim.SGD(ref.emb.parameters(), lr=0.1)
    ids = torch.from_numpy(rng.choice(u, 20))
    offsets = torch.tensor([0, 3, 3, 10, 15])              # bag 1 is empty
    out = emb(ids, offsets)
    want = ref.emb(ref.index(ids), offsets)
    same = close(out, want) and out.shape == (5, DIM)
    out.square().sum().backward()
    want.square().sum().backward()
    opt.step()
    got = c.sparse_pull({"bag_off": u})["bag_off"]
    r.check(same and close(got, ref.emb.weight),
            "offsets: 1-D ids with offsets (an empty bag among them), mode mean: the output "
            "and the rows after a step equal nn.EmbeddingBag's")


def test_shared(c):
    rng = np.random.default_rng(5)
    offsets = np.array([0, 1 << 40, 2 << 40], np.int64)
    t = SparseTable("shared", DIM, Initializer.uniform(-0.5, 0.5, seed=9))
    emb = ShardedEmbedding(c, t, offset=offsets, optimizer=Optimizer.sgd(0.2))
    ids = [torch.from_numpy(rng.integers(0, 30, (B, 3))) for _ in range(4)]
    keys = np.unique(np.concatenate([(i.numpy() + offsets).reshape(-1) for i in ids]))
    rows = c.sparse_pull({"shared": keys})["shared"]
    ref = torch.nn.Embedding(len(keys), DIM)
    with torch.no_grad():
        ref.weight.copy_(torch.from_numpy(rows))
    lin = torch.nn.Linear(3 * DIM, 1)
    rlin = copy_of(lin)
    o1 = torch.optim.SGD(lin.parameters(), lr=0.2)
    o2 = torch.optim.SGD(list(ref.parameters()) + list(rlin.parameters()), lr=0.2)
    same = True
    for x in ids:
        out = lin(emb(x).reshape(B, -1))
        want = rlin(ref(torch.from_numpy(np.searchsorted(keys, x.numpy() + offsets)))
                    .reshape(B, -1))
        same &= close(out, want) and emb(x).shape == (B, 3, DIM)
        o1.zero_grad()
        o2.zero_grad()
        out.square().mean().backward()
        want.square().mean().backward()
        o1.step()
        o2.step()
    got = c.sparse_pull({"shared": keys})["shared"]
    r.check(same and close(got, ref.weight),
            "shared: 3 features in one table by offsets: ShardedEmbedding equals nn.Embedding "
            "(outputs and %d rows)" % len(keys))
    h = ShardedEmbedding(c, t, hash_salt=[11, 12], optimizer=Optimizer.sgd(0.2))
    x = torch.tensor([[4, 4]])
    v = h(x)
    r.check(v.shape == (1, 2, DIM) and not torch.equal(v[0, 0], v[0, 1]),
            "shared: the same id in two features with other hash salts has two rows")


def test_loader(c):
    u = universe_of(6)
    data = batches(u, 7)

    class DS(torch.utils.data.Dataset):
        def __len__(self):
            return len(data)

        def __getitem__(self, i):
            return data[i][0], data[i][2]
    loader = torch.utils.data.DataLoader(DS(), batch_size=None, num_workers=2)
    got = [(ids, None, y) for ids, y in loader]
    r.check(len(got) == len(data), "loader: a DataLoader with 2 worker processes gave %d batches"
            % len(got))
    t = SparseTable("bag_loader", DIM, Initializer.uniform(-0.5, 0.5, seed=10))
    # The loader's batches again, read as the loop reads them: iterating
    # the DataLoader inside the training loop, with psd's calls in between.
    it = iter(torch.utils.data.DataLoader(DS(), batch_size=None, num_workers=2))
    live = [(ids, None, y) for ids, y in it]
    train_pair(c, t, Optimizer.sgd(0.1), lambda p: torch.optim.SGD(p, lr=0.1), "sum", live, u,
               label="loader (2 DataLoader workers)")


GLOO_RUNS = []


def gloo_worker(rank, port, addrs, out, table):
    """One of 2 processes: the Linear all-reduced with gloo, the table on
    psd; writes its Linear and the ids it saw."""
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % port, rank=rank,
                            world_size=2, timeout=__import__("datetime").timedelta(seconds=60))
    c = Client(addrs.split(","), worker=rank)
    emb = ShardedEmbeddingBag(c, SparseTable(table, DIM, Initializer.uniform(
        -0.5, 0.5, seed=11)), mode="sum", optimizer=Optimizer.sgd(0.1))
    lin = linear(1)
    opt = torch.optim.SGD(lin.parameters(), lr=0.1)
    u = universe_of(12)
    data = batches(u, 100 + rank)
    for ids, _, y in data:
        out_ = lin(emb(ids))
        # Both have pulled step t's rows before either pushes step t's
        # gradient (else a fast worker's push of step t+1 could reach the
        # slow one's pull of t+1: the asynchrony of a parameter server,
        # which would make the result depend on timing).
        dist.barrier()
        opt.zero_grad()
        torch.nn.functional.mse_loss(out_, y).backward()   # pushes the rows' gradient
        for p in lin.parameters():
            dist.all_reduce(p.grad)
            p.grad /= 2
        opt.step()
    np.save(out, np.concatenate([lin.weight.detach().numpy().reshape(-1),
                                 lin.bias.detach().numpy()]))
    dist.barrier()
    dist.destroy_process_group()
    c.close()


def test_gloo(c, addrs):
    u = universe_of(12)
    name = "bag_gloo%d" % len(GLOO_RUNS)
    GLOO_RUNS.append(name)
    t = SparseTable(name, DIM, Initializer.uniform(-0.5, 0.5, seed=11))
    c.create_sparse_tables([t], optimizer=Optimizer.sgd(0.1))
    rows = c.sparse_pull({name: u})[name]
    port = pstest.free_port()
    d = pstest.tmpdir("pyemb-gloo-")
    outs = [os.path.join(d, "lin%d.npy" % k) for k in range(2)]
    procs = [subprocess.Popen([sys.executable, __file__, "gloo-worker", str(k), str(port),
                               ",".join(addrs), outs[k], name]) for k in range(2)]
    rcs = []
    for p in procs:
        try:
            rcs.append(p.wait(timeout=180))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
            rcs.append("timeout")
    if rcs != [0, 0]:
        r.check(False, "gloo: the 2 processes exited %s" % rcs)
        return
    lins = [np.load(o) for o in outs]
    # One process applying both workers' gradients per step.
    ref = Ref(u, rows, linear(1), "sum")
    da, db = batches(u, 100), batches(u, 101)
    for (ia, _, ya), (ib, _, yb) in zip(da, db):
        ref.zero_grad()
        torch.nn.functional.mse_loss(ref(ia), ya).backward()
        ga = [p.grad.clone() for p in ref.parameters()]
        ref.zero_grad()
        torch.nn.functional.mse_loss(ref(ib), yb).backward()
        with torch.no_grad():
            ref.emb.weight -= 0.1 * (ga[0] + ref.emb.weight.grad)
            for p, g in zip(list(ref.lin.parameters()), ga[1:]):
                p -= 0.1 * (g + p.grad) / 2
    want = np.concatenate([ref.lin.weight.detach().numpy().reshape(-1),
                           ref.lin.bias.detach().numpy()])
    got = c.sparse_pull({name: u})[name]
    r.check(np.array_equal(lins[0], lins[1]) and close(lins[0], want)
            and close(got, ref.emb.weight),
            "gloo: 2 processes (Linear all-reduced, table on psd) end with the same Linear, "
            "and it and the rows equal one process applying both workers' gradients (Linear "
            "diff %.2g, %.2g; rows %.2g)" % (float(np.max(np.abs(lins[0] - lins[1]))),
                                             float(np.max(np.abs(lins[0] - want))),
                                             float(np.max(np.abs(got - ref.emb.weight
                                                                 .detach().numpy())))))


def test_badinput(c, d1):
    emb = ShardedEmbeddingBag(c, SparseTable("bad", DIM), mode="sum")
    pulled = [s.sparse_rows_pulled for s in c.stats()]
    for what, x in (("float ids", torch.tensor([[1.0, 2.0]])),
                    ("int16 ids", torch.tensor([[1, 2]], dtype=torch.int16))):
        try:
            emb(x)
            r.check(False, "badinput: %s are refused" % what)
        except TypeError as e:
            r.check("dtype" in str(e) and "'bad'" in str(e),
                    "badinput: %s are a TypeError: %s" % (what, e))
    r.check([s.sparse_rows_pulled for s in c.stats()] == pulled,
            "badinput: nothing was sent for them")
    try:
        ShardedEmbeddingBag(c, SparseTable("bad", DIM * 2))
        r.check(False, "badinput: a layer of another dim than its table is refused")
    except ValueError as e:
        m = str(e)
        r.check("\n" not in m and "dim %d" % DIM in m and "dim is %d" % (2 * DIM) in m,
                "badinput: a layer of another dim than its table: %s" % m)
    # psd dies mid-epoch: a client with a 3 s budget gives up naming it.
    c2 = Client([d1.address], retry=Retry(initial=0.1, maximum=0.5, budget=3.0), timeout=5)
    e2 = ShardedEmbeddingBag(c2, SparseTable("dies", DIM), mode="sum")
    x = torch.tensor([[1, 2, 3]])
    e2(x).sum().backward()
    d1.kill()
    t0 = time.monotonic()
    try:
        e2(x).sum().backward()
        r.check(False, "badinput: a step with its psd dead raises")
    except PsError as e:
        took = time.monotonic() - t0
        r.check(d1.address in str(e) and 2.0 <= took <= 15,
                "badinput: with psd killed mid-epoch the step retried %.1f s (budget 3 s) and "
                "raised: %s" % (took, e))
    c2.close()


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "gloo-worker":
        gloo_worker(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5], sys.argv[6])
        return
    ds = [psd() for _ in range(2)]
    addrs = [d.address for d in ds]
    c = Client(addrs)
    only = os.environ.get("EMB_ONLY")
    if only:
        for k in range(int(os.environ.get("EMB_TIMES", "1"))):
            globals()["test_" + only](*([c, addrs] if only == "gloo" else [c]))
        r.finish()
    r.run((lambda: test_sgd(c), lambda: test_adagrad(c), lambda: test_offsets(c),
           lambda: test_shared(c),
           lambda: test_prefetch(c), lambda: test_loader(c),
           lambda: test_gloo(c, addrs), lambda: test_badinput(c, ds[1])))
    c.close()
    for d in ds:
        d.kill()
    r.finish()


def test_prefetch(c):
    u = universe_of(8)
    t = SparseTable("bag_pre", DIM, Initializer.uniform(-0.5, 0.5, seed=12))
    train_pair(c, t, Optimizer.sgd(0.1), lambda p: torch.optim.SGD(p, lr=0.1), "sum",
               batches(u, 9), u, prefetch=True, label="prefetch")


if __name__ == "__main__":
    main()
