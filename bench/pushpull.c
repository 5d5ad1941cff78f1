/*
 * pushpull - what a push and a pull cost against one real psd, beside the two
 * ceilings that bound them on this host, measured in the same run: loopback
 * TCP throughput and memcpy bandwidth.
 *
 * It starts one psd on 127.0.0.1 port 0 with a fresh data directory, then for
 * each (variable size, client streams) case runs one thread per stream, each
 * with its own client (its own channel and TCP connection) and its own
 * variable. A case has three timed phases after a warm-up: pushes only, pulls
 * only (the pushes/s and pulls/s columns), then iterations of one Push of the
 * whole gradient followed by one Pull of the value (the round-trip time and
 * GB/s = streams x 2 x bytes / median RTT, and its ratio to the TCP
 * ceiling). Per case it also counts the CPU time and page faults per call of
 * psd and of this process, which say where an RTT goes without a profiler.
 * At the end it measures TCP again (on a shared host the two can differ
 * widely) and prints psd's Stats, so that its memory overhead is visible.
 * Last, it runs the 4 MiB case again in plaintext and against a second psd
 * with mutual TLS (certificates made by tools/pscerts into a temporary
 * directory), and ends with "pushpull tls: 4 MiB push+pull R of
 * plaintext", R the ratio of the two throughputs.
 *
 * The Push request is encoded once per stream into one buffer (common/wire.h,
 * psd's own codec); an iteration rewrites only the step and one gradient
 * element, so the client's own work is what ps_rpc_invoke does with the
 * bytes. The Pull response is decoded in place to a pointer into the
 * response buffer (no copy).
 *
 * With --link RATE (pushpull_link.c) psd and the client sit at the two ends
 * of a veth pair between two network namespaces, shaped to RATE by tc's
 * token bucket, and raw TCP over that link is the ceiling; it ends with
 * "pushpull link: 10 Gbit/s 4 MiB push+pull f32 T1 ms (R of link), bf16 T2 ms
 * (X.Xx f32)", the bf16 case through psclient with bfloat16 on the wire
 * and error feedback. psclient cuts the 4 MiB in pieces (its default, or
 * --pieces and --window); the same two cases in one call per tensor are
 * rows of their own before that line.
 *
 *   pushpull [--psd PATH] [--sizes 4K,1M,4M,64M] [--streams 1,2,4]
 *            [--seconds S] [--quick] [--json] [--psd-arg ARG]...
 *            [--pscerts PATH] [--no-tls] [--link 10gbit] [--pieces 1M]
 *            [--window 2]
 *
 * Threads and lifetime: main owns psd (started and stopped here; it also
 * dies with us through PR_SET_PDEATHSIG) and its temporary directory; a
 * signal thread removes both if we are interrupted. Each case's threads own
 * their client, buffers and samples until main has summarized them.
 */
#include "bench/pushpull.h"

#include "common/fsutil.h"
#include "common/half.h"

/* ---- the messages, encoded once (common/wire.h) ------------------------- */

/* A PushRequest for one gradient, built once; the gradient bytes are its
 * tail and `grad` points at them. */
struct push_msg {
    uint8_t *buf;
    size_t len;
    uint8_t *step_at;
    int step_width;
    float *grad; /* (n), inside buf */
    size_t n;
};

/*
 * PushRequest { worker = 1; step = 2; grads = 3 { Gradient { name = 1;
 *   grad = 2 { Tensor { dtype = 1; shape = 2 (packed); data = 3 } } } } }
 * with data last. The step's width (5..8 bytes, an overlong varint that any
 * parser reads) is chosen so that the data starts on a 4-byte boundary of
 * the message (or, with misalign, 2 bytes off one): psd reads the request
 * into an aligned buffer and uses aligned gradient bytes in place, but
 * copies unaligned ones to scratch first. An iteration rewrites the step in
 * place.
 */
static int push_msg_build(struct push_msg *m, uint32_t worker, const char *name,
                          size_t n, bool misalign)
{
    size_t nbytes = n * sizeof(float);
    int64_t shape[1] = {(int64_t)n};
    ps_wire_grad_out g = {.name = name, .dtype = PS__V1__DTYPE__DTYPE_FLOAT32,
                          .shape = shape, .ndim = 1, .nbytes = nbytes};
    ps_wire_push_out msg = {.worker = worker, .step_width = 5, .grads = &g,
                            .ngrads = 1};
    while ((ps_wire_push_len(&msg) - nbytes) % 4 != (misalign ? 2u : 0u))
        msg.step_width++;
    m->len = ps_wire_push_len(&msg);
    m->buf = aligned_alloc(64, (m->len + 63) & ~(size_t)63);
    if (m->buf == NULL)
        return -ENOMEM;
    uint8_t *p = ps_wire_push_put(m->buf, &msg); /* up to the data */
    m->step_at = m->buf + ps_wire_push_step_at(&msg);
    m->step_width = msg.step_width;
    m->grad = (float *)(void *)p;
    m->n = n;
    /* Small, finite, and not all equal, so SGD keeps the value finite. */
    for (size_t i = 0; i < n; i++) {
        float x = 1e-3f * (float)((i % 17) + 1);
        memcpy(p + i * sizeof x, &x, sizeof x);
    }
    return 0;
}

/* PullRequest { items = 1 { PullItem { name = 1 } } } (min_version 0). */
static size_t pull_req_build(uint8_t *buf, size_t cap, const char *name)
{
    Ps__V1__PullItem item = PS__V1__PULL_ITEM__INIT, *items[1] = {&item};
    Ps__V1__PullRequest req = PS__V1__PULL_REQUEST__INIT;
    item.name = (char *)name;
    req.items = items;
    req.n_items = 1;
    if (ps__v1__pull_request__get_packed_size(&req) > cap)
        return 0;
    return ps__v1__pull_request__pack(&req, buf);
}

/* What pull_resp_decode finds: the value's version and its bytes. */
struct pull_seen {
    uint64_t version;
    const uint8_t *data;
    size_t nbytes;
};

static int pull_seen_value(void *ctx, enum ps_wire_event ev, ps_wire_value *v,
                           char *err, size_t errlen)
{
    struct pull_seen *ps = ctx;
    (void)err;
    (void)errlen;
    if (ev == PS_WIRE_DATA)
        ps->nbytes = ps_wire_bytes_peek(&v->data, &ps->data);
    else if (ev == PS_WIRE_END)
        ps->version = v->version;
    return 0;
}

/* The one value of a PullResponse: its version and a pointer to its data
 * inside buf (valid while buf is). */
static int pull_resp_decode(const uint8_t *buf, size_t len, uint64_t *version,
                            const uint8_t **data, size_t *nbytes)
{
    struct ps_piece one = {buf, len};
    struct pull_seen seen = {0, NULL, 0};
    char err[128];
    int rc = ps_wire_values_decode(&one, 1, false, 1, NULL, 0, pull_seen_value,
                                   &seen, err, sizeof err);
    if (rc != 0 || seen.data == NULL)
        return PS_EPARSE;
    *version = seen.version;
    *data = seen.data;
    *nbytes = seen.nbytes;
    return 0;
}

