"""psclient's operator calls and token files against a real psd with
--tokens on 127.0.0.1:0, the tokens made by the real `psctl token`:

  tokens    read_token reads the "ROLE TOKEN" files psctl token (and
            tools/pscerts.sh) write, and a bare token, skipping blank lines
            and comments; a token's hash, a line of three words, an unknown
            role and an empty file are a ValueError naming the file (and
            line); a Client with the worker's file trains;
  ckpt      checkpoint() with the worker's token is PERMISSION_DENIED and
            writes nothing; with token_file= an operator's it writes each
            shard's directory at the step asked; after more pushes,
            restore() brings back the dense values and the sparse rows of
            that step; a restore of a step with no checkpoint is NOT_FOUND;
  info      stats() and list() return plain dataclasses (dataclasses.asdict
            works) whose fields are psd's answers: push counts, sparse rows,
            each variable's shape, version, optimizer and sparse flag;
  layer     a ShardedEmbeddingBag trains with a worker's token (which may
            not list variables) and one of another dim is refused in one
            line naming both;
  docs      every Python example of the README and doc/python.md that uses
            psclient (but Keras's, which needs the TensorFlow venv) runs,
            one after another, against one psd (their variables must not
            collide).

Prints ok/FAIL per check and "python-ops: N passed, N failed".
"""
import dataclasses
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import pyenv  # noqa: E402

pyenv.reexec()

import grpc  # noqa: E402
import numpy as np  # noqa: E402

import pstest  # noqa: E402
from psclient import (Checkpoint, Client, Initializer, Optimizer, PsError,  # noqa: E402
                      SparseTable, Variable, VariableInfo, read_token)

PSCTL = os.path.join(pstest.BUILD_ROOT, "tools", "psctl")
r = pstest.Results("python-ops")
F32 = np.float32


def write(path, text, mode=0o600):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    os.write(fd, text.encode())
    os.close(fd)
    return path


def tokens(d):
    """psctl token's lines per role, each in its file, and a server file."""
    lines = {}
    for role in ("reader", "worker", "operator"):
        out = subprocess.run([PSCTL, "token", role], capture_output=True, text=True,
                             timeout=30, check=True).stdout
        lines[role] = out.strip()
        write(os.path.join(d, role), out)
    write(os.path.join(d, "server"), "".join(v + "\n" for v in lines.values()))
    return lines


def bad_token(d, name, text, words):
    p = write(os.path.join(d, name), text)
    try:
        read_token(p)
        r.check(False, "tokens: %s is refused" % name)
    except ValueError as e:
        r.check(p in str(e) and all(w in str(e) for w in words),
                "tokens: %s is a ValueError: %s" % (name, e))


def test_tokens(d, lines):
    tok = lines["worker"].split()[1]
    r.check(read_token(os.path.join(d, "worker")) == tok,
            "tokens: psctl token's 'ROLE TOKEN' file gives its token")
    p = write(os.path.join(d, "commented"), "\n# the worker's\n  %s  # from psctl\n" % tok)
    bare = write(os.path.join(d, "bare"), tok + "\n")
    r.check(read_token(p) == tok and read_token(bare) == tok,
            "tokens: blank lines and comments are skipped; a bare token is read as well")
    bad_token(d, "hashed", "worker sha256:" + "ab" * 32 + "\n", [":1:", "hash"])
    bad_token(d, "three", "# x\nworker %s extra\n" % tok, [":2:", "ROLE TOKEN"])
    bad_token(d, "role", "boss %s\n" % tok, [":1:", "ROLE TOKEN"])
    bad_token(d, "empty", "\n# nothing\n", ["no token"])


def test_ckpt(d, addr, op):
    c = Client([addr], token_file=os.path.join(d, "worker"))
    c.create_variables([Variable("dense", (3, 4), Initializer.constant(1.0))],
                       optimizer=Optimizer.sgd(0.5))
    c.create_sparse_tables([SparseTable("tab", 4, Initializer.constant(0.25))],
                           optimizer=Optimizer.sgd(0.5))
    ids = np.array([5, -9, 2 ** 62], np.int64)
    for _ in range(3):
        c.push({"dense": np.ones((3, 4), F32)})
        c.sparse_push({"tab": (ids, np.ones((3, 4), F32))})
    saved = c.pull(["dense"])["dense"].copy()
    rows = c.sparse_pull({"tab": ids})["tab"].copy()
    try:
        c.checkpoint(step=7)
        r.check(False, "ckpt: checkpoint with a worker's token is refused")
    except PsError as e:
        r.check(e.code == grpc.StatusCode.PERMISSION_DENIED and addr in str(e),
                "ckpt: checkpoint with a worker's token: %s" % e)
    got = c.checkpoint(step=7, token_file=op)
    ck = got[0]
    r.check(len(got) == 1 and isinstance(ck, Checkpoint) and ck.step == 7 and ck.bytes > 0
            and os.path.isdir(ck.path) and ck.path.endswith("7") and ck.address == addr,
            "ckpt: checkpoint(step=7, token_file=operator) wrote %s (%d bytes)"
            % (ck.path, ck.bytes))
    for _ in range(2):
        c.push({"dense": np.ones((3, 4), F32)})
        c.sparse_push({"tab": (ids, np.ones((3, 4), F32))})
    moved = not np.array_equal(c.pull(["dense"])["dense"], saved)
    res = c.restore(step=7, token_file=op)
    back = c.pull(["dense"])["dense"]
    brows = c.sparse_pull({"tab": ids})["tab"]
    r.check(moved and res[0].step == 7 and res[0].variables == 2
            and np.array_equal(back, saved) and np.array_equal(brows, rows),
            "ckpt: restore(step=7) brings back the dense values and sparse rows of step 7 "
            "(%d variables)" % res[0].variables)
    try:
        c.restore(step=99, token_file=op)
        r.check(False, "ckpt: a restore of a step with no checkpoint is refused")
    except PsError as e:
        r.check(e.code == grpc.StatusCode.NOT_FOUND and "99" in e.details,
                "ckpt: restore of step 99: %s" % e)
    c.close()


