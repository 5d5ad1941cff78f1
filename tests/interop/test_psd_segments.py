"""The segment files of sparse rows against a real psd (doc/sparse.md,
"Layout on disk"): rows land in seg-*.psg beside data.mdb, Stats counts
their live and dead bytes and the rows read from them; a segment with a
flipped byte or cut short of its committed end makes psd refuse to start
with one line naming the file and the offset (and start again once it is
whole); a file size limit (RLIMIT_FSIZE, a full disk to psd) reached by a
segment append answers SparsePush with RESOURCE_EXHAUSTED, applies nothing
of the refused push, and leaves a directory that opens with every row
whole.

SGD with learning rate 1 from zeros and gradients of ones: a row pushed n
times holds -n in every element."""
import os
import shutil
import subprocess
import sys
import time

import grpc
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pstest  # noqa: E402

DIM = 64
REC = 32 + 16 + 4 * DIM   # record head, row head, the value
SEG1 = "seg-00000001.psg"
pb, pbg, _, _ = pstest.generate_stubs()
R = pstest.Results("psd-segments")


def push(stub, ids, timeout=30):
    g = np.ones((len(ids), DIM), np.float32)
    stub.SparsePush(pb.SparsePushRequest(grads=[pb.SparseGradient(
        name="emb", ids=[int(i) for i in ids], grad=pb.Tensor(
            dtype=pb.DTYPE_FLOAT32, shape=[len(ids), DIM], data=g.tobytes()))]),
        timeout=timeout)


def pull(stub, ids):
    out = []
    for k in range(0, len(ids), 4096):
        b = [int(i) for i in ids[k:k + 4096]]
        r = stub.SparsePull(pb.SparsePullRequest(items=[pb.SparsePullItem(
            name="emb", ids=b)]), timeout=60).rows[0]
        out.append(np.frombuffer(r.values.data, dtype="<f4").reshape(len(b), DIM))
    return np.concatenate(out)


def create(stub):
    stub.CreateVariable(pb.CreateVariableRequest(
        spec=pstest.spec(pb, "emb", (DIM,), lr=1.0, sparse=True)), timeout=10)


def refused_start(data, what, *words):
    """psd must not start on data: a non-zero exit and one line of stderr,
    naming each of words."""
    argv = [pstest.psd_path(), "--data-dir", data, "--listen", "127.0.0.1:0"]
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        R.check(False, "%s: psd refuses to start (it still ran after 60 s)" % what)
        return
    err = p.stderr.splitlines()
    lines = [ln for ln in err if all(w in ln for w in words)]
    R.check(p.returncode != 0 and len(lines) == 1 and len(err) == 1,
            "%s: psd refuses to start (exit %d) with one line naming %s: %s"
            % (what, p.returncode, ", ".join(words), err[:3] or p.stderr[-300:]))


def layout_and_damage():
    data = pstest.tmpdir()
    d = pstest.start_psd(data)
    ch = pstest.channel(d.address)
    stub = pbg.ParameterServerStub(ch)
    create(stub)
    ids = np.arange(0, 3000) * 11
    push(stub, ids)
    ch.close()
    R.check(d.stop() == 0, "psd stops cleanly (the row log applied)")
    # Again after the rows are in the segment: 1000 records overwritten.
    d = pstest.start_psd(data)
    ch = pstest.channel(d.address)
    push(pbg.ParameterServerStub(ch), ids[:1000])
    ch.close()
    d.stop()
    seg = os.path.join(data, SEG1)
    R.check(os.path.exists(seg) and os.path.getsize(seg) >= 16 + 4000 * REC,
            "the rows are in %s beside data.mdb (%d bytes: 4000 records of %d)"
            % (SEG1, os.path.getsize(seg) if os.path.exists(seg) else -1, REC))

    d = pstest.start_psd(data)
    ch = pstest.channel(d.address)
    stub = pbg.ParameterServerStub(ch)
    s0 = stub.Stats(pb.StatsRequest(), timeout=10)
    R.check(s0.sparse_segment_live_bytes == 3000 * REC and
            s0.sparse_segment_dead_bytes >= 1000 * REC,
            "Stats after a restart: %d live bytes (3000 rows), %d dead (1000 overwritten)"
            % (s0.sparse_segment_live_bytes, s0.sparse_segment_dead_bytes))
    got = pull(stub, ids)
    want = np.where(np.arange(3000) < 1000, -2.0, -1.0).astype(np.float32)
    s1 = stub.Stats(pb.StatsRequest(), timeout=10)
    R.check(np.array_equal(got, np.repeat(want[:, None], DIM, axis=1)),
            "every row reads back after the restart")
    R.check(s1.sparse_segment_reads - s0.sparse_segment_reads >= 3000,
            "the rows were read from the segment (%d reads)"
            % (s1.sparse_segment_reads - s0.sparse_segment_reads))
    ch.close()
    d.stop()

    # A flipped byte in the 2000th record's row.
    k = 2000
    at = 16 + k * REC + 40
    good = open(seg, "rb").read()
    with open(seg, "r+b") as f:
        f.seek(at)
        b = f.read(1)
        f.seek(at)
        f.write(bytes([b[0] ^ 0x5A]))
    refused_start(data, "a flipped byte", SEG1, "offset %d" % (16 + k * REC))
    with open(seg, "wb") as f:
        f.write(good)
    # Cut short of the committed end, mid-record.
    cut = len(good) - 500 * REC + 9
    with open(seg, "r+b") as f:
        f.truncate(cut)
    refused_start(data, "a truncated segment", SEG1, "offset %d" % cut)
    with open(seg, "wb") as f:
        f.write(good)
    d = pstest.start_psd(data)
    ch = pstest.channel(d.address)
    stub = pbg.ParameterServerStub(ch)
    got = pull(stub, ids)
    R.check(np.array_equal(got, np.repeat(want[:, None], DIM, axis=1)),
            "whole again, psd starts and every row reads back")
    # A deleted table's records are dead bytes (counted again by the applier).
    stub.DeleteVariable(pb.DeleteVariableRequest(name="emb"), timeout=10)
    s = pstest.wait_until(lambda: (lambda r: r if r.sparse_segment_live_bytes == 0 else None)(
        stub.Stats(pb.StatsRequest(), timeout=10)), timeout=10)
    R.check(s is not None and s.sparse_segment_dead_bytes >= 4000 * REC,
            "after DeleteVariable the table's records are dead: %s"
            % (s and "%d dead bytes, 0 live" % s.sparse_segment_dead_bytes))
    ch.close()
    d.stop()
    shutil.rmtree(data, ignore_errors=True)


