/*
 * collective_gloo.cc - collective.h over Gloo's TCP transport: the only
 * C++ file of the project, and the only one that sees Gloo.
 *
 * The rendezvous is Gloo's own connectFullMesh (each rank writes its
 * addresses under "<prefix><rank>" and reads its peers'), through a
 * gloo::rendezvous::Store whose set/get/wait call the C store of
 * collective.h (pscoord's KvSet/KvGet). Every Gloo exception becomes an
 * error code and one line; nothing is thrown across the C boundary.
 */
#include "worker/collective.h"

#include "common/errors.h"

#include <gloo/allreduce.h>
#include <gloo/allreduce_halving_doubling.h>
#include <gloo/broadcast.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>

#include <netdb.h>
#include <sys/socket.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

/* Gloo's Store over the C callbacks; a failed get throws, as Gloo's own
 * stores do, and connectFullMesh's caller turns that into an error. */
class CStore : public gloo::rendezvous::Store {
  public:
    CStore(const wd_coll_store *s, std::string prefix, int timeout_ms)
        : s_(s), prefix_(std::move(prefix)), timeout_ms_(timeout_ms) {}

    void set(const std::string &key, const std::vector<char> &data) override
    {
        char err[512];
        std::string k = prefix_ + key;
        if (s_->set(s_->ctx, k.c_str(), data.data(), data.size(), err, sizeof err) != 0)
            throw std::runtime_error(std::string("rendezvous set ") + k + ": " + err);
    }

    std::vector<char> get(const std::string &key) override
    {
        return fetch(key, timeout_ms_);
    }

    void wait(const std::vector<std::string> &keys) override
    {
        wait(keys, std::chrono::milliseconds(timeout_ms_));
    }

    void wait(const std::vector<std::string> &keys,
              const std::chrono::milliseconds &timeout) override
    {
        for (const auto &k : keys)
            fetch(k, (int)timeout.count());
    }

  private:
    std::vector<char> fetch(const std::string &key, int timeout_ms)
    {
        char err[512];
        void *val = nullptr;
        size_t len = 0;
        std::string k = prefix_ + key;
        if (s_->get(s_->ctx, k.c_str(), timeout_ms, &val, &len, err, sizeof err) != 0)
            throw std::runtime_error(std::string("rendezvous get ") + k + ": " + err);
        std::vector<char> out((char *)val, (char *)val + len);
        free(val);
        return out;
    }

    const wd_coll_store *s_;
    std::string prefix_;
    int timeout_ms_;
};

struct GlooColl {
    wd_coll base; /* first: collective.h's face */
    std::shared_ptr<gloo::transport::Device> dev;
    std::shared_ptr<gloo::rendezvous::Context> ctx;
    /* A second full mesh whose pairs are in Gloo's sync mode: the calling
     * thread writes and reads its sockets itself, with no hand-off to the
     * device thread and back. Halving-doubling runs on it in pieces of at
     * most sync_limit bytes (NULL: never). */
    std::shared_ptr<gloo::rendezvous::Context> sctx;
    size_t sync_limit;
    int algorithm;
    std::chrono::milliseconds timeout;
    uint32_t tag;
    /* halving-doubling of the last buffer: its pieces' instances, built on
     * first use (hd_build) */
    std::vector<std::unique_ptr<gloo::Algorithm>> hd;
    float *hd_buf;
    size_t hd_n;
};

/* Gloo's device crashes on a host name that does not resolve (seen with
 * 0.0~git20220518): resolved here first. */
bool resolves(const char *host, char *err, size_t errlen)
{
    struct addrinfo hints = {}, *res = nullptr;
    hints.ai_socktype = SOCK_STREAM;
    int rc = getaddrinfo(host, nullptr, &hints, &res);
    if (rc != 0) {
        snprintf(err, errlen, "--allreduce-host %s: %s", host, gai_strerror(rc));
        return false;
    }
    freeaddrinfo(res);
    return true;
}

GlooColl *self(wd_coll *c)
{
    return reinterpret_cast<GlooColl *>(c);
}

