"""Sparse tables inside psd's caps, tried from an outside client against a
real psd: --max-rows-per-table bounds a table's rows and any spec's
max_rows, rows with their optimizer slots count toward --max-bytes, a push
past either is refused whole with RESOURCE_EXHAUSTED naming the table and
the limit (nothing of it applied), and the RAM tier stays within its
budget (--memory-limit less 88 MiB), with the index of rows it holds,
plus one call's rows after every push that brings many new ids: psd's
peak anonymous memory is measured.
"""
import os
import sys
import time
import urllib.request

import grpc
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pstest  # noqa: E402

pb, pbg, _, _ = pstest.generate_stubs()
R = pstest.Results("psd-sparse-caps")
RE = grpc.StatusCode.RESOURCE_EXHAUSTED


def push(stub, name, ids, dim, value=1.0):
    g = np.full((len(ids), dim), value, np.float32)
    return stub.SparsePush(pb.SparsePushRequest(grads=[pb.SparseGradient(
        name=name, ids=list(ids),
        grad=pb.Tensor(dtype=pb.DTYPE_FLOAT32, shape=[len(ids), dim],
                       data=g.tobytes()))]), timeout=60)


def pull(stub, name, ids, dim):
    r = stub.SparsePull(pb.SparsePullRequest(items=[pb.SparsePullItem(
        name=name, ids=list(ids))]), timeout=60).rows[0]
    return np.frombuffer(r.values.data, "<f4").reshape(len(ids), dim)


def sparse_spec(name, dim, opt=None, **kw):
    return pstest.spec(pb, name, (dim,), lr=1.0, opt=opt, sparse=True, **kw)


def rows_cap():
    d = pstest.start_psd(pstest.tmpdir(), "--max-rows-per-table", "1000")
    stub = pbg.ParameterServerStub(pstest.channel(d.address))
    R.refused("a spec whose max_rows is over --max-rows-per-table",
              lambda: stub.CreateVariable(pb.CreateVariableRequest(
                  spec=sparse_spec("big", 8, max_rows=5000)), timeout=10),
              RE, "'big'", "max_rows 5000", "--max-rows-per-table 1000")
    stub.CreateVariable(pb.CreateVariableRequest(spec=sparse_spec("emb", 8)), timeout=10)
    push(stub, "emb", range(600), 8)
    before = pull(stub, "emb", range(600), 8)
    R.check(np.all(before == -1.0), "600 new rows are applied")
    # 400 old ids and 500 new ones: 1100 rows, over the cap.
    ids = list(range(200, 600)) + list(range(10000, 10500))
    R.refused("a push whose new rows pass --max-rows-per-table",
              lambda: push(stub, "emb", ids, 8), RE, "'emb'", "500 new rows",
              "--max-rows-per-table 1000", "nothing applied")
    R.check(np.array_equal(pull(stub, "emb", range(600), 8), before),
            "the refused push changed no row it named (applied whole or not at all)")
    R.check(np.all(pull(stub, "emb", range(10000, 10500), 8) == 0.0),
            "its new ids have no row (they pull their initial value)")
    push(stub, "emb", range(1000, 1400), 8)
    st = stub.Stats(pb.StatsRequest(), timeout=10)
    R.check(st.sparse_rows == 1000, "up to the cap is served: %d rows" % st.sparse_rows)
    R.refused("one more new row", lambda: push(stub, "emb", [99999], 8), RE,
              "--max-rows-per-table 1000")
    d.stop()


def bytes_cap():
    # Adagrad of dim 64: a row holds 16 + 64 * 2 * 4 = 528 bytes stored.
    d = pstest.start_psd(pstest.tmpdir(), "--max-bytes", "1M")
    stub = pbg.ParameterServerStub(pstest.channel(d.address))
    opt = pb.Optimizer(kind=pb.Optimizer.ADAGRAD, learning_rate=0.1)
    stub.CreateVariable(pb.CreateVariableRequest(spec=sparse_spec("ada", 64, opt)),
                        timeout=10)
    push(stub, "ada", range(1500), 64)
    R.refused("a push whose rows with their slots pass --max-bytes",
              lambda: push(stub, "ada", range(1500, 3000), 64), RE, "'ada'",
              "--max-bytes", "nothing applied")
    st = stub.Stats(pb.StatsRequest(), timeout=10)
    R.check(st.sparse_rows == 1500, "the refused push added no row: %d" % st.sparse_rows)
    R.refused("a dense variable the rows leave no room for",
              lambda: stub.CreateVariable(pb.CreateVariableRequest(
                  spec=pstest.spec(pb, "w", (70000,))), timeout=10),
              RE, "--max-bytes")
    d.stop()


def rss_anon(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    return 0


def metrics(port):
    """psd's /metrics page as {name: value} (series without labels)."""
    with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=10) as f:
        page = f.read().decode()
    return {p[0]: float(p[1]) for p in (line.split() for line in page.splitlines())
            if len(p) == 2 and not p[0].startswith("#")}