FSIZE = 8 << 20


def full_disk():
    """psd under RLIMIT_FSIZE: fresh rows until a push is refused."""
    data = pstest.tmpdir()
    wrapper = [sys.executable, "-c",
               "import os, resource, sys; "
               "resource.setrlimit(resource.RLIMIT_FSIZE, (%d, %d)); "
               "os.execv(sys.argv[1], sys.argv[1:])" % (FSIZE, FSIZE)]
    d = pstest.start_psd(data, "--memory-limit", "24M", wrapper=wrapper)
    ch = pstest.channel(d.address)
    stub = pbg.ParameterServerStub(ch)
    create(stub)
    acked, refused, nxt = [], None, 0
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and refused is None:
        ids = np.arange(nxt, nxt + 2048)
        nxt += 2048
        try:
            push(stub, ids)
            acked.append(ids)
        except grpc.RpcError as e:
            refused = (e, ids)
    R.check(refused is not None and refused[0].code() ==
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            "pushes past the file size limit: %s after %d rows acknowledged (%s)"
            % (refused[0].code().name if refused else "never refused",
               2048 * len(acked), refused[0].details() if refused else ""))
    if refused is None:
        ch.close()
        d.kill()
        return
    got = pull(stub, refused[1])
    R.check(np.all(got == 0.0), "the refused push applied nothing (its rows read 0)")
    s = stub.Stats(pb.StatsRequest(), timeout=10)
    R.check(s.sparse_segment_bytes <= FSIZE and s.sparse_segment_live_bytes > 0,
            "the segment stays within the limit (%d bytes, %d live)"
            % (s.sparse_segment_bytes, s.sparse_segment_live_bytes))
    ch.close()
    d.kill()
    # Without the limit: the directory opens, every row applied is whole
    # and holds one push; the rows in the segment before the limit are
    # there (the rest of the acknowledged ones were in the row log).
    d = pstest.start_psd(data)
    ch = pstest.channel(d.address)
    stub = pbg.ParameterServerStub(ch)
    all_ids = np.concatenate(acked)
    got = pull(stub, all_ids)
    whole = np.all(got == got[:, :1], axis=1)
    vals = got[:, 0]
    R.check(bool(np.all(whole)) and bool(np.all((vals == 0.0) | (vals == -1.0))),
            "after a restart without the limit every row is whole, 0 or -1 (%d of %d at -1)"
            % (int(np.count_nonzero(vals == -1.0)), len(vals)))
    s = stub.Stats(pb.StatsRequest(), timeout=10)
    R.check(s.sparse_segment_live_bytes >= REC * int(np.count_nonzero(vals == -1.0)) // 2,
            "the rows are in the segments (%d live bytes)" % s.sparse_segment_live_bytes)
    push(stub, np.arange(nxt, nxt + 2048))
    R.check(bool(np.all(pull(stub, np.arange(nxt, nxt + 2048)) == -1.0)),
            "pushes are taken again")
    ch.close()
    d.stop()
    shutil.rmtree(data, ignore_errors=True)


def main():
    R.run([layout_and_damage, full_disk])
    R.finish()


if __name__ == "__main__":
    main()