int failed(const char *what, const std::exception &e, char *err, size_t errlen)
{
    snprintf(err, errlen, "gloo %s: %s", what, e.what());
    return PS_EUNAVAIL;
}

/* The largest piece halving-doubling may all-reduce over pairs in sync
 * mode. There a send is one blocking write while the peer, too, may be
 * writing: it must fit in the socket's send buffer, which Gloo sizes to
 * the message but the kernel caps at net.core.wmem_max (and doubles).
 * Halving-doubling's messages are at most the buffer (on a power of two
 * ranks at most half), so pieces up to wmem_max never block both ways.
 * 0 when it cannot be read. */
size_t sync_limit()
{
    FILE *f = fopen("/proc/sys/net/core/wmem_max", "r");
    unsigned long v = 0;
    if (f != nullptr) {
        if (fscanf(f, "%lu", &v) != 1)
            v = 0;
        fclose(f);
    }
    return (size_t)v;
}

/* Gloo's ring keeps two segments in flight, 1 MiB each by default. Over
 * loopback larger ones cost fewer wake-ups of the device thread: with
 * 4 MiB, 64 MiB on 2 ranks took 34-36 ms against 42-47 (4 ranks: 83-90
 * against 104-111 ms; bench/allreduce, three runs each). A segment stays
 * at most a quarter of a rank's share, so that small buffers still
 * pipeline. */
size_t ring_segment(size_t bytes, int ranks)
{
    size_t seg = bytes / (size_t)ranks / 4;
    const size_t lo = (size_t)1 << 20, hi = (size_t)4 << 20;
    return seg < lo ? lo : seg > hi ? hi : seg;
}

template <typename T>
int allreduce_ring(GlooColl *g, T *buf, size_t n)
{
    gloo::AllreduceOptions opts(g->ctx);
    opts.setOutput(buf, n);
    opts.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
    void (*fn)(void *, const void *, const void *, size_t) = &gloo::sum<T>;
    opts.setReduceFunction(fn);
    opts.setTag(g->tag++);
    opts.setTimeout(g->timeout);
    opts.setMaxSegmentSize(ring_segment(n * sizeof(T), g->base.size));
    gloo::allreduce(opts);
    return 0;
}

/* The smallest send buffer the sync-mode pairs are used with. */
#define SYNC_MIN_PIECE ((size_t)64 << 10)

/* Halving-doubling instances for buf[0..n): over the sync-mode pairs, one
 * per piece of at most sync_limit bytes, whose messages then fit the send
 * buffer (Debian's default wmem_max, 212992, splits a 1 MiB gradient in
 * five); without them, one over the asynchronous pairs. */
void hd_build(GlooColl *g, float *buf, size_t n)
{
    g->hd.clear();
    bool sync = g->sctx && g->sync_limit >= SYNC_MIN_PIECE;
    size_t piece = sync ? g->sync_limit / sizeof(float) : n;
    for (size_t off = 0; off < n; off += piece) {
        size_t len = n - off < piece ? n - off : piece;
        g->hd.emplace_back(new gloo::AllreduceHalvingDoubling<float>(
            sync ? g->sctx : g->ctx, std::vector<float *>{buf + off}, (int)len));
    }
    g->hd_buf = buf;
    g->hd_n = n;
}

int allreduce_f32(wd_coll *c, float *buf, size_t n, char *err, size_t errlen)
{
    GlooColl *g = self(c);
    if (g->base.size == 1)
        return 0;
    try {
        /* auto: on 2 ranks over loopback halving-doubling took 1.35 ms for
         * 1 MiB against ring's 4.46 (0.26-0.55 ms over the sync-mode
         * pairs, in one piece or five), and 70 ms for 64 MiB against 40. */
        size_t bytes = n * sizeof(float);
        bool hd = g->algorithm == WD_COLL_HALVING_DOUBLING ||
                  (g->algorithm == WD_COLL_AUTO &&
                   (bytes < (4u << 20) || (g->sctx && bytes <= g->sync_limit)));
        if (!hd)
            return allreduce_ring(g, buf, n);
        if (g->hd.empty() || g->hd_buf != buf || g->hd_n != n)
            hd_build(g, buf, n);
        for (auto &a : g->hd)
            a->run();
        return 0;
    } catch (const std::exception &e) {
        return failed("all-reduce", e, err, errlen);
    }
}