/* ---- one case: streams x size ------------------------------------------- */

/* PH_ONE: a push that brings the value back (PushRequest.return_values),
 * the one round trip workerd makes per step; psclient streams only. */
enum phase { PH_WARM, PH_PUSH, PH_PULL, PH_BOTH, PH_ONE, PH_COUNT };

struct bench_case;

struct stream {
    struct bench_case *bc;
    int idx;
    ps_rpc_client *cli;
    ps_client *pc;            /* the library workerd uses (default mode) */
    float *grad, *dest;       /* (n) */
    ps_rpc_msg *grad_msg;     /* grad lies in it (or in shm) */
    ps_shm *shm;              /* --shm: grad and dest lie in it */
    int64_t shape[1];
    ps_client_item push_item, pull_item;
    char name[96];
    struct push_msg pm;
    uint8_t pull_req[160];
    size_t pull_req_len;
    ps_buf resp;
    uint64_t step;
    float sink;
    /* results */
    size_t iters[PH_COUNT];
    double elapsed[PH_COUNT];
    struct samples rtt, push_lat, pull_lat; /* PH_BOTH, per iteration */
    struct samples one;                     /* PH_ONE, per iteration */
    double enc_s, dec_s;                    /* PH_BOTH, summed */
    int rc;
    char err[600];
};

struct bench_case {
    const struct opts *o;
    int port;
    size_t bytes;
    int nstreams;
    pthread_barrier_t bar;
    double phase_s[PH_COUNT];
    size_t min_iters[PH_COUNT];
    struct stream *st;
};

static int fail(struct stream *s, int rc, const char *what, const ps_rpc_status *st)
{
    if (s->rc != 0)
        return s->rc;
    s->rc = rc != 0 ? rc : PS_ERPC;
    if (st != NULL)
        snprintf(s->err, sizeof s->err, "stream %d: %s: %s (%s)", s->idx, what,
                 ps_rpc_code_name(st->code), st->message);
    else
        snprintf(s->err, sizeof s->err, "stream %d: %s: %s", s->idx, what,
                 ps_strerror(s->rc));
    return s->rc;
}

static int create_variable(struct stream *s, size_t n)
{
    Ps__V1__CreateVariableRequest req = PS__V1__CREATE_VARIABLE_REQUEST__INIT;
    Ps__V1__VariableSpec spec = PS__V1__VARIABLE_SPEC__INIT;
    Ps__V1__Optimizer opt = PS__V1__OPTIMIZER__INIT;
    int64_t shape[1] = {(int64_t)n};
    spec.name = s->name;
    spec.dtype = PS__V1__DTYPE__DTYPE_FLOAT32;
    spec.n_shape = 1;
    spec.shape = shape;
    spec.consistency = PS__V1__CONSISTENCY__ASYNC;
    opt.kind = PS__V1__OPTIMIZER__KIND__SGD;
    opt.learning_rate = 1e-4f;
    spec.optimizer = &opt;
    req.spec = &spec;
    void *resp = NULL;
    ps_rpc_status st;
    int rc = ps_rpc_invoke_pb(s->cli, METHOD_CREATE, &req,
                              &ps__v1__create_variable_response__descriptor,
                              &resp, 0, &st);
    if (rc != 0)
        return fail(s, rc, "CreateVariable", &st);
    protobuf_c_message_free_unpacked(resp, NULL);
    return 0;
}

static int stream_setup(struct stream *s)
{
    struct bench_case *bc = s->bc;
    char target[sizeof shm_sock + 8];
    if (bc->o->shm)
        snprintf(target, sizeof target, "unix:%s", shm_sock);
    else
        snprintf(target, sizeof target, "%s:%d", bc->o->host, bc->port);
    /* gRPC shares one connection among channels whose arguments match; a
     * message limit that differs per stream keeps each stream on its own
     * channel *and* its own TCP connection, as separate workers would be. */
    ps_rpc_client_opts co = {
        .deadline_ms = 120000,
        .max_message_bytes = PS_RPC_DEFAULT_MAX_MESSAGE - (size_t)s->idx,
        .tls = bc->o->tls,
        .token = bench_token,
    };
    int rc = ps_rpc_client_create(target, &co, &s->cli);
    if (rc != 0)
        return fail(s, rc, "client", NULL);
    snprintf(s->name, sizeof s->name, "pushpull/%zu/x%d/%d", bc->bytes,
             bc->nstreams, s->idx);
    size_t n = bc->bytes / sizeof(float);
    if ((rc = create_variable(s, n)) != 0)
        return rc;
    if ((rc = push_msg_build(&s->pm, (uint32_t)s->idx, s->name, n,
                             bc->o->misalign)) != 0)
        return fail(s, rc, "encoding the push", NULL);
    s->pull_req_len = pull_req_build(s->pull_req, sizeof s->pull_req, s->name);
    if (!bc->o->raw) {
        if ((rc = ps_client_create(target, &co, &s->pc)) != 0)
            return fail(s, rc, "psclient", NULL);
        if (bc->o->pieces_set &&
            (rc = ps_client_set_pieces(s->pc, bc->o->piece_bytes,
                                       bc->o->piece_window ? bc->o->piece_window
                                                           : 2)) != 0)
            return fail(s, rc, "--pieces", NULL);
        size_t block = (n * sizeof(float) + 4095) / 4096 * 4096;
        if (bc->o->shm) {
            /* Both in shared memory: by reference, as workerd's are. */
            if ((rc = ps_shm_create(2 * block, &s->shm)) != 0)
                return fail(s, rc, "shared memory", NULL);
            s->grad = ps_shm_base(s->shm);
            s->dest = (float *)(void *)((uint8_t *)ps_shm_base(s->shm) + block);
            ps_client_set_shm(s->pc, s->shm);
        } else {
            if (bc->o->wire_dtype != 0)
                ps_client_set_wire_dtype(s->pc, bc->o->wire_dtype, true);
            /* In a message buffer, as workerd's gradients are: sent in place. */
            s->grad_msg = ps_rpc_msg_new(n * sizeof(float));
            s->grad = s->grad_msg ? (float *)(void *)ps_rpc_msg_data(s->grad_msg) : NULL;
            s->dest = aligned_alloc(64, block);
        }
        if (s->grad == NULL || s->dest == NULL)
            return fail(s, -ENOMEM, "gradient buffers", NULL);
        for (size_t k = 0; k < n; k++)
            s->grad[k] = 1e-3f * (float)(k % 7);
        memset(s->dest, 0, n * sizeof(float));
        s->shape[0] = (int64_t)n;
        s->push_item = (ps_client_item){.name = s->name, .data = s->grad, .n = n,
                                        .msg = s->grad_msg,
                                        .shape = s->shape, .ndim = 1};
        s->pull_item = (ps_client_item){.name = s->name, .data = s->dest, .n = n};
    }
    if ((rc = ps_buf_reserve(&s->resp, bc->bytes + 4096)) != 0)
        return fail(s, rc, "response buffer", NULL);
    return 0;
}