def test_layer(d, addr):
    """A ShardedEmbeddingBag with a worker's token (which may not list
    variables): it trains, and a layer of another dim is refused in one
    line naming both."""
    try:
        import torch
        from psclient.torch import ShardedEmbeddingBag
    except ImportError:
        print("skip: layer: no torch", flush=True)
        return
    c = Client([addr], token_file=os.path.join(d, "worker"))
    emb = ShardedEmbeddingBag(c, SparseTable("layer", 4, Initializer.constant(0.5)), mode="sum",
                              optimizer=Optimizer.sgd(1.0))
    emb(torch.tensor([[1, 2]])).sum().backward()
    row = c.sparse_pull({"layer": np.array([1])})["layer"][0]
    r.check(np.all(row == -0.5), "layer: a ShardedEmbeddingBag trains with a worker's token")
    try:
        ShardedEmbeddingBag(c, SparseTable("layer", 6, Initializer.constant(0.5)),
                            optimizer=Optimizer.sgd(1.0))
        r.check(False, "layer: a layer of another dim is refused")
    except PsError as e:
        m = str(e)
        r.check("\n" not in m and "4" in m and "6" in m and "'layer'" in m,
                "layer: a layer of another dim with a worker's token: %s" % m)
    c.close()


def test_info(d, addr):
    c = Client([addr], token_file=os.path.join(d, "reader"))
    st = c.stats()
    s = st[0]
    as_dict = dataclasses.asdict(s)
    r.check(len(st) == 1 and dataclasses.is_dataclass(s) and s.shard == 0
            and s.address == addr and s.pushes >= 5 and s.sparse_rows in (3, 5)
            and as_dict["sparse_tables"] in (1, 2) and isinstance(s.uptime_seconds, float)
            and s.tokens_required is True,
            "info: stats() is a dataclass of psd's Stats (pushes %d, sparse_rows %d)"
            % (s.pushes, s.sparse_rows))
    vs = {v.name: v for v in c.list()}
    dn, tb = vs.get("dense"), vs.get("tab")
    vs.pop("layer", None)
    r.check(set(vs) == {"dense", "tab"} and all(isinstance(v, VariableInfo) for v in vs.values())
            and dn.shape == (3, 4) and not dn.sparse and dn.version == 3
            and dn.optimizer == "sgd" and dn.value_bytes == 48
            and tb.sparse and tb.shape == (4,) and dataclasses.asdict(tb)["name"] == "tab",
            "info: list() gives VariableInfo dataclasses: %s" % sorted(
                (v.name, v.shape, v.version, v.sparse) for v in vs.values()))
    # psd has no memory limit here: every row of the table is in its RAM tier
    r.check(tb.sparse_rows == 3 and tb.sparse_ram_rows == 3 and tb.sparse_disk_bytes > 0
            and tb.sparse_ram_bytes > 0 and dn.sparse_rows == dn.sparse_ram_rows == 0,
            "info: a table's rows, stored and in RAM: %d, %d (%d and %d bytes)"
            % (tb.sparse_rows, tb.sparse_ram_rows, tb.sparse_disk_bytes, tb.sparse_ram_bytes))
    c.close()


def doc_examples():
    """The ```python blocks of the README and doc/python.md that use
    psclient, with the file and line each starts at."""
    out = []
    for rel in ("README.md", os.path.join("doc", "python.md")):
        path = os.path.join(pstest.SOURCE_ROOT, rel)
        if not os.path.exists(path):
            continue
        with open(path) as f:
            lines = f.read().split("\n")
        k = 0
        while k < len(lines):
            if lines[k].strip() == "```python":
                end = lines.index("```", k + 1)
                code = "\n".join(lines[k + 1:end])
                if "psclient" in code and "tensorflow" not in code:
                    out.append(("%s:%d" % (rel, k + 1), code))
                k = end
            k += 1
    return out


def test_docs():
    s = pstest.Daemon([pstest.psd_path(), "--data-dir", pstest.tmpdir("pyops-doc-"),
                       "--listen", "127.0.0.1:0", "--log-level", "warn"])
    blocks = doc_examples()
    bad = []
    for where, code in blocks:
        p = subprocess.run([sys.executable, "-c", code.replace("127.0.0.1:7070", s.address)],
                           capture_output=True, text=True, timeout=120, cwd=pstest.tmpdir())
        if p.returncode != 0:
            last = (p.stderr.strip().splitlines() or ["exit %d" % p.returncode])[-1]
            bad.append("%s: %s" % (where, last))
    r.check(len(blocks) >= 3 and not bad,
            "docs: %d psclient examples of the docs ran one after another on one psd%s"
            % (len(blocks), "".join("; " + b for b in bad)))
    s.stop()


def main():
    d = pstest.tmpdir("pyops-")
    lines = tokens(d)
    s = pstest.Daemon([pstest.psd_path(), "--data-dir", pstest.tmpdir("pyops-data-"),
                       "--listen", "127.0.0.1:0", "--log-level", "warn",
                       "--tokens", os.path.join(d, "server")])
    r.run((lambda: test_tokens(d, lines),
           lambda: test_ckpt(d, s.address, os.path.join(d, "operator")),
           lambda: test_layer(d, s.address), lambda: test_info(d, s.address), test_docs))
    s.stop()
    r.finish()


if __name__ == "__main__":
    main()