def ram_budget():
    """Pushes of many new ids each, under --memory-limit 192M (a RAM tier
    of 104 MiB): psd's anonymous memory may pass what it held before by the
    budget and one call's working set, no more; unbounded, the tier alone
    would take ~490 MB. What the budget bounds, on /metrics: the tier, the
    index, the catalog's queue and the dirty pages LMDB keeps of its largest
    catalog transaction."""
    d = pstest.start_psd(pstest.tmpdir(), "--memory-limit", "192M",
                         "--metrics-listen", "127.0.0.1:0")
    line = d.proc.stdout.readline()  # printed right after PORT
    mport = int(line.split()[1]) if line.startswith("METRICS_PORT ") else None
    R.check(mport is not None, "psd printed its metrics port (%r)" % line)
    stub = pbg.ParameterServerStub(pstest.channel(d.address))
    dim, per_call, calls = 64, 100000, 16
    stub.CreateVariable(pb.CreateVariableRequest(spec=sparse_spec("wide", dim)),
                        timeout=10)
    push(stub, "wide", range(1000), dim)
    budget = (192 << 20) - (88 << 20)
    call = per_call * dim * 4  # one call's gradient
    # One call's rows: each an entry of at most 64 bytes and the row's
    # floats in the tier, and its slot in the index of rows (16 bytes in a
    # part at least 7/10 full after it grew by a quarter: at most 23).
    call_rows = per_call * (64 + dim * 4 + 23)
    base = rss_anon(d.proc.pid)
    peak = base
    tier = []  # the tier and the index of rows after each call
    cost = []  # all that the budget bounds, from /metrics
    m = {}
    for c in range(calls):
        push(stub, "wide", range(10 ** 6 * (c + 1), 10 ** 6 * (c + 1) + per_call), dim)
        peak = max(peak, rss_anon(d.proc.pid))
        st = stub.Stats(pb.StatsRequest(), timeout=10)
        tier.append(st.sparse_ram_bytes + st.sparse_index_bytes)
        m = metrics(mport) if mport else {}
        cost.append(sum(m.get("psd_sparse_" + k, 0) for k in (
            "ram_bytes", "index_bytes", "catalog_queue_bytes", "lmdb_dirty_bytes")))
    time.sleep(0.5)
    peak = max(peak, rss_anon(d.proc.pid))
    # The catalog is written behind the pushes, lazily (doc/sparse.md):
    # once the log has been quiet for 2 s. Its transactions' pages count.
    pstest.wait_until(lambda: stub.Stats(pb.StatsRequest(), timeout=10)
                      .sparse_catalog_queued == 0, timeout=60)
    peak = max(peak, rss_anon(d.proc.pid))
    if mport:
        m = metrics(mport)
        cost.append(sum(m.get("psd_sparse_" + k, 0) for k in (
            "ram_bytes", "index_bytes", "catalog_queue_bytes", "lmdb_dirty_bytes")))
    # Past the budget: the call's rows in the tier (~1.2 calls: entries of
    # 312 bytes for 256 of floats), the request as gRPC holds it, its
    # summed gradients and the rows' new state (three), the commit's batch
    # for the row log (~1.1) and the applier's LMDB pages, and what malloc
    # keeps of freed calls until the flusher trims it (measured 0.2-0.27
    # GB in all): ten calls. Unbounded, the tier alone would hold 490 MB.
    bound = budget + 10 * call
    st = stub.Stats(pb.StatsRequest(), timeout=10)
    R.check(st.sparse_rows == 1000 + calls * per_call,
            "every new id got its row: %d" % st.sparse_rows)
    R.check(max(tier) <= budget + call_rows,
            "the RAM tier with the index of rows was at most %.1f MiB after each of %d "
            "calls (the index %.1f MiB at the end), within the budget of %.0f MiB plus a "
            "call's rows (%.1f MiB)" % (max(tier) / 2 ** 20, calls,
                                       st.sparse_index_bytes / 2 ** 20, budget / 2 ** 20,
                                       call_rows / 2 ** 20))
    R.check(m.get("psd_sparse_ram_budget_bytes") == budget,
            "/metrics gives the budget: %s bytes, --memory-limit less 88 MiB"
            % m.get("psd_sparse_ram_budget_bytes"))
    R.check(m.get("psd_sparse_lmdb_dirty_bytes", 0) > 0 and max(cost) <= budget + call_rows,
            "with the catalog's queue and LMDB's kept dirty pages (%.1f MiB), what the "
            "budget bounds was at most %.1f MiB after each call and the catalog's write, "
            "within the budget plus a call's rows" % (m.get("psd_sparse_lmdb_dirty_bytes", 0) / 2 ** 20,
                               max(cost) / 2 ** 20))
    R.check(peak - base <= bound,
            "psd's anonymous memory grew by %.1f MiB at its peak, at most the budget "
            "and one call's working set (%.1f MiB)" % ((peak - base) / 2 ** 20,
                                                      bound / 2 ** 20))
    d.stop()


def main():
    rows_cap()
    bytes_cap()
    ram_budget()
    R.finish()


if __name__ == "__main__":
    main()