/* What changes per iteration: the step and one gradient element. */
static void push_msg_update(struct stream *s)
{
    s->step++;
    ps_wire_put_varint_fixed(s->pm.step_at, s->step & ((1ull << (7 * 5)) - 1),
                             s->pm.step_width);
    float g = 1e-3f * (float)((s->step % 13) + 1);
    memcpy(&s->pm.grad[s->step % s->pm.n], &g, sizeof g);
}

static int do_push(struct stream *s)
{
    ps_rpc_status st;
    if (s->pc != NULL) {
        /* Sent in place from its message buffer, as a worker's is. */
        ps_rpc_msg_wait_unshared(s->grad_msg);
        s->grad[s->step % s->push_item.n] = 1e-3f * (float)((s->step % 13) + 1);
        int rc = ps_client_push(s->pc, (uint32_t)s->idx, s->step, &s->push_item, 1,
                                0, &st);
        return rc != 0 ? fail(s, rc, "Push", &st) : 0;
    }
    int rc = ps_rpc_invoke(s->cli, METHOD_PUSH, s->pm.buf, s->pm.len, &s->resp,
                           0, &st);
    return rc != 0 ? fail(s, rc, "Push", &st) : 0;
}

static int do_pull(struct stream *s)
{
    ps_rpc_status st;
    if (s->pc != NULL) {
        /* Decoded straight into the destination, as a worker's model is. */
        int rc = ps_client_pull(s->pc, &s->pull_item, 1, 0, &st);
        return rc != 0 ? fail(s, rc, "Pull", &st) : 0;
    }
    int rc = ps_rpc_invoke(s->cli, METHOD_PULL, s->pull_req, s->pull_req_len,
                           &s->resp, 0, &st);
    return rc != 0 ? fail(s, rc, "Pull", &st) : 0;
}

static int check_pull(struct stream *s)
{
    if (s->pc != NULL) {
        s->sink += s->dest[s->pull_item.n - 1];
        return 0;
    }
    uint64_t version = 0;
    const uint8_t *data;
    size_t nbytes;
    if (pull_resp_decode(s->resp.data, s->resp.len, &version, &data, &nbytes) != 0 ||
        nbytes != s->bc->bytes)
        return fail(s, PS_EPARSE, "Pull response has no value of the right size", NULL);
    float x;
    memcpy(&x, data + nbytes - sizeof x, sizeof x);
    s->sink += x;
    return 0;
}

static int do_push_pull(struct stream *s)
{
    ps_rpc_status st;
    ps_rpc_msg_wait_unshared(s->grad_msg);
    s->step++;
    s->grad[s->step % s->push_item.n] = 1e-3f * (float)((s->step % 13) + 1);
    int rc = ps_client_push_pull(s->pc, (uint32_t)s->idx, s->step, &s->push_item,
                                 &s->pull_item, 1, 0, &st);
    if (rc != 0)
        return fail(s, rc, "Push with return_values", &st);
    s->sink += s->dest[s->pull_item.n - 1];
    return 0;
}

static void run_phase(struct stream *s, enum phase ph)
{
    struct bench_case *bc = s->bc;
    double t0 = ps_now_s(), until = t0 + bc->phase_s[ph];
    size_t i = 0;
    for (; s->rc == 0; i++) {
        if (i >= bc->min_iters[ph] && (ph == PH_WARM || ps_now_s() >= until))
            break;
        double a = ps_now_s();
        if (ph == PH_ONE) {
            if (s->pc == NULL || do_push_pull(s) != 0)
                break;
            samples_add(&s->one, ps_now_s() - a);
            continue;
        }
        if (ph != PH_PULL) {
            push_msg_update(s);
            double b = ps_now_s();
            if (do_push(s) != 0)
                break;
            double c = ps_now_s();
            if (ph == PH_PUSH)
                continue;
            if (ph == PH_BOTH) {
                s->enc_s += b - a;
                samples_add(&s->push_lat, c - a);
            }
        }
        double d = ps_now_s();
        if (do_pull(s) != 0)
            break;
        double e = ps_now_s();
        if (check_pull(s) != 0)
            break;
        double f = ps_now_s();
        if (ph == PH_BOTH) {
            s->dec_s += f - e;
            samples_add(&s->pull_lat, f - d);
            samples_add(&s->rtt, f - a);
        }
    }
    s->iters[ph] = i;
    s->elapsed[ph] = ps_now_s() - t0;
}

/* A stream's thread: set up, then each phase in step with the others (a
 * failed stream still meets every barrier, so no one waits forever). */
static void *stream_main(void *arg)
{
    struct stream *s = arg;
    stream_setup(s);
    for (int ph = 0; ph < PH_COUNT; ph++) {
        pthread_barrier_wait(&s->bc->bar);
        if (s->rc == 0)
            run_phase(s, (enum phase)ph);
    }
    return NULL;
}

struct case_result {
    size_t bytes;
    int streams;
    double push_rate, pull_rate;     /* per second, all streams */
    double rtt_med, rtt_p90;         /* seconds */
    double push_med, pull_med;       /* seconds, within the push+pull phase */
    double gbps, ratio;
    double one_med, one_gbps, one_ratio; /* one Push with return_values */
    double encdec_share;             /* our encode + decode / RTT */
    double copy_share_est;           /* the client's payload copies, at memcpy speed */
    size_t iters;                    /* push+pull iterations, all streams */
    /* Per call (push or pull, every phase): CPU time and minor page faults
     * of psd and of this process. A payload of b bytes spans b / 4096
     * pages, so faults near that count mean every call writes fresh memory. */
    double psd_cpu_ms, psd_faults, cli_cpu_ms, cli_faults;
};

struct usage {
    double cpu_s;
    double minflt;
};

/* psd's user+system time and minor faults from /proc/<pid>/stat. */
static void proc_usage(pid_t pid, struct usage *u)
{
    double hz = (double)sysconf(_SC_CLK_TCK);
    u->cpu_s = (double)(ps_proc_stat_field(pid, 14) + ps_proc_stat_field(pid, 15)) / hz;
    u->minflt = (double)ps_proc_stat_field(pid, 10);
}