int allreduce_f64(wd_coll *c, double *buf, size_t n, char *err, size_t errlen)
{
    GlooColl *g = self(c);
    if (g->base.size == 1)
        return 0;
    try {
        return allreduce_ring(g, buf, n);
    } catch (const std::exception &e) {
        return failed("all-reduce", e, err, errlen);
    }
}

int broadcast(wd_coll *c, void *buf, size_t bytes, int root, char *err, size_t errlen)
{
    GlooColl *g = self(c);
    if (g->base.size == 1)
        return 0;
    try {
        gloo::BroadcastOptions opts(g->ctx);
        opts.setOutput(static_cast<uint8_t *>(buf), bytes);
        opts.setRoot(root);
        opts.setTag(g->tag++);
        opts.setTimeout(g->timeout);
        gloo::broadcast(opts);
        return 0;
    } catch (const std::exception &e) {
        return failed("broadcast", e, err, errlen);
    }
}

void destroy(wd_coll *c)
{
    delete self(c);
}

/* Forms g->sctx (the sync-mode mesh) beside g->ctx; throws as Gloo does. */
void connect_sync(GlooColl *g, const struct wd_coll_opts *o)
{
    g->sctx = std::make_shared<gloo::rendezvous::Context>(o->rank, o->size);
    g->sctx->setTimeout(g->timeout);
    CStore store(o->store, std::string(o->prefix != nullptr ? o->prefix : "") + "sync/",
                 o->timeout_ms);
    g->sctx->connectFullMesh(store, g->dev);
    for (int i = 0; i < o->size; i++)
        if (i != o->rank)
            g->sctx->getPair(i)->setSync(true, false);
}

} // namespace

extern "C" int wd_coll_gloo_create(const struct wd_coll_opts *o, wd_coll **out,
                                   char *err, size_t errlen)
{
    GlooColl *g = new (std::nothrow) GlooColl();
    if (g == nullptr)
        return -ENOMEM;
    g->base = wd_coll{"gloo", o->rank, o->size, allreduce_f32, allreduce_f64, broadcast, destroy};
    g->algorithm = o->algorithm;
    g->timeout = std::chrono::milliseconds(o->timeout_ms);
    if (!resolves(o->host != nullptr ? o->host : "127.0.0.1", err, errlen)) {
        delete g;
        return PS_EUNAVAIL;
    }
    try {
        gloo::transport::tcp::attr attr(o->host != nullptr ? o->host : "127.0.0.1");
        g->dev = gloo::transport::tcp::CreateDevice(attr);
        g->ctx = std::make_shared<gloo::rendezvous::Context>(o->rank, o->size);
        g->ctx->setTimeout(g->timeout);
        CStore store(o->store, o->prefix != nullptr ? o->prefix : "", o->timeout_ms);
        g->ctx->connectFullMesh(store, g->dev);
        g->sync_limit = sync_limit();
        if (g->sync_limit > 0)
            connect_sync(g, o);
    } catch (const std::exception &e) {
        snprintf(err, errlen, "gloo rendezvous of rank %d of %d on %s: %s", o->rank,
                 o->size, o->host != nullptr ? o->host : "127.0.0.1", e.what());
        delete g;
        return PS_EUNAVAIL;
    }
    *out = &g->base;
    return 0;
}

extern "C" int wd_coll_gloo_check_host(const char *host, char *err, size_t errlen)
{
    if (!resolves(host, err, errlen))
        return PS_EINVAL_ARG;
    try {
        gloo::transport::tcp::attr attr(host);
        auto dev = gloo::transport::tcp::CreateDevice(attr);
        return 0;
    } catch (const std::exception &e) {
        snprintf(err, errlen, "--allreduce-host %s: Gloo cannot listen there: %s", host,
                 e.what());
        return PS_EINVAL_ARG;
    }
}
