"""Synthetic click data for examples/dlrm.py and bench/dlrm.py: 26
categorical features, each drawn Zipf(ALPHA) over an id space of 10^8, 13
dense features, and a click label drawn from a hidden logistic model over
the latent vectors of a few features' ids and the dense features, so that
there is something to learn and an AUC to reach.

An id of feature f is the rank r ~ Zipf(ALPHA) (folded into the id space)
scrambled by splitmix64 with f's salt, so that hot ids are not small
numbers. The latent vector of an id is drawn from the hash of (feature, id)
alone: the same id always carries the same signal. Everything is a pure
function of the seed, so that every process makes the same examples.

    python3 examples/dlrm_data.py OUT.npz N [--seed S]

writes cat (N, 26) int64, dense (N, 13) float32 and label (N,) float32.
"""
import argparse
import importlib.util
import os

import numpy as np

CATEGORICAL = 26
DENSE = 13
ID_SPACE = 10 ** 8
ALPHA = 1.1
LATENT = 4
SIGNAL = (0, 3, 7, 11, 19, 23)   # the features whose ids carry signal


def _load_mix64():
    """psclient's splitmix64 finalizer, loaded by its path: that file needs
    numpy alone, so this script runs without a built psclient."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "python",
                        "psclient", "splitmix.py")
    spec = importlib.util.spec_from_file_location("psclient_splitmix", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.mix64


mix64 = _load_mix64()


def _latent(f, ids):
    """The hidden latent vector (len(ids), LATENT) of feature f's ids:
    16-bit slices of a hash, uniform on [-sqrt 3, sqrt 3) (variance 1)."""
    with np.errstate(over="ignore"):
        h = mix64(ids.astype(np.uint64) + np.uint64(0x9e3779b97f4a7c15) * np.uint64(f + 1))
    out = np.empty((len(ids), LATENT), np.float32)
    for k in range(LATENT):
        u = ((h >> np.uint64(16 * k)) & np.uint64(0xffff)).astype(np.float32) / 65536.0
        out[:, k] = (u - 0.5) * np.float32(2 * 3 ** 0.5)
    return out


def generate(n, seed=0):
    """n examples: (cat int64 (n, 26), dense float32 (n, 13), label float32
    (n,)). The hidden model is fixed (seed 1234); the examples follow seed."""
    hidden = np.random.default_rng(1234)
    w_lat = hidden.standard_normal((len(SIGNAL), LATENT)).astype(np.float32) * 0.8
    w_dense = hidden.standard_normal(DENSE).astype(np.float32) * 0.3
    rng = np.random.default_rng(seed)
    cat = np.empty((n, CATEGORICAL), np.int64)
    for f in range(CATEGORICAL):
        rank = (rng.zipf(ALPHA, n) - 1) % ID_SPACE
        salt = np.uint64(f * 0x632be59bd9b4e019 % (1 << 64))
        cat[:, f] = (mix64(rank.astype(np.uint64) ^ salt) % np.uint64(ID_SPACE)).astype(np.int64)
    dense = rng.standard_normal((n, DENSE)).astype(np.float32)
    logit = dense @ w_dense - 1.0
    for k, f in enumerate(SIGNAL):
        logit += _latent(f, cat[:, f]) @ w_lat[k]
    p = 1.0 / (1.0 + np.exp(-logit))
    label = (rng.random(n) < p).astype(np.float32)
    return cat, dense, label


def auc(label, score):
    """The area under the ROC curve (rank statistic, ties averaged)."""
    label = np.asarray(label) > 0.5
    order = np.argsort(score, kind="mergesort")
    s = np.asarray(score)[order]
    ranks = np.empty(len(s), np.float64)
    i = 0
    while i < len(s):          # average the ranks of ties
        j = i
        while j + 1 < len(s) and s[j + 1] == s[i]:
            j += 1
        ranks[i:j + 1] = (i + j) / 2.0 + 1
        i = j + 1
    r = np.empty(len(s), np.float64)
    r[order] = ranks
    npos = int(label.sum())
    nneg = len(label) - npos
    if npos == 0 or nneg == 0:
        return float("nan")
    return float((r[label].sum() - npos * (npos + 1) / 2.0) / (npos * nneg))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("n", type=int)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    cat, dense, label = generate(a.n, a.seed)
    np.savez(a.out, cat=cat, dense=dense, label=label)
    print("%d examples, click rate %.3f, %d distinct ids of feature 0"
          % (a.n, label.mean(), len(np.unique(cat[:, 0]))))


if __name__ == "__main__":
    main()