static void self_usage(struct usage *u)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    u->cpu_s = (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec * 1e-6 +
               (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec * 1e-6;
    u->minflt = (double)ru.ru_minflt;
}

static int run_case(const struct opts *o, pid_t psd_pid, int port, size_t bytes,
                    int nstreams, const struct ceilings *lim, struct case_result *r)
{
    struct bench_case bc = {.o = o, .port = port, .bytes = bytes, .nstreams = nstreams};
    double T = o->seconds;
    bc.phase_s[PH_PUSH] = T * 0.25;
    bc.phase_s[PH_PULL] = T * 0.25;
    bc.phase_s[PH_BOTH] = T * 0.5;
    bc.phase_s[PH_ONE] = o->raw ? 0 : T * 0.5;
    /* Fewer iterations for big variables: a 64 MiB round trip takes hundreds of
     * milliseconds, and the timed phases still take at least 3. */
    bc.min_iters[PH_WARM] = bytes >= ((size_t)64 << 20) ? 1 : bytes >= (1 << 20) ? 3 : 50;
    bc.min_iters[PH_PUSH] = bc.min_iters[PH_PULL] = bc.min_iters[PH_BOTH] = 3;
    bc.min_iters[PH_ONE] = o->raw ? 0 : 3;
    bc.st = calloc((size_t)nstreams, sizeof *bc.st);
    pthread_t *th = calloc((size_t)nstreams, sizeof *th);
    int rc = 0;
    if (bc.st == NULL || th == NULL) {
        free(bc.st);
        free(th);
        return -ENOMEM;
    }
    pthread_barrier_init(&bc.bar, NULL, (unsigned)nstreams);
    int started = 0;
    struct usage psd0, psd1, cli0, cli1;
    proc_usage(psd_pid, &psd0);
    self_usage(&cli0);
    for (int i = 0; i < nstreams; i++) {
        bc.st[i].bc = &bc;
        bc.st[i].idx = i;
    }
    for (; started < nstreams; started++)
        if (pthread_create(&th[started], NULL, stream_main, &bc.st[started]) != 0)
            break;
    if (started < nstreams) {
        /* The barrier counts every stream; without them none would pass. */
        fprintf(stderr, "pushpull: cannot start %d threads\n", nstreams);
        abort();
    }
    for (int i = 0; i < nstreams; i++)
        pthread_join(th[i], NULL);
    proc_usage(psd_pid, &psd1);
    self_usage(&cli1);

    struct samples rtt = {0}, pushl = {0}, pulll = {0}, one = {0};
    double enc = 0, rtt_sum = 0, calls = 0;
    memset(r, 0, sizeof *r);
    r->bytes = bytes;
    r->streams = nstreams;
    for (int i = 0; i < nstreams; i++) {
        struct stream *s = &bc.st[i];
        if (s->rc != 0 && rc == 0) {
            fprintf(stderr, "pushpull: %s: %s\n", s->name, s->err);
            rc = s->rc;
        }
        if (s->elapsed[PH_PUSH] > 0)
            r->push_rate += (double)s->iters[PH_PUSH] / s->elapsed[PH_PUSH];
        if (s->elapsed[PH_PULL] > 0)
            r->pull_rate += (double)s->iters[PH_PULL] / s->elapsed[PH_PULL];
        r->iters += s->rtt.n;
        calls += 2 * (s->iters[PH_WARM] + s->iters[PH_BOTH]) + s->iters[PH_PUSH] +
                 s->iters[PH_PULL] + s->iters[PH_ONE];
        enc += s->enc_s + s->dec_s;
        for (size_t k = 0; k < s->rtt.n; k++) {
            samples_add(&rtt, s->rtt.v[k]);
            rtt_sum += s->rtt.v[k];
        }
        for (size_t k = 0; k < s->push_lat.n; k++)
            samples_add(&pushl, s->push_lat.v[k]);
        for (size_t k = 0; k < s->pull_lat.n; k++)
            samples_add(&pulll, s->pull_lat.v[k]);
        for (size_t k = 0; k < s->one.n; k++)
            samples_add(&one, s->one.v[k]);
    }
    if (rc == 0 && rtt.n > 0) {
        r->rtt_med = quantile(rtt.v, rtt.n, 0.5);
        r->rtt_p90 = quantile(rtt.v, rtt.n, 0.9);
        r->push_med = quantile(pushl.v, pushl.n, 0.5);
        r->pull_med = quantile(pulll.v, pulll.n, 0.5);
        r->gbps = (double)nstreams * 2.0 * (double)bytes / r->rtt_med / 1e9;
        r->ratio = lim->tcp_gbps > 0 ? r->gbps / lim->tcp_gbps : 0;
        if (one.n > 0) {
            r->one_med = quantile(one.v, one.n, 0.5);
            r->one_gbps = (double)nstreams * 2.0 * (double)bytes / r->one_med / 1e9;
            r->one_ratio = lim->tcp_gbps > 0 ? r->one_gbps / lim->tcp_gbps : 0;
        }
        r->encdec_share = rtt_sum > 0 ? enc / rtt_sum : 0;
        /* psclient: the pull's copy into the destination (the push goes
         * out in place); raw: ps_rpc_invoke copies request and response. */
        r->copy_share_est = (o->raw ? 2.0 : o->shm ? 0.0 : 1.0) * (double)bytes / (lim->memcpy_gbps * 1e9) / r->rtt_med;
        r->psd_cpu_ms = (psd1.cpu_s - psd0.cpu_s) * 1e3 / calls;
        r->psd_faults = (psd1.minflt - psd0.minflt) / calls;
        r->cli_cpu_ms = (cli1.cpu_s - cli0.cpu_s) * 1e3 / calls;
        r->cli_faults = (cli1.minflt - cli0.minflt) / calls;
    }
    ps_buf_free(&rtt.b);
    ps_buf_free(&pushl.b);
    ps_buf_free(&pulll.b);
    ps_buf_free(&one.b);
    for (int i = 0; i < nstreams; i++) {
        struct stream *s = &bc.st[i];
        ps_rpc_client_destroy(s->cli);
        ps_client_destroy(s->pc);
        ps_rpc_msg_unref(s->grad_msg);
        if (s->shm != NULL) {
            if (!ps_client_shm_active(s->pc))
                fprintf(stderr, "pushpull: psd refused the shared memory; the "
                        "case ran inline\n");
            ps_shm_destroy(s->shm);
        } else {
            free(s->dest);
        }
        free(s->pm.buf);
        ps_buf_free(&s->resp);
        ps_buf_free(&s->rtt.b);
        ps_buf_free(&s->push_lat.b);
        ps_buf_free(&s->pull_lat.b);
        ps_buf_free(&s->one.b);
    }
    pthread_barrier_destroy(&bc.bar);
    free(bc.st);
    free(th);
    return rc;
}

/* ---- output -------------------------------------------------------------- */

static void print_ceilings(const struct opts *o, const struct ceilings *c)
{
    if (o->json) {
        printf("{\"bench\":\"pushpull\",\"kind\":\"ceilings\",\"tcp_gbps\":%.3f,"
               "\"tcp_runs_gbps\":[%.3f,%.3f,%.3f],\"tcp_bytes\":%zu,"
               "\"memcpy_gbps\":%.3f,\"memcpy_runs_gbps\":[%.3f,%.3f,%.3f,%.3f,%.3f],"
               "\"memcpy_bytes\":%zu}\n",
               c->tcp_gbps, c->tcp_runs[0], c->tcp_runs[1], c->tcp_runs[2],
               o->tcp_bytes, c->memcpy_gbps, c->memcpy_runs[0], c->memcpy_runs[1],
               c->memcpy_runs[2], c->memcpy_runs[3], c->memcpy_runs[4],
               (size_t)64 << 20);
    } else {
        char sz[32];
        printf("ceilings (this run):\n");
        printf("  %-13s %6.2f GB/s  (median of 3 x %s: %.2f %.2f %.2f)\n",
               o->link != NULL ? "TCP over link" : "loopback TCP", c->tcp_gbps, size_str(o->tcp_bytes, sz, sizeof sz), c->tcp_runs[0],
               c->tcp_runs[1], c->tcp_runs[2]);
        printf("  memcpy        %6.2f GB/s  (median of 5 x 64 MiB, warm)\n\n",
               c->memcpy_gbps);
        printf("%-8s %3s %9s %9s %9s %9s %9s %9s %7s %6s %9s %6s %6s\n", "size",
               "str", "pushes/s", "pulls/s", "RTT med", "RTT p90", "push med",
               "pull med", "GB/s", "xTCP", "1-RPC med", "xTCP", "enc/dec");
    }
    fflush(stdout);
}

static void fmt_ms(double s, char *buf, size_t len)
{
    if (s < 1e-3)
        snprintf(buf, len, "%.0f us", s * 1e6);
    else
        snprintf(buf, len, "%.2f ms", s * 1e3);
}

static void print_case(const struct opts *o, const struct case_result *r)
{
    bool target_case = r->bytes == TARGET_BYTES && r->streams == 1;
    if (o->json) {
        printf("{\"bench\":\"pushpull\",\"kind\":\"case\",\"bytes\":%zu,\"streams\":%d,"
               "\"pushes_per_s\":%.1f,\"pulls_per_s\":%.1f,\"rtt_median_ms\":%.4f,"
               "\"rtt_p90_ms\":%.4f,\"push_median_ms\":%.4f,\"pull_median_ms\":%.4f,"
               "\"gbps\":%.4f,\"ratio_tcp\":%.4f,\"iterations\":%zu,"
               "\"enc_dec_share\":%.5f,\"client_copy_share_est\":%.4f,"
               "\"aligned\":%s,\"psd_cpu_ms_per_call\":%.4f,"
               "\"psd_faults_per_call\":%.1f,\"client_cpu_ms_per_call\":%.4f,"
               "\"client_faults_per_call\":%.1f,\"one_rpc_median_ms\":%.4f,"
               "\"one_rpc_gbps\":%.4f,\"one_rpc_ratio_tcp\":%.4f,\"shm\":%s",
               r->bytes, r->streams, r->push_rate, r->pull_rate, r->rtt_med * 1e3,
               r->rtt_p90 * 1e3, r->push_med * 1e3, r->pull_med * 1e3, r->gbps,
               r->ratio, r->iters, r->encdec_share, r->copy_share_est,
               o->misalign ? "false" : "true", r->psd_cpu_ms, r->psd_faults,
               r->cli_cpu_ms, r->cli_faults, r->one_med * 1e3, r->one_gbps,
               r->one_ratio, o->shm ? "true" : "false");
        if (target_case)
            printf(",\"target_ratio\":%.2f,\"meets_target\":%s", TARGET_RATIO,
                   r->ratio >= TARGET_RATIO ? "true" : "false");
        printf("}\n");
    } else {
        char sz[32], a[32], b[32], c[32], d[32], e[32] = "-";
        fmt_ms(r->rtt_med, a, sizeof a);
        fmt_ms(r->rtt_p90, b, sizeof b);
        fmt_ms(r->push_med, c, sizeof c);
        fmt_ms(r->pull_med, d, sizeof d);
        if (r->one_med > 0)
            fmt_ms(r->one_med, e, sizeof e);
        printf("%-8s %3d %9.0f %9.0f %9s %9s %9s %9s %7.3f %6.3f %9s %6.3f %5.2f%%\n",
               size_str(r->bytes, sz, sizeof sz), r->streams, r->push_rate,
               r->pull_rate, a, b, c, d, r->gbps, r->ratio, e, r->one_ratio,
               r->encdec_share * 100);
    }
    fflush(stdout);
}

static void print_target(const struct opts *o, const struct case_result *r,
                         const struct ceilings *c)
{
    if (o->json)
        return;
    printf("\n4 MiB x 1 stream push+pull: %.3f GB/s = %.3f of raw TCP "
           "(target >= %.2f): %s\n", r->gbps, r->ratio, TARGET_RATIO,
           r->ratio >= TARGET_RATIO ? "MET" : "MISSED");
    printf("  RTT median %.3f ms (push %.3f + pull %.3f); the issue's ps-lite "
           "reference: 4.84 ms\n", r->rtt_med * 1e3, r->push_med * 1e3,
           r->pull_med * 1e3);
    if (r->one_med > 0)
        printf("  as one Push that brings the value back (return_values, what "
               "workerd does per step): %.3f ms, %.3f GB/s = %.3f of raw TCP\n",
               r->one_med * 1e3, r->one_gbps, r->one_ratio);
    printf("  client: hand encode+decode %.2f%% of RTT; its payload copies "
           "(%s) ~%.1f%% (at %.1f GB/s memcpy)\n", r->encdec_share * 100,
           o->raw ? "request and response in ps_rpc_invoke"
           : o->shm ? "none: psd reads the gradient and writes the value in "
                      "shared memory"
           : "the pulled value into its destination; the push is sent in place",
           r->copy_share_est * 100, c->memcpy_gbps);
    printf("  per call (push or pull): psd %.2f ms CPU, %.0f page faults; client "
           "%.2f ms CPU, %.0f page faults (the payload spans %zu pages)\n",
           r->psd_cpu_ms, r->psd_faults, r->cli_cpu_ms, r->cli_faults,
           r->bytes / 4096);
}

/* The TCP ceiling again, after the cases: on a shared host a large drift
 * says the ratios above are only as good as the quietest moment. */
static void print_recheck(const struct opts *o, const struct ceilings *c)
{
    double drift = c->tcp_gbps > 0 ? c->tcp_end_gbps / c->tcp_gbps : 0;
    if (o->json) {
        printf("{\"bench\":\"pushpull\",\"kind\":\"ceilings_recheck\","
               "\"tcp_end_gbps\":%.3f,\"tcp_end_runs_gbps\":[%.3f,%.3f,%.3f],"
               "\"drift\":%.3f}\n", c->tcp_end_gbps, c->tcp_end_runs[0],
               c->tcp_end_runs[1], c->tcp_end_runs[2], drift);
        return;
    }
    printf("\nloopback TCP again after the cases: %.2f GB/s (%.2f %.2f %.2f), "
           "%.2fx the first%s\n", c->tcp_end_gbps, c->tcp_end_runs[0],
           c->tcp_end_runs[1], c->tcp_end_runs[2], drift,
           drift < 0.8 || drift > 1.25 ? ": the host is noisy, compare ratios "
                                         "with care" : "");
}

static int print_stats(const struct opts *o, int port, pid_t pid)
{
    char target[64];
    snprintf(target, sizeof target, "%s:%d", o->host, port);
    ps_rpc_client *cli = NULL;
    ps_rpc_client_opts co = {.token = bench_token};
    int rc = ps_rpc_client_create(target, &co, &cli);
    if (rc != 0)
        return rc;
    Ps__V1__StatsRequest req = PS__V1__STATS_REQUEST__INIT;
    void *out = NULL;
    ps_rpc_status st;
    rc = ps_rpc_invoke_pb(cli, METHOD_STATS, &req, &ps__v1__stats_response__descriptor,
                          &out, 0, &st);
    ps_rpc_client_destroy(cli);
    if (rc != 0) {
        fprintf(stderr, "pushpull: Stats: %s (%s)\n", ps_rpc_code_name(st.code),
                st.message);
        return rc;
    }
    Ps__V1__StatsResponse *s = out;
    uint64_t held = s->value_bytes + s->slot_bytes;
    uint64_t over = s->resident_bytes > s->fixed_overhead_bytes
                        ? s->resident_bytes - s->fixed_overhead_bytes : 0;
    double ratio = held > 0 ? (double)over / (double)held : 0;
    /* Peak, and what the resident bytes are: heap and other anonymous
     * memory, or file pages (LMDB's map, the binary and its libraries). */
    uint64_t peak = proc_status_bytes(pid, "VmHWM");
    uint64_t anon = proc_status_bytes(pid, "RssAnon");
    uint64_t file = proc_status_bytes(pid, "RssFile");
    if (o->json) {
        printf("{\"bench\":\"pushpull\",\"kind\":\"psd_stats\",\"variables\":%" PRIu64
               ",\"value_bytes\":%" PRIu64 ",\"slot_bytes\":%" PRIu64
               ",\"resident_bytes\":%" PRIu64 ",\"fixed_overhead_bytes\":%" PRIu64
               ",\"memory_ratio\":%.4f,\"peak_resident_bytes\":%" PRIu64
               ",\"resident_anon_bytes\":%" PRIu64 ",\"resident_file_bytes\":%" PRIu64
               ",\"pushes\":%" PRIu64 ",\"pulls\":%" PRIu64 ",\"commits\":%" PRIu64
               ",\"uptime_seconds\":%.1f}\n",
               s->variables, s->value_bytes, s->slot_bytes, s->resident_bytes,
               s->fixed_overhead_bytes, ratio, peak, anon, file, s->pushes, s->pulls,
               s->commits,
               s->uptime_seconds);
    } else {
        const double M = 1024.0 * 1024.0;
        printf("\npsd Stats after the run: %" PRIu64 " variables, %" PRIu64
               " pushes, %" PRIu64 " pulls, %" PRIu64 " LMDB commits in %.1f s\n",
               s->variables, s->pushes, s->pulls, s->commits, s->uptime_seconds);
        printf("  resident %.1f MiB (peak %.1f MiB), fixed overhead %.1f MiB, "
               "value+slot %.1f MiB (%.1f + %.1f)\n",
               (double)s->resident_bytes / M, (double)peak / M,
               (double)s->fixed_overhead_bytes / M, (double)held / M,
               (double)s->value_bytes / M, (double)s->slot_bytes / M);
        printf("  resident now: %.1f MiB anonymous (heap, gRPC and request buffers), "
               "%.1f MiB file-backed (LMDB map, binaries)\n", (double)anon / M,
               (double)file / M);
        printf("  memory ratio (resident - fixed) / (value + slot) = %.2f\n", ratio);
    }
    protobuf_c_message_free_unpacked(out, NULL);
    return 0;
}

/* ---- the 4 MiB case with mutual TLS -------------------------------------- */

/* Runs pscerts --out dir for psd (127.0.0.1) and a client. Returns 0, or
 * -1 after a line saying why. */
static int make_certs(const struct opts *o, const char *dir)
{
    char path[PATH_MAX];
    if (o->pscerts != NULL) {
        snprintf(path, sizeof path, "%s", o->pscerts);
    } else {
        /* <build>/server/psd -> <build>/tools/pscerts */
        snprintf(path, sizeof path, "%s", o->psd);
        char *slash = strrchr(path, '/');
        *(slash != NULL ? slash : path) = '\0';
        slash = strrchr(path, '/');
        size_t at = slash != NULL ? (size_t)(slash - path) + 1 : 0;
        snprintf(path + at, sizeof path - at, "%stools/pscerts", at ? "" : "../");
    }
    pid_t pid = fork();
    if (pid == 0) {
        int null = open("/dev/null", O_WRONLY);
        if (null >= 0)
            dup2(null, 1);
        execl(path, path, "--out", dir, "psd=localhost,127.0.0.1", "client",
              (char *)NULL);
        _exit(127);
    }
    int status = 0;
    if (pid < 0 || waitpid(pid, &status, 0) < 0 || !WIFEXITED(status) ||
        WEXITSTATUS(status) != 0) {
        fprintf(stderr, "pushpull tls: %s could not make certificates (status %d)\n",
                path, WIFEXITED(status) ? WEXITSTATUS(status) : -1);
        return -1;
    }
    return 0;
}

static void print_tls(const struct opts *o, const struct case_result *plain,
                      const struct case_result *tls)
{
    double r = plain->gbps > 0 ? tls->gbps / plain->gbps : 0;
    if (o->json) {
        printf("{\"bench\":\"pushpull\",\"kind\":\"tls\",\"bytes\":%zu,"
               "\"plaintext_gbps\":%.4f,\"tls_gbps\":%.4f,\"ratio\":%.4f,"
               "\"plaintext_rtt_median_ms\":%.4f,\"tls_rtt_median_ms\":%.4f,"
               "\"plaintext_psd_cpu_ms_per_call\":%.4f,\"tls_psd_cpu_ms_per_call\":%.4f,"
               "\"plaintext_client_cpu_ms_per_call\":%.4f,"
               "\"tls_client_cpu_ms_per_call\":%.4f}\n",
               tls->bytes, plain->gbps, tls->gbps, r, plain->rtt_med * 1e3,
               tls->rtt_med * 1e3, plain->psd_cpu_ms, tls->psd_cpu_ms,
               plain->cli_cpu_ms, tls->cli_cpu_ms);
    } else {
        printf("\n4 MiB x 1 stream, plaintext then mutual TLS (a second psd, "
               "P-256 certificates):\n");
        print_case(o, plain);
        print_case(o, tls);
        printf("  RTT median %.3f ms plaintext, %.3f ms TLS; per call psd %.2f vs "
               "%.2f ms CPU, client %.2f vs %.2f ms\n", plain->rtt_med * 1e3,
               tls->rtt_med * 1e3, plain->psd_cpu_ms, tls->psd_cpu_ms,
               plain->cli_cpu_ms, tls->cli_cpu_ms);
    }
    printf("pushpull tls: 4 MiB push+pull %.2f of plaintext\n", r);
    fflush(stdout);
}

/* The 4 MiB case on the plaintext psd, then at once on a psd with mutual
 * TLS, so that both see the same host. Skipped (0) with --shm, whose data
 * bypasses the transport, and --no-tls. Returns 0, or nonzero when a case
 * fails. */
static int run_tls(const struct opts *o, const struct psd_proc *plain_psd,
                   const struct ceilings *lim)
{
    if (o->shm || o->no_tls)
        return 0;
    if (o->npsd_args + 6 > MAX_PSD_ARGS) {
        fprintf(stderr, "pushpull tls: skipped: too many --psd-arg\n");
        return 0;
    }
    const char *tmp = getenv("TMPDIR");
    char dir[256], f[5][320];
    snprintf(dir, sizeof dir, "%s/pushpull-tls.XXXXXX",
             tmp != NULL && tmp[0] != '\0' ? tmp : "/tmp");
    if (mkdtemp(dir) == NULL) {
        fprintf(stderr, "pushpull tls: %s: %s\n", dir, strerror(errno));
        return 1;
    }
    static const char *const names[5] = {"psd.pem", "psd.key", "ca.pem",
                                         "client.pem", "client.key"};
    for (int i = 0; i < 5; i++)
        snprintf(f[i], sizeof f[i], "%s/%s", dir, names[i]);
    struct case_result plain, tls;
    struct psd_proc tp;
    int rc = make_certs(o, dir);
    if (rc == 0)
        rc = run_case(o, plain_psd->pid, plain_psd->port, TARGET_BYTES, 1, lim, &plain);
    struct opts to = *o;
    const char *flags[6] = {"--tls-cert", f[0], "--tls-key", f[1], "--tls-ca", f[2]};
    for (int i = 0; i < 6; i++)
        to.psd_args[to.npsd_args++] = flags[i];
    ps_tls_opts copts = {.cert = f[3], .key = f[4], .ca = f[2]};
    to.tls = &copts;
    if (rc == 0 && (rc = psd_start(&to, &tp)) == 0) {
        rc = run_case(&to, tp.pid, tp.port, TARGET_BYTES, 1, lim, &tls);
        int st = psd_stop(&tp);
        if (rc == 0 && st != 0)
            rc = PS_EUNAVAIL;
    }
    /* The plaintext psd is again the one an interruption takes down. */
    snprintf(live_root, sizeof live_root, "%s", plain_psd->root);
    atomic_store(&live_psd, plain_psd->pid);
    nftw(dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    if (rc == 0)
        print_tls(o, &plain, &tls);
    return rc;
}

/* ---- --link: across a shaped veth link (pushpull_link.c) ----------------- */

/* Issue 31's targets on the link: float32 push+pull at this share of raw
 * TCP, bfloat16 this many times float32's throughput. */
#define LINK_TARGET_F32 0.85
#define LINK_TARGET_BF16 1.8

#define ECHO_ROUNDS 60

static void print_link(const struct opts *o, const struct ceilings *lim,
                       const struct case_result *f32, const struct case_result *bf16)
{
    double ceiling = lim->tcp_gbps;
    double x = bf16->rtt_med > 0 ? f32->rtt_med / bf16->rtt_med : 0;
    if (o->json)
        printf("{\"bench\":\"pushpull\",\"kind\":\"link\",\"rate_gbit\":%g,"
               "\"tcp_gbps\":%.4f,\"tcp_runs_gbps\":[%.4f,%.4f,%.4f],"
               "\"tcp_end_gbps\":%.4f,\"f32_rtt_median_ms\":%.4f,"
               "\"f32_gbps\":%.4f,\"f32_ratio_link\":%.4f,"
               "\"bf16_rtt_median_ms\":%.4f,\"bf16_vs_f32\":%.4f,"
               "\"tcp_echo_ms\":%.4f,\"tcp_echo_half_ms\":%.4f}\n",
               o->link_gbit, ceiling, lim->tcp_runs[0], lim->tcp_runs[1],
               lim->tcp_runs[2], lim->tcp_end_gbps, f32->rtt_med * 1e3, f32->gbps,
               f32->ratio, bf16->rtt_med * 1e3, x, lim->echo_ms, lim->echo_half_ms);
    else
        printf("\nlink %g Gbit/s (tc tbf, 256 KB burst): raw TCP %.3f GB/s "
               "(%.3f %.3f %.3f), %.3f GB/s again after the cases\n"
               "raw TCP there and back (%d rounds on one connection, median): 4 MiB "
               "each way %.2f ms, 2 MiB %.2f ms: half the bytes at most %.2fx here; "
               "psd f32 %.2f of it, bf16 %.2f\n", o->link_gbit,
               ceiling, lim->tcp_runs[0], lim->tcp_runs[1], lim->tcp_runs[2],
               lim->tcp_end_gbps, ECHO_ROUNDS, lim->echo_ms, lim->echo_half_ms,
               lim->echo_ms / lim->echo_half_ms, lim->echo_ms / (f32->rtt_med * 1e3),
               lim->echo_half_ms / (bf16->rtt_med * 1e3));
    /* The last line rounds as the issue wrote it (X.Xx): a 1.79x shows as
     * 1.8x there, so the targets are judged here on the unrounded ratios. */
    if (!o->json)
        printf("targets: f32 %.3f of the link (at least %.2f: %s), bf16 %.3fx f32 (at least "
               "%.1fx: %s)\n", f32->ratio, LINK_TARGET_F32,
               f32->ratio >= LINK_TARGET_F32 ? "met" : "not met", x, LINK_TARGET_BF16,
               x >= LINK_TARGET_BF16 ? "met" : "not met");
    printf("pushpull link: %g Gbit/s 4 MiB push+pull f32 %.2f ms (%.2f of link), "
           "bf16 %.2f ms (%.1fx f32)\n", o->link_gbit, f32->rtt_med * 1e3, f32->ratio,
           bf16->rtt_med * 1e3, x);
    fflush(stdout);
}

/* --link: the link set up, psd at its far end, the cases over it beside raw
 * TCP over the same link, then everything removed (also when a step fails;
 * the signal thread removes it on a signal). Returns the exit status: 77
 * without root (after one line), 1 on a failure. */
static int link_main(struct opts *o)
{
    char err[256];
    int rc = link_setup(o->link, err, sizeof err);
    if (rc == 77) {
        printf("pushpull link: skipped: %s\n", err);
        return 77;
    }
    if (rc != 0) {
        fprintf(stderr, "pushpull link: %s\n", err);
        return 1;
    }
    o->host = link_psd_host();
    o->psd_netns = link_psd_netns();
    struct ceilings lim = {0};
    struct psd_proc p;
    struct case_result target = {0}, half = {0};
    bool have_target = false;
    /* memcpy on this host, then everything after in the client's namespace. */
    if ((rc = measure_ceilings(o, &lim, false)) != 0 ||
        (rc = link_enter(link_client_netns())) != 0 ||
        (rc = link_tcp_ceiling(o, lim.tcp_runs, &lim.tcp_gbps)) != 0 ||
        (rc = link_tcp_echo(TARGET_BYTES, ECHO_ROUNDS, &lim.echo_ms)) != 0 ||
        (rc = link_tcp_echo(TARGET_BYTES / 2, ECHO_ROUNDS, &lim.echo_half_ms)) != 0) {
        fprintf(stderr, "pushpull link: measuring raw TCP: %s\n", ps_strerror(rc));
        goto teardown;
    }
    if ((rc = psd_start(o, &p)) != 0)
        goto teardown;
    if (!o->json)
        printf("psd pid %d on %s:%d in namespace %s, the client in %s\n"
               "bf16 kernels here: narrowing %s, widening %s, error feedback %s\n\n",
               (int)p.pid, o->host, p.port, o->psd_netns, link_client_netns(),
               ps_half_kernel(PS_HALF_BF16, false), ps_half_kernel(PS_HALF_BF16, true),
               ps_half_ef_kernel(PS_HALF_BF16));
    print_ceilings(o, &lim);
    for (int i = 0; i < o->nsizes && rc == 0; i++) {
        for (int j = 0; j < o->nstreams && rc == 0; j++) {
            struct case_result r;
            if ((rc = run_case(o, p.pid, p.port, o->sizes[i], o->streams[j], &lim,
                               &r)) != 0)
                break;
            print_case(o, &r);
            if (r.bytes == TARGET_BYTES && r.streams == 1) {
                target = r;
                have_target = true;
            }
        }
    }
    /* The same 4 MiB with bfloat16 on the wire (psclient's error feedback):
     * half the bytes each way. */
    if (rc == 0 && have_target) {
        struct opts ho = *o;
        ho.wire_dtype = 3;
        if ((rc = run_case(&ho, p.pid, p.port, TARGET_BYTES, 1, &lim, &half)) == 0 &&
            !o->json)
            printf("bf16 on the wire:\n");
        if (rc == 0)
            print_case(o, &half);
    }
    /* The same two cases with each tensor in one call, beside the pieces
     * (psclient's default, or --pieces): what cutting them buys. */
    if (rc == 0 && have_target && !(o->pieces_set && o->piece_bytes == 0)) {
        struct opts wo = *o;
        wo.pieces_set = true;
        wo.piece_bytes = 0;
        struct case_result whole;
        for (int dtype = 0; dtype <= 3 && rc == 0; dtype += 3) {
            wo.wire_dtype = dtype;
            if ((rc = run_case(&wo, p.pid, p.port, TARGET_BYTES, 1, &lim, &whole)) != 0)
                break;
            if (!o->json)
                printf("%s, one call per tensor (--pieces 0):\n", dtype ? "bf16" : "f32");
            print_case(o, &whole);
        }
    }
    if (rc == 0 && link_tcp_ceiling(o, lim.tcp_end_runs, &lim.tcp_end_gbps) != 0)
        lim.tcp_end_gbps = 0;
    if (rc == 0)
        rc = print_stats(o, p.port, p.pid);
    int st = psd_stop(&p);
    if (st != 0 && rc == 0) {
        fprintf(stderr, "pushpull link: psd exited with status %d\n", st);
        rc = PS_EUNAVAIL;
    }
    if (rc == 0 && have_target)
        print_link(o, &lim, &target, &half);
teardown:
    link_cleanup_now();
    return rc == 0 ? 0 : 1;
}

int main(int argc, char **argv)
{
    struct opts o;
    parse_opts(argc, argv, &o);
    if (access(o.psd, X_OK) != 0) {
        fprintf(stderr, "pushpull: psd not found at %s (build it, or pass --psd)\n",
                o.psd);
        return 2;
    }
    /* Every thread started from here on inherits the mask; the signal
     * thread alone takes these signals. */
    static sigset_t stop_set;
    sigemptyset(&stop_set);
    sigaddset(&stop_set, SIGINT);
    sigaddset(&stop_set, SIGTERM);
    sigaddset(&stop_set, SIGHUP);
    pthread_sigmask(SIG_BLOCK, &stop_set, NULL);
    signal(SIGPIPE, SIG_IGN);
    pthread_t sig_thread;
    if (pthread_create(&sig_thread, NULL, signal_main, &stop_set) != 0) {
        fprintf(stderr, "pushpull: cannot start the signal thread\n");
        return 1;
    }
    pthread_detach(sig_thread);
    if (o.link != NULL)
        return link_main(&o);

    struct ceilings lim = {0};
    int rc = measure_ceilings(&o, &lim, false);
    if (rc != 0) {
        fprintf(stderr, "pushpull: measuring the ceilings: %s\n", ps_strerror(rc));
        return 1;
    }
    struct psd_proc p;
    if (psd_start(&o, &p) != 0)
        return 1;
    if (!o.json)
        printf("psd pid %d on 127.0.0.1:%d, data in %s\n\n", (int)p.pid, p.port,
               p.data);
    print_ceilings(&o, &lim);

    struct case_result target = {0};
    bool have_target = false;
    for (int i = 0; i < o.nsizes && rc == 0; i++) {
        for (int j = 0; j < o.nstreams && rc == 0; j++) {
            struct case_result r;
            rc = run_case(&o, p.pid, p.port, o.sizes[i], o.streams[j], &lim, &r);
            if (rc != 0)
                break;
            print_case(&o, &r);
            if (r.bytes == TARGET_BYTES && r.streams == 1) {
                target = r;
                have_target = true;
            }
        }
    }
    if (rc == 0 && have_target)
        print_target(&o, &target, &lim);
    if (rc == 0 && measure_ceilings(&o, &lim, true) == 0)
        print_recheck(&o, &lim);
    if (rc == 0)
        rc = print_stats(&o, p.port, p.pid);
    if (rc == 0)
        rc = run_tls(&o, &p, &lim);
    int st = psd_stop(&p);
    if (st != 0) {
        fprintf(stderr, "pushpull: psd exited with status %d\n", st);
        if (rc == 0)
            rc = PS_EUNAVAIL;
    }
    return rc == 0 ? 0 : 1;
}
