/*
 * shard.c - variables in memory, write-behind to LMDB, and the
 * ParameterServer service. See shard.h for the model and the promise.
 *
 * Locks, always taken in this order and never the reverse:
 *   s->table_lock (rw)  the set of variables; handlers hold it for reading
 *                       for their whole run, CreateVariable and Restore for
 *                       writing
 *   v->lock (rw)        one variable's value, slots, version and sync state
 *   s->wait_mu          the lists of calls that wait (pulls for a version,
 *                       sync pushes for their step, durable pushes for their
 *                       commit)
 * The store's write transaction is begun only with table_lock held.
 */
#include "shard.h"

#include "assist.h"
#include "checkpoint.h"
#include "clock.h"
#include "errors.h"
#include "init.h"
#include "log.h"
#include "optim.h"
#include "pbcur.h"
#include "ps.pb-c.h"
#include "store.h"
#include "tensor.h"
#include "wire.h"

#include <errno.h>
#include <malloc.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAX_NAME 255
#define SWEEP_MS 20
/* Values at least this big are sent in place by Pull (see psd_var.vmsg). */
#define VALUE_IN_PLACE_MIN ((size_t)64 << 10)

typedef struct pending_push pending_push;
static void pending_free(pending_push *p);

/* Shared memory unused this long is unmapped (shmmap.h); checked every
 * SHM_SWEEP_MS. */
#define SHM_IDLE_MS 60000
#define SHM_SWEEP_MS 5000

struct ckpt_job {
    struct ckpt_job *next;
    ps_rpc_call *call;
    uint64_t step;
    size_t keep_at_least;
    enum { JOB_CHECKPOINT, JOB_RESTORE, JOB_CREATE } kind;
    uint8_t *req;        /* JOB_CREATE: the request's bytes */
    size_t len;
};

/* A new variable at least this big (values and slots) is created on the
 * checkpoint thread: drawing its initial values takes ~10 ms per 4 MiB,
 * which the serving thread would otherwise spend holding every call. */
#define CREATE_OFFLOAD_BYTES ((size_t)4 << 20)

typedef struct psd_var {
    char *name;
    uint8_t *spec_blob; /* packed, normalized VariableSpec */
    size_t spec_len;
    Ps__V1__VariableSpec *spec; /* unpacked spec_blob */
    int64_t shape[PSD_MAX_DIMS];
    int ndim;
    size_t n;
    psd_opt opt;
    int nslots;
    int consistency;
    uint32_t num_workers;

    pthread_rwlock_t lock;
    float *value; /* (n); in vmsg when it is set */
    /* A big value lives in a refcounted message buffer, so that a Pull's
     * reply sends it in place; an update while a reply still holds it
     * writes a copy (value_writable). Small values are plain memory, copied
     * into replies. */
    ps_rpc_msg *vmsg;
    float *slots; /* (nslots, n) */
    uint64_t version;
    uint64_t step;            /* sync: the step being aggregated */
    uint64_t persisted_version;
    uint64_t persisted_step;
    /* sync aggregation of `step` */
    float *accum;             /* (n), allocated on first sync push */
    uint32_t accum_count;
    uint32_t *pushed;         /* workers that pushed this step */
    size_t npushed, cap_pushed;
} psd_var;

/* A push that answers later: sync parts waiting for their step, or a
 * durable push waiting for its commit. */
struct pending_push {
    pending_push *next;       /* in s->pending (sync) or s->durable list */
    ps_rpc_call *call;
    size_t nitems;
    size_t nleft;             /* sync parts not yet applied */
    psd_var **vars;           /* (nitems) */
    uint64_t *versions;       /* (nitems) */
    uint64_t step;
    uint64_t seq;             /* durable: the apply sequence to commit */
    bool return_values;       /* answer with the values too */
    psd_shm_ref *into;        /* (nitems) or NULL: values into shared memory */
    bool armed;               /* its handler is done with it (under wait_mu) */
};

typedef struct pull_waiter {
    struct pull_waiter *next;
    ps_rpc_call *call;
    size_t nitems;
    psd_var **vars;
    uint64_t *min_versions;
    psd_shm_ref *into;        /* (nitems) or NULL: values into shared memory */
} pull_waiter;

struct psd_shard {
    psd_shard_opts o;
    char *data_dir;
    char *ckpt_root;     /* checkpoints live in <ckpt_root>/checkpoints */
    psd_store *store;

    pthread_rwlock_t table_lock;
    psd_var **vars; /* sorted by name */
    size_t nvars, cap;

    pthread_mutex_t wait_mu;
    pthread_cond_t wait_cond;
    pull_waiter *waiters;
    pending_push *pending;   /* sync pushes waiting for their step */
    pending_push *durable;   /* pushes waiting for a commit */
    bool stopping;
    bool closing;

    pthread_mutex_t flush_mu; /* one flush at a time */
    pthread_cond_t flush_cond;
    bool flush_requested;
    pthread_t flusher, sweeper, ckpt_thread;
    /* Checkpoints run on their own thread (a copy of a big store takes
     * seconds, and the completion-queue thread must go on serving). */
    pthread_mutex_t ckpt_mu;
    pthread_cond_t ckpt_cond;
    struct ckpt_job *ckpt_jobs, **ckpt_tail;
    bool ckpt_quit;
    bool restoring;      /* a Restore writes the live store (table_lock) */
    bool ckpt_started;
    bool threads_started;

    atomic_uint_fast64_t apply_seq;   /* updates applied, ever */
    atomic_uint_fast64_t committed_seq;
    atomic_uint_fast64_t pushes, pulls, bytes_in, bytes_out, stale, bad,
        nonfinite, commits, last_ckpt, shm_bytes;
    uint64_t fixed_overhead;
    int64_t started_ms;
    psd_assist *assist;  /* takes half of a big push (assist.h) */
    psd_shmmap *shm;     /* co-located clients' shared memory (shmmap.h) */
};

/* ---- small helpers ---------------------------------------------------- */

uint64_t psd_rss_bytes(void)
{
    /* Less RssShmem: the pages of co-located clients' shared memory that
     * psd maps are theirs (psd itself makes no shared memory). */
    FILE *f = fopen("/proc/self/status", "r");
    if (f == NULL)
        return 0;
    char line[256];
    unsigned long long rss = 0, shmem = 0, v;
    while (fgets(line, sizeof line, f) != NULL) {
        if (sscanf(line, "VmRSS: %llu kB", &v) == 1)
            rss = v;
        else if (sscanf(line, "RssShmem: %llu kB", &v) == 1)
            shmem = v;
    }
    fclose(f);
    return (rss > shmem ? rss - shmem : 0) * 1024ull;
}

static float *alloc_floats(size_t n)
{
    size_t bytes = (n * sizeof(float) + 63) & ~(size_t)63;
    return aligned_alloc(64, bytes ? bytes : 64);
}

static const char *dtype_name(int d)
{
    switch (d) {
    case PS__V1__DTYPE__DTYPE_FLOAT32: return "FLOAT32";
    case PS__V1__DTYPE__DTYPE_FLOAT16: return "FLOAT16";
    case PS__V1__DTYPE__DTYPE_BFLOAT16: return "BFLOAT16";
    case PS__V1__DTYPE__DTYPE_UNSPECIFIED: return "DTYPE_UNSPECIFIED";
    default: return "an unknown dtype";
    }
}

static const char *consistency_name(int c)
{
    return c == PSD_SYNC ? "SYNC" : c == PSD_ASYNC ? "ASYNC" : "BOUNDED_STALENESS";
}

/* A name is 1..255 bytes of UTF-8 with no control characters. Returns NULL
 * or what is wrong with it. */
static const char *name_problem(const char *name, size_t len)
{
    if (len == 0)
        return "is empty";
    if (len > MAX_NAME)
        return "is longer than 255 bytes";
    const unsigned char *p = (const unsigned char *)name, *end = p + len;
    while (p < end) {
        unsigned c = *p;
        if (c < 0x20 || c == 0x7f)
            return "contains a control character";
        int extra = c < 0x80 ? 0 : (c >> 5) == 6 ? 1 : (c >> 4) == 14 ? 2
                  : (c >> 3) == 30 ? 3 : -1;
        if (extra < 0 || end - p <= extra)
            return "is not valid UTF-8";
        for (int i = 1; i <= extra; i++)
            if ((p[i] & 0xc0) != 0x80)
                return "is not valid UTF-8";
        p += extra + 1;
    }
    return NULL;
}

/* Binary search; name need not be NUL-terminated. Called with table_lock. */
static psd_var *find_var(psd_shard *s, const char *name, size_t len,
                         size_t *pos)
{
    size_t lo = 0, hi = s->nvars;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        const char *m = s->vars[mid]->name;
        size_t mlen = strlen(m);
        size_t k = mlen < len ? mlen : len;
        int c = k > 0 ? memcmp(m, name, k) : 0;
        if (c == 0)
            c = mlen < len ? -1 : mlen > len ? 1 : 0;
        if (c == 0) {
            if (pos)
                *pos = mid;
            return s->vars[mid];
        }
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (pos)
        *pos = lo;
    return NULL;
}

static void var_free(psd_var *v)
{
    if (v == NULL)
        return;
    free(v->name);
    free(v->spec_blob);
    if (v->spec)
        ps__v1__variable_spec__free_unpacked(v->spec, NULL);
    if (v->vmsg != NULL)
        ps_rpc_msg_unref(v->vmsg);
    else
        free(v->value);
    free(v->slots);
    free(v->accum);
    free(v->pushed);
    pthread_rwlock_destroy(&v->lock);
    free(v);
}

/* ---- specs ------------------------------------------------------------ */

/* Fills the defaults the proto documents into a spec, in place, so that
 * two specs that mean the same thing compare equal. The optimizer and
 * initializer sub-messages are replaced by owned copies when absent. */
struct norm_spec {
    Ps__V1__VariableSpec spec;
    Ps__V1__Optimizer opt;
    Ps__V1__Initializer init;
};

static void normalize(psd_shard *s, const Ps__V1__VariableSpec *in,
                      struct norm_spec *out)
{
    out->spec = *in;
    ps__v1__optimizer__init(&out->opt);
    ps__v1__initializer__init(&out->init);
    if (in->optimizer)
        out->opt = *in->optimizer;
    if (in->initializer)
        out->init = *in->initializer;
    out->opt.base.unknown_fields = NULL;
    out->opt.base.n_unknown_fields = 0;
    out->init.base.unknown_fields = NULL;
    out->init.base.n_unknown_fields = 0;
    out->spec.base.unknown_fields = NULL;
    out->spec.base.n_unknown_fields = 0;

    psd_opt o = {.kind = (enum psd_opt_kind)out->opt.kind,
                 .lr = out->opt.learning_rate,
                 .momentum = out->opt.momentum,
                 .nesterov = out->opt.nesterov,
                 .initial_accumulator = out->opt.initial_accumulator,
                 .beta1 = out->opt.beta1,
                 .beta2 = out->opt.beta2,
                 .epsilon = out->opt.epsilon};
    psd_opt_defaults(&o);
    out->opt.learning_rate = o.lr;
    /* Only the optimizer's own hyper-parameters are kept, so that an
     * irrelevant field cannot make two SGD specs differ. */
    out->opt.momentum = o.kind == PSD_OPT_MOMENTUM ? o.momentum : 0;
    out->opt.nesterov = o.kind == PSD_OPT_MOMENTUM ? o.nesterov : 0;
    out->opt.initial_accumulator = o.kind == PSD_OPT_ADAGRAD ? o.initial_accumulator : 0;
    out->opt.beta1 = o.kind == PSD_OPT_ADAM ? o.beta1 : 0;
    out->opt.beta2 = o.kind == PSD_OPT_ADAM ? o.beta2 : 0;
    out->opt.epsilon = o.kind == PSD_OPT_ADAM || o.kind == PSD_OPT_ADAGRAD ? o.epsilon : 0;

    psd_init i = {.kind = (enum psd_init_kind)out->init.kind,
                  .value = out->init.value,
                  .minval = out->init.minval,
                  .maxval = out->init.maxval,
                  .mean = out->init.mean,
                  .stddev = out->init.stddev,
                  .seed = out->init.seed};
    psd_init_defaults(&i);
    out->init.value = i.kind == PSD_INIT_CONSTANT ? i.value : 0;
    out->init.minval = i.kind == PSD_INIT_UNIFORM ? i.minval : 0;
    out->init.maxval = i.kind == PSD_INIT_UNIFORM ? i.maxval : 0;
    bool normal = i.kind == PSD_INIT_NORMAL || i.kind == PSD_INIT_TRUNCATED_NORMAL;
    out->init.mean = normal ? i.mean : 0;
    out->init.stddev = normal ? i.stddev : 0;
    out->init.seed = i.kind >= PSD_INIT_UNIFORM ? i.seed : 0;
    if (i.kind != PSD_INIT_GLOROT_UNIFORM || out->init.fan_in <= 0 ||
        out->init.fan_out <= 0)
        out->init.fan_in = out->init.fan_out = 0;

    out->spec.optimizer = &out->opt;
    out->spec.initializer = &out->init;
    if (out->spec.consistency == PS__V1__CONSISTENCY__CONSISTENCY_DEFAULT)
        out->spec.consistency = (Ps__V1__Consistency)s->o.consistency;
    if (out->spec.consistency == PS__V1__CONSISTENCY__SYNC) {
        if (out->spec.num_workers == 0)
            out->spec.num_workers = s->o.workers;
    } else {
        out->spec.num_workers = 0;
    }
    out->spec.staleness = 0;
}

static void opt_from_pb(const Ps__V1__Optimizer *p, psd_opt *o)
{
    *o = (psd_opt){.kind = (enum psd_opt_kind)p->kind,
                   .lr = p->learning_rate,
                   .momentum = p->momentum,
                   .nesterov = p->nesterov,
                   .initial_accumulator = p->initial_accumulator,
                   .beta1 = p->beta1,
                   .beta2 = p->beta2,
                   .epsilon = p->epsilon};
    psd_opt_defaults(o);
}

static void init_from_pb(const Ps__V1__Initializer *p, psd_init *i)
{
    *i = (psd_init){.kind = (enum psd_init_kind)p->kind,
                    .value = p->value,
                    .minval = p->minval,
                    .maxval = p->maxval,
                    .mean = p->mean,
                    .stddev = p->stddev,
                    .seed = p->seed};
    psd_init_defaults(i);
}

/* Validates a normalized spec. Returns 0, or a project error with one line
 * in why. */
static int validate_spec(psd_shard *s, const Ps__V1__VariableSpec *sp,
                         size_t *n_out, char *why, size_t whylen)
{
    const char *np = name_problem(sp->name, strlen(sp->name));
    if (np != NULL) {
        snprintf(why, whylen, "variable name %s", np);
        return PS_EINVAL_ARG;
    }
    if (sp->sparse) {
        snprintf(why, whylen, "variable '%s': sparse variables are not served "
                 "yet", sp->name);
        return PS_EDTYPE;
    }
    if (sp->dtype != PS__V1__DTYPE__DTYPE_FLOAT32) {
        snprintf(why, whylen, "variable '%s': dtype %s is not served; use "
                 "DTYPE_FLOAT32", sp->name, dtype_name(sp->dtype));
        return PS_EDTYPE;
    }
    if (sp->n_shape > PSD_MAX_DIMS) {
        snprintf(why, whylen, "variable '%s': %zu dimensions, at most %d",
                 sp->name, sp->n_shape, PSD_MAX_DIMS);
        return PS_ESHAPE;
    }
    size_t n = 1;
    for (size_t i = 0; i < sp->n_shape; i++) {
        if (sp->shape[i] <= 0) {
            snprintf(why, whylen, "variable '%s': dimension %zu is %lld; every "
                     "dimension must be >= 1", sp->name, i,
                     (long long)sp->shape[i]);
            return PS_ESHAPE;
        }
        if ((uint64_t)sp->shape[i] > SIZE_MAX / 8 / n) {
            snprintf(why, whylen, "variable '%s': shape overflows", sp->name);
            return PS_ESHAPE;
        }
        n *= (size_t)sp->shape[i];
    }
    /* The value must fit one Pull response with its header. */
    if (n * sizeof(float) + 4096 > s->o.max_message_bytes) {
        snprintf(why, whylen, "variable '%s': %zu bytes cannot travel in one "
                 "message (limit %zu bytes; raise --max-message)", sp->name,
                 n * sizeof(float), s->o.max_message_bytes);
        return PS_ESHAPE;
    }
    if ((unsigned)sp->optimizer->kind > PS__V1__OPTIMIZER__KIND__ADAM) {
        snprintf(why, whylen, "variable '%s': unknown optimizer kind %d",
                 sp->name, (int)sp->optimizer->kind);
        return PS_EINVAL_ARG;
    }
    psd_opt o;
    opt_from_pb(sp->optimizer, &o);
    char w[200];
    if (psd_opt_validate(&o, w, sizeof w) != 0) {
        snprintf(why, whylen, "variable '%s': optimizer: %s", sp->name, w);
        return PS_EINVAL_ARG;
    }
    if ((unsigned)sp->initializer->kind > PS__V1__INITIALIZER__KIND__GLOROT_UNIFORM) {
        snprintf(why, whylen, "variable '%s': unknown initializer kind %d",
                 sp->name, (int)sp->initializer->kind);
        return PS_EINVAL_ARG;
    }
    psd_init in;
    init_from_pb(sp->initializer, &in);
    if (psd_init_validate(&in, w, sizeof w) != 0) {
        snprintf(why, whylen, "variable '%s': initializer: %s", sp->name, w);
        return PS_EINVAL_ARG;
    }
    if (sp->consistency == PS__V1__CONSISTENCY__BOUNDED_STALENESS) {
        snprintf(why, whylen, "variable '%s': BOUNDED_STALENESS is not served "
                 "yet; use ASYNC or SYNC", sp->name);
        return PS_EINVAL_ARG;
    }
    if (sp->consistency != PS__V1__CONSISTENCY__ASYNC &&
        sp->consistency != PS__V1__CONSISTENCY__SYNC) {
        snprintf(why, whylen, "variable '%s': unknown consistency %d",
                 sp->name, (int)sp->consistency);
        return PS_EINVAL_ARG;
    }
    if (sp->consistency == PS__V1__CONSISTENCY__SYNC &&
        (sp->num_workers == 0 || sp->num_workers > 65536)) {
        snprintf(why, whylen, "variable '%s': SYNC needs num_workers in "
                 "[1, 65536], got %u", sp->name, sp->num_workers);
        return PS_EINVAL_ARG;
    }
    *n_out = n;
    return 0;
}

/* Names the first difference between two normalized specs. */
static void spec_diff(const Ps__V1__VariableSpec *a, const Ps__V1__VariableSpec *b,
                      char *out, size_t len)
{
    char sa[128], sb[128];
    if (a->n_shape != b->n_shape ||
        memcmp(a->shape, b->shape, a->n_shape * sizeof *a->shape) != 0) {
        ps_tensor_shape_str(a->shape, (int)a->n_shape, sa, sizeof sa);
        ps_tensor_shape_str(b->shape, (int)b->n_shape, sb, sizeof sb);
        snprintf(out, len, "shape %s, existing %s", sb, sa);
    } else if (a->optimizer->kind != b->optimizer->kind) {
        psd_opt oa, ob;
        opt_from_pb(a->optimizer, &oa);
        opt_from_pb(b->optimizer, &ob);
        snprintf(out, len, "optimizer %s, existing %s", psd_opt_name(ob.kind),
                 psd_opt_name(oa.kind));
    } else if (a->optimizer->learning_rate != b->optimizer->learning_rate) {
        snprintf(out, len, "learning_rate %g, existing %g",
                 (double)b->optimizer->learning_rate,
                 (double)a->optimizer->learning_rate);
    } else if (a->initializer->kind != b->initializer->kind ||
               a->initializer->seed != b->initializer->seed) {
        snprintf(out, len, "initializer %s seed %llu, existing %s seed %llu",
                 psd_init_name((enum psd_init_kind)b->initializer->kind),
                 (unsigned long long)b->initializer->seed,
                 psd_init_name((enum psd_init_kind)a->initializer->kind),
                 (unsigned long long)a->initializer->seed);
    } else if (a->consistency != b->consistency ||
               a->num_workers != b->num_workers) {
        snprintf(out, len, "consistency %s/%u workers, existing %s/%u workers",
                 consistency_name(b->consistency), b->num_workers,
                 consistency_name(a->consistency), a->num_workers);
    } else {
        snprintf(out, len, "optimizer or initializer parameters differ");
    }
}

/* Builds a variable from a normalized, validated spec (value initialized)
 * or from a stored record (value copied). */
static int var_new(const Ps__V1__VariableSpec *sp, size_t n, psd_var **out)
{
    psd_var *v = calloc(1, sizeof *v);
    if (v == NULL)
        return -ENOMEM;
    pthread_rwlock_init(&v->lock, NULL);
    v->spec_len = ps__v1__variable_spec__get_packed_size(sp);
    v->spec_blob = malloc(v->spec_len ? v->spec_len : 1);
    v->name = strdup(sp->name);
    if (v->spec_blob == NULL || v->name == NULL)
        goto nomem;
    ps__v1__variable_spec__pack(sp, v->spec_blob);
    v->spec = ps__v1__variable_spec__unpack(NULL, v->spec_len, v->spec_blob);
    if (v->spec == NULL)
        goto nomem;
    v->ndim = (int)sp->n_shape;
    for (int i = 0; i < v->ndim; i++)
        v->shape[i] = sp->shape[i];
    v->n = n;
    opt_from_pb(v->spec->optimizer, &v->opt);
    v->nslots = psd_opt_slot_count(&v->opt);
    v->consistency = (int)v->spec->consistency;
    v->num_workers = v->spec->num_workers;
    if (n * sizeof(float) >= VALUE_IN_PLACE_MIN) {
        v->vmsg = ps_rpc_msg_new(n * sizeof(float));
        v->value = v->vmsg ? (float *)(void *)ps_rpc_msg_data(v->vmsg) : NULL;
    } else {
        v->value = alloc_floats(n);
    }
    v->slots = v->nslots ? alloc_floats(n * (size_t)v->nslots) : NULL;
    if (v->value == NULL || (v->nslots && v->slots == NULL))
        goto nomem;
    v->persisted_version = UINT64_MAX; /* not in the store yet */
    *out = v;
    return 0;
nomem:
    var_free(v);
    return -ENOMEM;
}

static void var_rec(const psd_var *v, psd_var_rec *r)
{
    *r = (psd_var_rec){.name = v->name, .spec = v->spec_blob,
                       .spec_len = v->spec_len, .version = v->version,
                       .step = v->step, .value = v->value, .n = v->n,
                       .slots = v->slots, .nslots = v->nslots};
}

static int table_insert(psd_shard *s, psd_var *v, size_t pos)
{
    if (s->nvars == s->cap) {
        size_t ncap = s->cap ? s->cap * 2 : 16;
        psd_var **nv = realloc(s->vars, ncap * sizeof *nv);
        if (nv == NULL)
            return -ENOMEM;
        s->vars = nv;
        s->cap = ncap;
    }
    memmove(&s->vars[pos + 1], &s->vars[pos], (s->nvars - pos) * sizeof *s->vars);
    s->vars[pos] = v;
    s->nvars++;
    return 0;
}

/* ---- loading ---------------------------------------------------------- */

struct load_ctx {
    psd_var **vars;
    size_t n, cap;
};

static int load_visit(void *ctx, const psd_var_rec *r)
{
    struct load_ctx *lc = ctx;
    Ps__V1__VariableSpec *sp =
        ps__v1__variable_spec__unpack(NULL, r->spec_len, r->spec);
    if (sp == NULL || sp->optimizer == NULL || sp->initializer == NULL ||
        strcmp(sp->name, r->name) != 0) {
        ps_log_error("store: variable '%s': its spec does not parse", r->name);
        if (sp)
            ps__v1__variable_spec__free_unpacked(sp, NULL);
        return PS_ECORRUPT;
    }
    size_t n = 1;
    for (size_t i = 0; i < sp->n_shape; i++)
        n *= (size_t)(sp->shape[i] > 0 ? sp->shape[i] : 0);
    psd_var *v = NULL;
    int rc = n == r->n && sp->n_shape <= PSD_MAX_DIMS ? var_new(sp, n, &v)
                                                      : PS_ECORRUPT;
    ps__v1__variable_spec__free_unpacked(sp, NULL);
    if (rc == PS_ECORRUPT)
        ps_log_error("store: variable '%s': %zu stored elements do not match "
                     "its shape", r->name, r->n);
    if (rc != 0)
        return rc;
    if (r->nslots != v->nslots) {
        ps_log_error("store: variable '%s': %d stored slots, its optimizer "
                     "has %d", r->name, r->nslots, v->nslots);
        var_free(v);
        return PS_ECORRUPT;
    }
    memcpy(v->value, r->value, n * sizeof(float));
    if (v->nslots)
        memcpy(v->slots, r->slots, n * (size_t)v->nslots * sizeof(float));
    v->version = v->persisted_version = r->version;
    v->step = v->persisted_step = r->step;
    if (lc->n == lc->cap) {
        size_t ncap = lc->cap ? lc->cap * 2 : 16;
        psd_var **nv = realloc(lc->vars, ncap * sizeof *nv);
        if (nv == NULL) {
            var_free(v);
            return -ENOMEM;
        }
        lc->vars = nv;
        lc->cap = ncap;
    }
    lc->vars[lc->n++] = v;
    return 0;
}

static int load_store(psd_store *st, struct load_ctx *lc)
{
    memset(lc, 0, sizeof *lc);
    int rc = psd_store_load(st, load_visit, lc);
    if (rc != 0) {
        for (size_t i = 0; i < lc->n; i++)
            var_free(lc->vars[i]);
        free(lc->vars);
        memset(lc, 0, sizeof *lc);
    }
    return rc;
}

/* ---- flushing --------------------------------------------------------- */

static void answer_durable(psd_shard *s, uint64_t upto);

/* Writes every changed variable in one transaction. Called with flush_mu
 * held. */
static int flush_locked(psd_shard *s)
{
    uint64_t seq = atomic_load(&s->apply_seq);
    pthread_rwlock_rdlock(&s->table_lock);
    size_t nv = s->nvars;
    uint64_t *snap_v = malloc((nv ? nv : 1) * 2 * sizeof *snap_v);
    if (snap_v == NULL) {
        pthread_rwlock_unlock(&s->table_lock);
        return -ENOMEM;
    }
    psd_store_txn *t = NULL;
    int rc = 0;
    size_t written = 0;
    for (size_t i = 0; i < nv && rc == 0; i++) {
        psd_var *v = s->vars[i];
        pthread_rwlock_rdlock(&v->lock);
        snap_v[2 * i] = v->version;
        snap_v[2 * i + 1] = v->step;
        if (v->version != v->persisted_version || v->step != v->persisted_step) {
            if (t == NULL)
                rc = psd_store_begin(s->store, &t);
            if (rc == 0) {
                psd_var_rec r;
                var_rec(v, &r);
                rc = psd_store_put(t, &r);
                written++;
            }
        }
        pthread_rwlock_unlock(&v->lock);
    }
    if (t != NULL) {
        if (rc == 0)
            rc = psd_store_commit(t);
        else
            psd_store_abort(t);
        if (rc == 0) {
            atomic_fetch_add(&s->commits, 1);
            for (size_t i = 0; i < nv; i++) {
                psd_var *v = s->vars[i];
                pthread_rwlock_wrlock(&v->lock);
                v->persisted_version = snap_v[2 * i];
                v->persisted_step = snap_v[2 * i + 1];
                pthread_rwlock_unlock(&v->lock);
            }
        }
    }
    pthread_rwlock_unlock(&s->table_lock);
    free(snap_v);
    if (rc == 0) {
        atomic_store(&s->committed_seq, seq);
        answer_durable(s, seq);
    } else {
        ps_log_err(rc, "flush of %zu variable(s) to LMDB failed", written);
    }
    return rc;
}

int psd_shard_flush(psd_shard *s)
{
    pthread_mutex_lock(&s->flush_mu);
    int rc = flush_locked(s);
    pthread_mutex_unlock(&s->flush_mu);
    return rc;
}

/* Hands back to the kernel the memory malloc keeps after a burst of big
 * messages: gRPC reads each request into fresh slices, and once freed
 * glibc keeps them in its arenas (its mmap threshold rises to the biggest
 * freed block), so resident memory would stay at the burst's peak. At most
 * once a second, and only after traffic; the next burst pays a page fault
 * per 4 KiB again, a few ms a second at most. */
#define TRIM_EVERY_MS 1000

static void maybe_trim(psd_shard *s, int64_t *last_ms, uint64_t *last_bytes)
{
    int64_t now = ps_now_ms();
    uint64_t bytes = atomic_load(&s->bytes_in) + atomic_load(&s->bytes_out);
    if (now - *last_ms < TRIM_EVERY_MS || bytes == *last_bytes)
        return;
    malloc_trim(0);
    *last_ms = now;
    *last_bytes = bytes;
}

static void *flusher_main(void *arg)
{
    psd_shard *s = arg;
    pthread_setname_np(pthread_self(), "psd-flush");
    int64_t trimmed_ms = ps_now_ms();
    uint64_t trimmed_bytes = 0;
    pthread_mutex_lock(&s->flush_mu);
    while (!s->closing) {
        struct timespec until = ps_time_after_ms(CLOCK_REALTIME,
                                                 s->o.commit_interval_ms);
        while (!s->closing && !s->flush_requested)
            if (pthread_cond_timedwait(&s->flush_cond, &s->flush_mu, &until) ==
                ETIMEDOUT)
                break;
        s->flush_requested = false;
        if (atomic_load(&s->apply_seq) != atomic_load(&s->committed_seq))
            flush_locked(s);
        maybe_trim(s, &trimmed_ms, &trimmed_bytes);
    }
    pthread_mutex_unlock(&s->flush_mu);
    return NULL;
}

static void request_flush(psd_shard *s)
{
    pthread_mutex_lock(&s->flush_mu);
    s->flush_requested = true;
    pthread_cond_signal(&s->flush_cond);
    pthread_mutex_unlock(&s->flush_mu);
}

/* ---- answering pulls -------------------------------------------------- */

/* Room for one value's header: tags and lengths, a 255-byte name, eight
 * dimensions. */
#define VALUE_HDR_MAX 512

/* Writes the PullResponse bytes of v up to its data (values[i] tag and
 * length, name, version, value's tag and length, dtype, shape, data's tag
 * and length) at p; returns the end. The encoding is protobuf-c's. */
static uint8_t *value_header(uint8_t *p, const psd_var *v, int field,
                             const psd_shm_ref *into)
{
    size_t nbytes = v->n * sizeof(float), shape_len = 0;
    for (int d = 0; d < v->ndim; d++)
        shape_len += ps_pb_varint_len((uint64_t)v->shape[d]);
    size_t into_len = into ? ps_shm_ref_len(into->name, into->offset, into->length) : 0;
    size_t tensor_len = 2 + (v->ndim ? 1 + ps_pb_varint_len(shape_len) + shape_len : 0) +
                        (into ? 1 + ps_pb_varint_len(into_len) + into_len
                              : nbytes ? 1 + ps_pb_varint_len(nbytes) + nbytes : 0);
    size_t name_len = strlen(v->name);
    size_t vv_len = 1 + ps_pb_varint_len(name_len) + name_len +
                    (v->version ? 1 + ps_pb_varint_len(v->version) : 0) +
                    1 + ps_pb_varint_len(tensor_len) + tensor_len;
    *p++ = (uint8_t)((field << 3) | 2); /* PullResponse or PushResponse .values */
    p = ps_pb_put_varint(p, vv_len);
    *p++ = (1 << 3) | 2; /* VariableValue.name */
    p = ps_pb_put_varint(p, name_len);
    memcpy(p, v->name, name_len);
    p += name_len;
    if (v->version) {
        *p++ = (2 << 3) | 0; /* VariableValue.version */
        p = ps_pb_put_varint(p, v->version);
    }
    *p++ = (3 << 3) | 2; /* VariableValue.value */
    p = ps_pb_put_varint(p, tensor_len);
    *p++ = (1 << 3) | 0; /* Tensor.dtype */
    *p++ = PS__V1__DTYPE__DTYPE_FLOAT32;
    if (v->ndim) {
        *p++ = (2 << 3) | 2; /* Tensor.shape, packed */
        p = ps_pb_put_varint(p, shape_len);
        for (int d = 0; d < v->ndim; d++)
            p = ps_pb_put_varint(p, (uint64_t)v->shape[d]);
    }
    if (into != NULL) {
        /* Tensor.shm: where the bytes went. */
        p = ps_shm_ref_put(p, 4, into->name, into->offset, into->length);
    } else if (nbytes) {
        *p++ = (3 << 3) | 2; /* Tensor.data */
        p = ps_pb_put_varint(p, nbytes);
    }
    return p;
}

/* Resolves the references of into[0..n) (NULL: none) that are set, into
 * dst; fails call and returns false when one does not resolve or does not
 * fit its variable. Called between psd_shmmap_enter and _leave. */
static bool resolve_into(psd_shard *s, ps_rpc_call *call, psd_var **vars,
                         const psd_shm_ref *into, size_t n, void **dst)
{
    for (size_t i = 0; i < n; i++) {
        dst[i] = NULL;
        if (into == NULL || !into[i].set)
            continue;
        char err[400];
        int code = psd_shmmap_get(s->shm, &into[i], &dst[i], err, sizeof err);
        if (code == 0 && into[i].length != vars[i]->n * sizeof(float)) {
            snprintf(err, sizeof err, "variable '%s': shared memory for its value "
                     "has %llu bytes, the value %zu", vars[i]->name,
                     (unsigned long long)into[i].length, vars[i]->n * sizeof(float));
            code = PS_RPC_INVALID_ARGUMENT;
        }
        if (code != 0) {
            if (code == PS_RPC_INVALID_ARGUMENT)
                atomic_fetch_add(&s->bad, 1);
            ps_rpc_fail(call, code, "%s", err);
            return false;
        }
    }
    return true;
}

/* Whether every set reference of into resolves and fits (resolve_into),
 * before a call changes or waits for anything; fails call if not. */
static bool into_ok(psd_shard *s, ps_rpc_call *call, psd_var **vars,
                    const psd_shm_ref *into, size_t n)
{
    void **dst = calloc(n ? n : 1, sizeof *dst);
    if (dst == NULL) {
        ps_rpc_fail(call, PS_RPC_RESOURCE_EXHAUSTED, "out of memory");
        return false;
    }
    psd_shmmap_enter(s->shm);
    bool ok = resolve_into(s, call, vars, into, n, dst);
    psd_shmmap_leave(s->shm);
    free(dst);
    return ok;
}

/* Answers with prefix (copied) followed by the values of vars as repeated
 * field `field` of the response: the headers copied, big values in place
 * (the reply holds a reference to each, and an update meanwhile writes a
 * copy), small ones copied. Takes each variable's read lock until the reply
 * is built. Returns the value bytes sent. */
static uint64_t reply_with_values(psd_shard *s, ps_rpc_call *call,
                                  const uint8_t *prefix, size_t prefix_len,
                                  int field, psd_var **vars, size_t n,
                                  const psd_shm_ref *into)
{
    uint8_t *hdr = malloc((n ? n : 1) * VALUE_HDR_MAX);
    ps_rpc_part *parts = calloc(2 * n + 1, sizeof *parts);
    /* With shared memory: each value's destination, and whether its lock
     * was let go early (one allocation; none for an inline reply). */
    void **dst = NULL;
    bool *unlocked = NULL;
    if (into != NULL && (dst = calloc(n ? n : 1, sizeof *dst + sizeof *unlocked)) != NULL)
        unlocked = (bool *)(void *)(dst + n);
    if (hdr == NULL || parts == NULL || (into != NULL && dst == NULL)) {
        free(hdr);
        free(parts);
        free(dst);
        ps_rpc_fail(call, PS_RPC_RESOURCE_EXHAUSTED, "out of memory building "
                    "the response");
        return 0;
    }
    if (into != NULL) {
        psd_shmmap_enter(s->shm);
        if (!resolve_into(s, call, vars, into, n, dst)) {
            psd_shmmap_leave(s->shm);
            free(hdr);
            free(parts);
            free(dst);
            return 0;
        }
    }
    uint64_t bytes = 0;
    int np = 0;
    if (prefix_len > 0)
        parts[np++] = (ps_rpc_part){prefix, prefix_len, NULL, NULL};
    for (size_t i = 0; i < n; i++) {
        psd_var *v = vars[i];
        pthread_rwlock_rdlock(&v->lock);
        uint8_t *h = hdr + i * VALUE_HDR_MAX;
        const psd_shm_ref *to = dst != NULL && dst[i] != NULL ? &into[i] : NULL;
        parts[np++] = (ps_rpc_part){h, (size_t)(value_header(h, v, field, to) - h),
                                    NULL, NULL};
        size_t nbytes = v->n * sizeof(float);
        if (to != NULL && v->vmsg != NULL) {
            /* The one copy, straight to the client, from the value held by
             * a reference and not the lock: an update meanwhile writes a
             * copy (value_writable), so a big copy does not stall pushes. */
            ps_rpc_msg *m = v->vmsg;
            const float *src = v->value;
            ps_rpc_msg_ref(m);
            pthread_rwlock_unlock(&v->lock);
            unlocked[i] = true;
            memcpy(dst[i], src, nbytes);
            ps_rpc_msg_unref(m);
            atomic_fetch_add(&s->shm_bytes, nbytes);
        } else if (to != NULL) {
            memcpy(dst[i], v->value, nbytes); /* small: under the lock */
            atomic_fetch_add(&s->shm_bytes, nbytes);
        } else if (v->vmsg != NULL) {
            ps_rpc_msg_ref(v->vmsg);
            parts[np++] = (ps_rpc_part){v->value, nbytes, ps_rpc_msg_release, v->vmsg};
        } else {
            parts[np++] = (ps_rpc_part){v->value, nbytes, NULL, NULL};
        }
        bytes += nbytes;
    }
    ps_rpc_reply_parts(call, parts, np);
    for (size_t i = 0; i < n; i++)
        if (unlocked == NULL || !unlocked[i])
            pthread_rwlock_unlock(&vars[i]->lock);
    if (into != NULL)
        psd_shmmap_leave(s->shm);
    free(hdr);
    free(parts);
    free(dst);
    return bytes;
}

/* Answers a Pull with the values of vars. */
static void reply_values(psd_shard *s, ps_rpc_call *call, psd_var **vars,
                         size_t n, const psd_shm_ref *into)
{
    uint64_t bytes = reply_with_values(s, call, NULL, 0, 1, vars, n, into);
    atomic_fetch_add(&s->pulls, 1);
    atomic_fetch_add(&s->bytes_out, bytes);
}

static void waiter_free(pull_waiter *w)
{
    free(w->vars);
    free(w->min_versions);
    free(w->into);
    free(w);
}

/* Returns the first item below its min_version, or n if none. Reads the
 * versions without the variables' locks: the sweeper calls it holding
 * wait_mu, which pushes take while holding a variable's lock, so taking the
 * lock here could deadlock. Versions only rise, and are written atomically. */
static size_t first_unmet(psd_var **vars, const uint64_t *minv, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (__atomic_load_n(&vars[i]->version, __ATOMIC_ACQUIRE) < minv[i])
            return i;
    return n;
}

static void fail_unmet(ps_rpc_call *call, psd_var *v, uint64_t minv)
{
    pthread_rwlock_rdlock(&v->lock);
    uint64_t ver = v->version;
    pthread_rwlock_unlock(&v->lock);
    ps_rpc_fail(call, PS_RPC_DEADLINE_EXCEEDED,
                "variable '%s' is at version %llu; the deadline passed waiting "
                "for version %llu", v->name, (unsigned long long)ver,
                (unsigned long long)minv);
}

static void wake_waiters(psd_shard *s)
{
    pthread_mutex_lock(&s->wait_mu);
    if (s->waiters != NULL)
        pthread_cond_signal(&s->wait_cond);
    pthread_mutex_unlock(&s->wait_mu);
}

/* The sweeper answers pulls whose versions arrived and fails waits whose
 * deadline passed or whose client went away. The table read lock keeps the
 * variables alive while it looks at them. */
static void *sweeper_main(void *arg)
{
    psd_shard *s = arg;
    pthread_setname_np(pthread_self(), "psd-sweep");
    int64_t last_shm_sweep = ps_now_ms();
    pthread_mutex_lock(&s->wait_mu);
    while (!s->closing) {
        struct timespec until = ps_time_after_ms(CLOCK_REALTIME, SWEEP_MS);
        pthread_cond_timedwait(&s->wait_cond, &s->wait_mu, &until);
        if (s->closing)
            break;
        pull_waiter *ready = NULL, *expired = NULL;
        for (pull_waiter **pw = &s->waiters; *pw != NULL;) {
            pull_waiter *w = *pw;
            if (first_unmet(w->vars, w->min_versions, w->nitems) == w->nitems) {
                *pw = w->next;
                w->next = ready;
                ready = w;
            } else if (ps_rpc_call_cancelled(w->call) || s->stopping) {
                *pw = w->next;
                w->next = expired;
                expired = w;
            } else {
                pw = &w->next;
            }
        }
        pending_push *gone = NULL;
        for (pending_push **pp = &s->pending; *pp != NULL;) {
            pending_push *p = *pp;
            if (p->armed && (ps_rpc_call_cancelled(p->call) || s->stopping)) {
                *pp = p->next;
                p->next = gone;
                gone = p;
            } else {
                pp = &p->next;
            }
        }
        bool stopping = s->stopping;
        pthread_mutex_unlock(&s->wait_mu);

        pthread_rwlock_rdlock(&s->table_lock);
        while (ready != NULL) {
            pull_waiter *w = ready;
            ready = w->next;
            reply_values(s, w->call, w->vars, w->nitems, w->into);
            waiter_free(w);
        }
        while (expired != NULL) {
            pull_waiter *w = expired;
            expired = w->next;
            if (stopping) {
                ps_rpc_fail(w->call, PS_RPC_UNAVAILABLE, "psd is shutting down");
            } else {
                size_t i = first_unmet(w->vars, w->min_versions, w->nitems);
                if (i < w->nitems)
                    fail_unmet(w->call, w->vars[i], w->min_versions[i]);
                else
                    reply_values(s, w->call, w->vars, w->nitems, w->into);
            }
            waiter_free(w);
        }
        pthread_rwlock_unlock(&s->table_lock);
        if (ps_now_ms() - last_shm_sweep >= SHM_SWEEP_MS) {
            psd_shmmap_sweep(s->shm, SHM_IDLE_MS);
            last_shm_sweep = ps_now_ms();
        }
        while (gone != NULL) {
            pending_push *p = gone;
            gone = p->next;
            if (stopping)
                ps_rpc_fail(p->call, PS_RPC_UNAVAILABLE, "psd is shutting down");
            else
                ps_rpc_fail(p->call, PS_RPC_DEADLINE_EXCEEDED,
                            "step %llu: the deadline passed waiting for the other "
                            "workers' pushes (the gradient was kept; push the "
                            "same step again to wait again)",
                            (unsigned long long)p->step);
            /* Off every list: nothing else can reach it. */
            pending_free(p);
        }
        pthread_mutex_lock(&s->wait_mu);
    }
    pthread_mutex_unlock(&s->wait_mu);
    return NULL;
}

/* ---- pushes that wait ------------------------------------------------- */

static void pending_free(pending_push *p)
{
    free(p->vars);
    free(p->versions);
    free(p->into);
    free(p);
}

/* Answers a push with its versions, and with the values when it asked.
 * The caller keeps the variables alive: it holds table_lock, or flush_mu
 * (Restore takes both before it frees any). */
static void reply_push(psd_shard *s, pending_push *p)
{
    if (!p->return_values) {
        Ps__V1__PushResponse resp = PS__V1__PUSH_RESPONSE__INIT;
        resp.n_versions = p->nitems;
        resp.versions = p->versions;
        ps_rpc_reply_pb(p->call, &resp);
    } else {
        /* PushResponse.versions, packed, then .values. */
        size_t vlen = 0;
        for (size_t i = 0; i < p->nitems; i++)
            vlen += ps_pb_varint_len(p->versions[i]);
        uint8_t *pre = malloc(1 + 10 + vlen), *q = pre;
        if (pre == NULL) {
            ps_rpc_fail(p->call, PS_RPC_RESOURCE_EXHAUSTED, "Push: out of memory");
        } else {
            *q++ = (1 << 3) | 2;
            q = ps_pb_put_varint(q, vlen);
            for (size_t i = 0; i < p->nitems; i++)
                q = ps_pb_put_varint(q, p->versions[i]);
            uint64_t bytes = reply_with_values(s, p->call, pre, (size_t)(q - pre),
                                               2, p->vars, p->nitems, p->into);
            atomic_fetch_add(&s->bytes_out, bytes);
            free(pre);
        }
    }
    atomic_fetch_add(&s->pushes, 1);
}

/* Answers the durable pushes whose updates are all committed. */
static void answer_durable(psd_shard *s, uint64_t upto)
{
    pthread_mutex_lock(&s->wait_mu);
    pending_push *done = NULL;
    for (pending_push **pp = &s->durable; *pp != NULL;) {
        pending_push *p = *pp;
        if (p->seq <= upto) {
            *pp = p->next;
            p->next = done;
            done = p;
        } else {
            pp = &p->next;
        }
    }
    pthread_mutex_unlock(&s->wait_mu);
    while (done != NULL) {
        pending_push *p = done;
        done = p->next;
        reply_push(s, p);
        pending_free(p);
    }
}

/* A push whose every part is applied: answer now, or after its commit. */
static void push_complete(psd_shard *s, pending_push *p)
{
    if (s->o.durable) {
        pthread_mutex_lock(&s->wait_mu);
        p->seq = atomic_load(&s->apply_seq);
        p->next = s->durable;
        s->durable = p;
        pthread_mutex_unlock(&s->wait_mu);
        request_flush(s);
        return;
    }
    reply_push(s, p);
    pending_free(p);
}

/* ---- the service ------------------------------------------------------ */

static void count_bad(psd_shard *s)
{
    atomic_fetch_add(&s->bad, 1);
}

static void ckpt_enqueue(psd_shard *s, struct ckpt_job *j);

/* CreateVariable; on_job_thread: run by the checkpoint thread, where a big
 * new variable is handed (CREATE_OFFLOAD_BYTES). */
static void create_variable_run(psd_shard *s, ps_rpc_call *call, const uint8_t *req,
                                size_t len, bool on_job_thread)
{
    Ps__V1__CreateVariableRequest *r =
        ps__v1__create_variable_request__unpack(NULL, len, req);
    if (r == NULL) {
        count_bad(s);
        ps_rpc_fail(call, PS_RPC_INVALID_ARGUMENT,
                    "CreateVariable: %zu bytes that are not a "
                    "CreateVariableRequest", len);
        return;
    }
    if (r->spec == NULL) {
        count_bad(s);
        ps_rpc_fail(call, PS_RPC_INVALID_ARGUMENT, "CreateVariable: spec is missing");
        ps__v1__create_variable_request__free_unpacked(r, NULL);
        return;
    }
    struct norm_spec ns;
    normalize(s, r->spec, &ns);
    char why[512];
    size_t n = 0;
    int rc = validate_spec(s, &ns.spec, &n, why, sizeof why);
    if (rc != 0) {
        count_bad(s);
        ps_rpc_fail(call, rc == PS_EDTYPE && ns.spec.sparse ? PS_RPC_UNIMPLEMENTED
                                                            : PS_RPC_INVALID_ARGUMENT,
                    "%s", why);
        ps__v1__create_variable_request__free_unpacked(r, NULL);
        return;
    }
    if (s->stopping) {
        ps_rpc_fail(call, PS_RPC_UNAVAILABLE, "psd is shutting down");
        ps__v1__create_variable_request__free_unpacked(r, NULL);
        return;
    }

    /* Fast answer for an existing variable, without building a new one. */
    pthread_rwlock_rdlock(&s->table_lock);
    psd_var *old = find_var(s, ns.spec.name, strlen(ns.spec.name), NULL);
    bool exists = old != NULL;
    pthread_rwlock_unlock(&s->table_lock);

    psd_var *v = NULL;
    size_t nslots = 0;
    if (ns.spec.optimizer != NULL) {
        psd_opt o;
        opt_from_pb(ns.spec.optimizer, &o);
        nslots = (size_t)psd_opt_slot_count(&o);
    }
    if (!exists && !on_job_thread &&
        n * sizeof(float) * (1 + nslots) >= CREATE_OFFLOAD_BYTES) {
        struct ckpt_job *j = calloc(1, sizeof *j);
        uint8_t *copy = malloc(len ? len : 1);
        if (j == NULL || copy == NULL) {
            free(j);
            free(copy);
            ps_rpc_fail(call, PS_RPC_RESOURCE_EXHAUSTED, "CreateVariable: out of "
                        "memory");
        } else {
            memcpy(copy, req, len);
            *j = (struct ckpt_job){NULL, call, 0, 0, JOB_CREATE, copy, len};
            ckpt_enqueue(s, j);
        }
        ps__v1__create_variable_request__free_unpacked(r, NULL);
        return;
    }
    if (!exists) {
        rc = var_new(&ns.spec, n, &v);
        if (rc != 0) {
            ps_rpc_fail(call, PS_RPC_RESOURCE_EXHAUSTED,
                        "variable '%s': cannot allocate its %zu elements and "
                        "their optimizer slots", ns.spec.name, n);
            ps__v1__create_variable_request__free_unpacked(r, NULL);
            return;
        }
        psd_init in;
        init_from_pb(v->spec->initializer, &in);
        const Ps__V1__Initializer *pi = v->spec->initializer;
        if (pi->fan_in > 0 && pi->fan_out > 0) {
            /* A part of a split variable: the whole variable's fans. */
            int64_t fans[2] = {pi->fan_in, pi->fan_out};
            psd_init_fill(&in, v->value, v->n, fans, 2);
        } else {
            psd_init_fill(&in, v->value, v->n, v->shape, v->ndim);
        }
        if (v->nslots)
            psd_opt_init_slots(&v->opt, v->slots, v->n);
    }

    pthread_rwlock_wrlock(&s->table_lock);
    size_t pos;
    old = find_var(s, ns.spec.name, strlen(ns.spec.name), &pos);
    if (old != NULL) {
        pthread_rwlock_unlock(&s->table_lock);
        var_free(v);
        /* Compare packed normalized specs: equal bytes, equal meaning. */
        size_t plen = ps__v1__variable_spec__get_packed_size(&ns.spec);
        uint8_t *packed = malloc(plen ? plen : 1);
        bool same = packed != NULL;
        if (same) {
            ps__v1__variable_spec__pack(&ns.spec, packed);
            same = plen == old->spec_len && memcmp(packed, old->spec_blob, plen) == 0;
        }
        free(packed);
        if (same) {
            Ps__V1__CreateVariableResponse resp = PS__V1__CREATE_VARIABLE_RESPONSE__INIT;
            pthread_rwlock_rdlock(&old->lock);
            resp.version = old->version;
            pthread_rwlock_unlock(&old->lock);
            resp.created = false;
            ps_rpc_reply_pb(call, &resp);
        } else {
            char diff[300];
            spec_diff(old->spec, &ns.spec, diff, sizeof diff);
            count_bad(s);
            ps_rpc_fail(call, PS_RPC_ALREADY_EXISTS,
                        "variable '%s' already exists with a different spec: %s",
                        ns.spec.name, diff);
        }
        ps__v1__create_variable_request__free_unpacked(r, NULL);
        return;
    }
    /* A Restore is rewriting the store: a variable created now would be in
     * it but not among the restored ones. */
    if (s->restoring) {
        pthread_rwlock_unlock(&s->table_lock);
        var_free(v);
        ps_rpc_fail(call, PS_RPC_UNAVAILABLE, "variable '%s': psd is restoring a "
                    "checkpoint; create it again once that is done", ns.spec.name);
        ps__v1__create_variable_request__free_unpacked(r, NULL);
        return;
    }
    /* New: durable before it is acknowledged. */
    psd_store_txn *t;
    rc = psd_store_begin(s->store, &t);
    if (rc == 0) {
        psd_var_rec rec;
        var_rec(v, &rec);
        rc = psd_store_put(t, &rec);
        if (rc == 0)
            rc = psd_store_commit(t);
        else
            psd_store_abort(t);
    }
    if (rc == 0) {
        v->persisted_version = 0;
        rc = table_insert(s, v, pos);
    }
    pthread_rwlock_unlock(&s->table_lock);
    if (rc != 0) {
        var_free(v);
        ps_rpc_fail(call, ps_rpc_code_from_err(rc),
                    "variable '%s': cannot store it: %s", ns.spec.name,
                    ps_strerror(rc));
    } else {
        atomic_fetch_add(&s->commits, 1);
        Ps__V1__CreateVariableResponse resp = PS__V1__CREATE_VARIABLE_RESPONSE__INIT;
        resp.created = true;
        ps_rpc_reply_pb(call, &resp);
        char shp[128];
        ps_tensor_shape_str(v->shape, v->ndim, shp, sizeof shp);
        ps_log_info("created variable '%s' %s %s %s", v->name, shp,
                    psd_opt_name(v->opt.kind), consistency_name(v->consistency));
    }
    ps__v1__create_variable_request__free_unpacked(r, NULL);
}

static void create_variable(ps_rpc_call *call, const uint8_t *req, size_t len,
                            void *ctx)
{
    create_variable_run(ctx, call, req, len, false);
}

static void pull(ps_rpc_call *call, const uint8_t *req, size_t len, void *ctx)
{
    psd_shard *s = ctx;
    Ps__V1__PullRequest *r = ps__v1__pull_request__unpack(NULL, len, req);
    if (r == NULL) {
        count_bad(s);
        ps_rpc_fail(call, PS_RPC_INVALID_ARGUMENT,
                    "Pull: %zu bytes that are not a PullRequest", len);
        return;
    }
    size_t n = r->n_items;
    if (n == 0) {
        count_bad(s);
        ps_rpc_fail(call, PS_RPC_INVALID_ARGUMENT, "Pull: no items; name at "
                    "least one variable");
        ps__v1__pull_request__free_unpacked(r, NULL);
        return;
    }
    psd_var **vars = calloc(n, sizeof *vars);
    uint64_t *minv = calloc(n, sizeof *minv);
    bool any_into = false;
    for (size_t i = 0; i < n; i++)
        any_into = any_into || r->items[i]->into != NULL;
    psd_shm_ref *into = any_into ? calloc(n, sizeof *into) : NULL;
    if (vars == NULL || minv == NULL || (any_into && into == NULL)) {
        free(vars);
        free(minv);
        free(into);
        ps_rpc_fail(call, PS_RPC_RESOURCE_EXHAUSTED, "Pull: out of memory");
        ps__v1__pull_request__free_unpacked(r, NULL);
        return;
    }
    for (size_t i = 0; into != NULL && i < n; i++) {
        const Ps__V1__ShmRef *ref = r->items[i]->into;
        if (ref == NULL)
            continue;
        into[i].set = 1;
        into[i].name_len = strlen(ref->name);
        snprintf(into[i].name, sizeof into[i].name, "%s", ref->name);
        into[i].offset = ref->offset;
        into[i].length = ref->length;
    }
    pthread_rwlock_rdlock(&s->table_lock);
    for (size_t i = 0; i < n; i++) {
        const char *name = r->items[i]->name;
        vars[i] = find_var(s, name, strlen(name), NULL);
        minv[i] = r->items[i]->min_version;
        if (vars[i] == NULL) {
            count_bad(s);
            const char *np = name_problem(name, strlen(name));
            if (np != NULL)
                ps_rpc_fail(call, PS_RPC_INVALID_ARGUMENT,
                            "Pull: items[%zu]: variable name %s", i, np);
            else
                ps_rpc_fail(call, PS_RPC_NOT_FOUND,
                            "Pull: variable '%s' does not exist", name);
            goto out;
        }
        for (size_t j = 0; j < i; j++) {
            if (vars[j] == vars[i]) {
                count_bad(s);
                ps_rpc_fail(call, PS_RPC_INVALID_ARGUMENT,
                            "Pull: variable '%s' is named twice", name);
                goto out;
            }
        }
    }
    size_t unmet = first_unmet(vars, minv, n);
    if (unmet == n) {
        reply_values(s, call, vars, n, into);
    } else if (s->stopping) {
        ps_rpc_fail(call, PS_RPC_UNAVAILABLE, "psd is shutting down");
    } else if (ps_rpc_call_cancelled(call)) {
        fail_unmet(call, vars[unmet], minv[unmet]);
    } else if (into == NULL || into_ok(s, call, vars, into, n)) {
        /* (Shared memory that will not do fails the call now, not after
         * the wait; an answer at once checks it as it writes.) */
        pull_waiter *w = calloc(1, sizeof *w);
        if (w == NULL) {
            ps_rpc_fail(call, PS_RPC_RESOURCE_EXHAUSTED, "Pull: out of memory");
            goto out;
        }
        w->call = call;
        w->nitems = n;
        w->vars = vars;
        w->min_versions = minv;
        w->into = into;
        vars = NULL;
        minv = NULL;
        into = NULL;
        pthread_mutex_lock(&s->wait_mu);
        w->next = s->waiters;
        s->waiters = w;
        /* A version may have arrived between the check and the listing. */
        pthread_cond_signal(&s->wait_cond);
        pthread_mutex_unlock(&s->wait_mu);
    }
out:
    pthread_rwlock_unlock(&s->table_lock);
    free(vars);
    free(minv);
    free(into);
    ps__v1__pull_request__free_unpacked(r, NULL);
}

/* What a push handler reuses from call to call on its thread: the decoded
 * request. Freed by the thread-exit destructor of a pthread key. */
struct thread_bufs {
    psd_push_req req;
    float straddle; /* a float split between two pieces, joined */
};

static pthread_key_t bufs_key;
static pthread_once_t bufs_once = PTHREAD_ONCE_INIT;

static void bufs_free(void *p)
{
    struct thread_bufs *b = p;
    psd_push_req_free(&b->req);
    free(b);
}

static void bufs_key_make(void)
{
    pthread_key_create(&bufs_key, bufs_free);
}

static struct thread_bufs *thread_bufs(void)
{
    pthread_once(&bufs_once, bufs_key_make);
    struct thread_bufs *b = pthread_getspecific(bufs_key);
    if (b == NULL) {
        b = calloc(1, sizeof *b);
        if (b != NULL)
            pthread_setspecific(bufs_key, b);
    }
    return b;
}

/* The next floats of a gradient whose bytes the cursor c covers (a whole
 * number of floats), read in place from the piece they arrived in, at
 * whatever alignment; a float split between two pieces is joined in
 * *straddle. Returns how many floats *out holds; 0 at the end. */
static size_t grad_next(ps_pbcur *c, float *straddle, const psd_ufloat **out)
{
    const uint8_t *p;
    size_t k = ps_pbcur_peek(c, &p);
    if (k == 0)
        return 0;
    if (k < sizeof(float)) {
        ps_pbcur_take(c, straddle, sizeof(float));
        *out = straddle;
        return 1;
    }
    size_t nf = k / sizeof(float);
    *out = (const psd_ufloat *)(const void *)p;
    ps_pbcur_take(c, NULL, nf * sizeof(float));
    return nf;
}

/* Makes v's value safe to update: when a Pull's reply is still sending it
 * in place, the value moves to a copy (pooled memory, warm) and the reply
 * keeps the old bytes. Called with v->lock held for writing. */
static void value_writable(psd_var *v)
{
    if (v->vmsg == NULL || !ps_rpc_msg_shared(v->vmsg))
        return;
    size_t bytes = v->n * sizeof(float);
    ps_rpc_msg *m = ps_rpc_msg_new(bytes);
    /* Out of memory for the copy: wait for the reply to be sent instead
     * (gRPC releases it without this variable's lock). */
    for (int i = 0; m == NULL && ps_rpc_msg_shared(v->vmsg); i++) {
        if (i % 1000 == 0)
            ps_log_warn("variable '%s': no memory to copy the value a Pull is "
                        "sending; the update waits for the send", v->name);
        struct timespec ts = {0, 1000000L};
        nanosleep(&ts, NULL);
        m = ps_rpc_msg_new(bytes);
    }
    if (m == NULL)
        return;
    memcpy(ps_rpc_msg_data(m), v->value, bytes);
    ps_rpc_msg_unref(v->vmsg);
    v->vmsg = m;
    v->value = (float *)(void *)ps_rpc_msg_data(m);
}

static bool grad_finite(ps_pbcur c, float *straddle)
{
    const psd_ufloat *g;
    size_t k;
    while ((k = grad_next(&c, straddle, &g)) > 0)
        if (!psd_all_finite(g, k))
            return false;
    return true;
}

/* Applies the optimizer with gradient c to v's elements from off on, part
 * by part as the gradient arrived. Called with v->lock held for writing
 * (by this thread or the one that handed the job over). */
static void grad_apply_at(psd_var *v, ps_pbcur c, size_t off, float *straddle,
                          uint64_t t)
{
    const psd_ufloat *g;
    size_t k;
    while ((k = grad_next(&c, straddle, &g)) > 0) {
        psd_opt_apply_part(&v->opt, v->value + off,
                           v->slots ? v->slots + off : NULL, v->n, g, k, 1.0f, t);
        off += k;
    }
}

/* A gradient at least this big is checked and applied in two halves, one
 * on the helper thread when it is idle (assist.h). */
#define SPLIT_MIN_BYTES ((size_t)1 << 20)

struct half {
    psd_var *v;
    ps_pbcur c;
    size_t off; /* its first element */
    uint64_t t;
    bool ok;    /* half_check: every float finite */
    float straddle;
};

static void half_check(void *p)
{
    struct half *h = p;
    h->ok = grad_finite(h->c, &h->straddle);
}

static void half_apply(void *p)
{
    struct half *h = p;
    grad_apply_at(h->v, h->c, h->off, &h->straddle, h->t);
}

/* Splits gradient c of n floats at a cache-line boundary near its middle:
 * lo covers the elements before the returned index, hi the rest. */
static size_t split_grad(ps_pbcur c, size_t n, ps_pbcur *lo, ps_pbcur *hi)
{
    size_t mid = (n / 2) & ~(size_t)15;
    *lo = c;
    lo->left = mid * sizeof(float);
    *hi = c;
    ps_pbcur_take(hi, NULL, mid * sizeof(float));
    return mid;
}

static bool grad_finite_split(psd_shard *s, ps_pbcur c, size_t n, float *straddle)
{
    struct half h = {0};
    ps_pbcur lo;
    if (n * sizeof(float) < SPLIT_MIN_BYTES)
        return grad_finite(c, straddle);
    split_grad(c, n, &lo, &h.c);
    if (!psd_assist_try(s->assist, half_check, &h))
        return grad_finite(c, straddle);
    bool ok = grad_finite(lo, straddle);
    psd_assist_join(s->assist);
    return ok && h.ok;
}

/* Applies gradient c to v (the whole value). Called with v->lock held for
 * writing. Either way each element gets the same bits. */
static void grad_apply(psd_shard *s, psd_var *v, ps_pbcur c, float *straddle,
                       uint64_t t)
{
    struct half h = {.v = v, .t = t};
    ps_pbcur lo;
    value_writable(v);
    if (v->n * sizeof(float) < SPLIT_MIN_BYTES) {
        grad_apply_at(v, c, 0, straddle, t);
        return;
    }
    h.off = split_grad(c, v->n, &lo, &h.c);
    if (!psd_assist_try(s->assist, half_apply, &h)) {
        grad_apply_at(v, c, 0, straddle, t);
        return;
    }
    grad_apply_at(v, lo, 0, straddle, t);
    psd_assist_join(s->assist);
}

/* accum = g (first push of a step) or accum += g. */
static void grad_accumulate(float *accum, bool first, ps_pbcur c, float *straddle)
{
    const psd_ufloat *g;
    size_t k, off = 0;
    while ((k = grad_next(&c, straddle, &g)) > 0) {
        if (first)
            memcpy(accum + off, g, k * sizeof(float));
        else
            psd_accumulate(accum + off, g, k);
        off += k;
    }
}

/* Adds a worker to the step's set; false if it was there already. Called
 * with v->lock held for writing. */
static bool mark_pushed(psd_var *v, uint32_t worker)
{
    for (size_t i = 0; i < v->npushed; i++)
        if (v->pushed[i] == worker)
            return false;
    if (v->npushed == v->cap_pushed) {
        size_t ncap = v->cap_pushed ? v->cap_pushed * 2 : 8;
        uint32_t *p = realloc(v->pushed, ncap * sizeof *p);
        if (p == NULL)
            return false;
        v->pushed = p;
        v->cap_pushed = ncap;
    }
    v->pushed[v->npushed++] = worker;
    return true;
}

/* Applies the step's aggregate when every worker has pushed, and completes
 * the pushes that waited for it. Called with v->lock held for writing;
 * returns the pushes to complete (the caller does, after unlocking). */
static pending_push *maybe_apply_step(psd_shard *s, psd_var *v)
{
    if (v->accum_count < v->num_workers)
        return NULL;
    value_writable(v);
    psd_opt_apply(&v->opt, v->value, v->slots, v->accum, v->n,
                  1.0f / (float)v->accum_count, v->version + 1);
    __atomic_add_fetch(&v->version, 1, __ATOMIC_RELEASE);
    uint64_t done_step = v->step;
    v->step++;
    v->accum_count = 0;
    v->npushed = 0;
    atomic_fetch_add(&s->apply_seq, 1);
    /* Collect the pushes of this step that now have every part applied. */
    pending_push *ready = NULL;
    pthread_mutex_lock(&s->wait_mu);
    for (pending_push **pp = &s->pending; *pp != NULL;) {
        pending_push *p = *pp;
        bool mine = false;
        if (p->step == done_step)
            for (size_t i = 0; i < p->nitems; i++)
                if (p->vars[i] == v && p->versions[i] == 0) {
                    p->versions[i] = v->version;
                    p->nleft--;
                    mine = true;
                }
        if (mine && p->nleft == 0 && p->armed) {
            *pp = p->next;
            p->next = ready;
            ready = p;
        } else {
            pp = &p->next;
        }
    }
    pthread_mutex_unlock(&s->wait_mu);
    return ready;
}

/* Makes the gradients that lie in shared memory cursors over it, and keeps
 * the push's value_into references in p. Called between psd_shmmap_enter
 * and _leave; returns false with call failed. */
static bool push_shm(psd_shard *s, ps_rpc_call *call, psd_push_req *r,
                     pending_push *p, uint64_t *shm_in_out)
{
    char err[400];
    uint64_t shm_in = 0;
    for (size_t i = 0; i < r->ngrads; i++) {
        psd_wire_grad *g = &r->grads[i];
        if (g->value_into.set) {
            if (!r->return_values) {
                atomic_fetch_add(&s->bad, 1);
                ps_rpc_fail(call, PS_RPC_INVALID_ARGUMENT, "Push: grads[%zu]: "
                            "value_into without return_values", i);
                return false;
            }
            if (p->into == NULL && (p->into = calloc(r->ngrads, sizeof *p->into)) == NULL) {
                ps_rpc_fail(call, PS_RPC_RESOURCE_EXHAUSTED, "Push: out of memory");
                return false;
            }
            p->into[i] = g->value_into;
        }
        if (!g->shm.set)
            continue;
        if (g->has_data && g->nbytes > 0) {
            atomic_fetch_add(&s->bad, 1);
            ps_rpc_fail(call, PS_RPC_INVALID_ARGUMENT, "Push: grads[%zu]: the "
                        "gradient has both data and shm; send one", i);
            return false;
        }
        void *at;
        int code = psd_shmmap_get(s->shm, &g->shm, &at, err, sizeof err);
        if (code != 0) {
            if (code == PS_RPC_INVALID_ARGUMENT)
                atomic_fetch_add(&s->bad, 1);
            ps_rpc_fail(call, code, "Push: grads[%zu]: %s", i, err);
            return false;
        }
        g->shm_piece = (struct ps_piece){at, g->shm.length};
        ps_pbcur_init(&g->data, &g->shm_piece, 1);
        g->nbytes = g->shm.length;
        shm_in += g->shm.length;
    }
    *shm_in_out = shm_in;
    return true;
}

static void push_locked(psd_shard *s, ps_rpc_call *call,
                        const struct ps_piece *pieces, int npieces);

/* Push holds the shared-memory map for its whole run: its gradients may be
 * read from it, its values written into it. */
static void push(ps_rpc_call *call, const struct ps_piece *pieces, int npieces,
                 void *ctx)
{
    psd_shard *s = ctx;
    psd_shmmap_enter(s->shm);
    push_locked(s, call, pieces, npieces);
    psd_shmmap_leave(s->shm);
}

static void push_locked(psd_shard *s, ps_rpc_call *call,
                        const struct ps_piece *pieces, int npieces)
{
    char err[512];
    struct thread_bufs *tb = thread_bufs();
    if (tb == NULL) {
        ps_rpc_fail(call, PS_RPC_RESOURCE_EXHAUSTED, "Push: out of memory");
        return;
    }
    psd_push_req *r = &tb->req;
    int rc = psd_push_decode(pieces, npieces, r, err, sizeof err);
    if (rc != 0) {
        count_bad(s);
        ps_rpc_fail(call, rc == PS_EPARSE ? PS_RPC_INVALID_ARGUMENT
                                          : PS_RPC_RESOURCE_EXHAUSTED,
                    "%s", rc == PS_EPARSE ? err : "Push: out of memory");
        return;
    }
    if (r->ngrads == 0) {
        count_bad(s);
        ps_rpc_fail(call, PS_RPC_INVALID_ARGUMENT,
                    "Push: no gradients; send at least one");
        return;
    }
    if (s->stopping) {
        ps_rpc_fail(call, PS_RPC_UNAVAILABLE, "psd is shutting down");
        return;
    }
    pending_push *p = calloc(1, sizeof *p);
    if (p == NULL) {
        ps_rpc_fail(call, PS_RPC_RESOURCE_EXHAUSTED, "Push: out of memory");
        return;
    }
    p->call = call;
    p->nitems = r->ngrads;
    p->step = r->step;
    p->return_values = r->return_values;
    p->vars = calloc(r->ngrads, sizeof *p->vars);
    p->versions = calloc(r->ngrads, sizeof *p->versions);
    if (p->vars == NULL || p->versions == NULL) {
        pending_free(p);
        ps_rpc_fail(call, PS_RPC_RESOURCE_EXHAUSTED, "Push: out of memory");
        return;
    }
    uint64_t shm_in = 0;
    if (!push_shm(s, call, r, p, &shm_in)) {
        pending_free(p);
        return;
    }

    pthread_rwlock_rdlock(&s->table_lock);
    /* Phase 1: check everything, change nothing. */
    enum ps_rpc_code code = PS_RPC_OK;
    for (size_t i = 0; i < r->ngrads && code == PS_RPC_OK; i++) {
        psd_wire_grad *g = &r->grads[i];
        psd_var *v = g->name_len > PSD_WIRE_MAX_NAME
                         ? NULL : find_var(s, g->name, g->name_len, NULL);
        if (v == NULL) {
            const char *np = name_problem(g->name, g->name_len);
            code = np ? PS_RPC_INVALID_ARGUMENT : PS_RPC_NOT_FOUND;
            if (np)
                snprintf(err, sizeof err, "Push: grads[%zu]: variable name %s", i, np);
            else
                snprintf(err, sizeof err, "Push: variable '%.*s' does not exist",
                         (int)g->name_len, g->name);
            break;
        }
        p->vars[i] = v;
        for (size_t j = 0; j < i; j++)
            if (p->vars[j] == v) {
                code = PS_RPC_INVALID_ARGUMENT;
                snprintf(err, sizeof err, "Push: variable '%s' has two gradients "
                         "in one push", v->name);
            }
        if (code != PS_RPC_OK)
            break;
        if (!g->has_tensor) {
            code = PS_RPC_INVALID_ARGUMENT;
            snprintf(err, sizeof err, "variable '%s': the gradient tensor is "
                     "missing", v->name);
        } else if (g->dtype != PS__V1__DTYPE__DTYPE_FLOAT32) {
            code = PS_RPC_INVALID_ARGUMENT;
            snprintf(err, sizeof err, "variable '%s': gradient dtype is %s, "
                     "variable is FLOAT32", v->name, dtype_name(g->dtype));
        } else if (g->nbytes != v->n * sizeof(float)) {
            code = PS_RPC_INVALID_ARGUMENT;
            if (g->nbytes % sizeof(float) != 0)
                snprintf(err, sizeof err, "variable '%s': gradient has %zu bytes, "
                         "not a whole number of float32 elements", v->name, g->nbytes);
            else
                snprintf(err, sizeof err, "variable '%s': gradient has %zu elements, "
                         "variable has %zu", v->name, g->nbytes / sizeof(float), v->n);
        } else if (g->ndim != 0 &&
                   (g->ndim != v->ndim ||
                    memcmp(g->shape, v->shape, (size_t)v->ndim * sizeof *v->shape) != 0)) {
            char a[128], b[128];
            ps_tensor_shape_str(g->shape, g->ndim < 0 ? 0 : g->ndim, a, sizeof a);
            ps_tensor_shape_str(v->shape, v->ndim, b, sizeof b);
            code = PS_RPC_INVALID_ARGUMENT;
            snprintf(err, sizeof err, "variable '%s': gradient shape %s, variable "
                     "shape %s", v->name, g->ndim < 0 ? "(more than 8 dims)" : a, b);
        } else if (!s->o.allow_nonfinite && !grad_finite_split(s, g->data, v->n, &tb->straddle)) {
            code = PS_RPC_INVALID_ARGUMENT;
            atomic_fetch_add(&s->nonfinite, 1);
            snprintf(err, sizeof err, "variable '%s': the gradient holds NaN or "
                     "Inf; refused (start psd with --allow-nonfinite to accept)",
                     v->name);
        } else if (v->consistency == PSD_SYNC) {
            pthread_rwlock_rdlock(&v->lock);
            uint64_t at = v->step;
            pthread_rwlock_unlock(&v->lock);
            if (r->step < at) {
                code = PS_RPC_FAILED_PRECONDITION;
                atomic_fetch_add(&s->stale, 1);
                snprintf(err, sizeof err, "variable '%s': step %llu was already "
                         "applied (the variable is aggregating step %llu)", v->name,
                         (unsigned long long)r->step, (unsigned long long)at);
            } else if (r->step > at) {
                code = PS_RPC_FAILED_PRECONDITION;
                snprintf(err, sizeof err, "variable '%s': step %llu is ahead of "
                         "the step being aggregated, %llu", v->name,
                         (unsigned long long)r->step, (unsigned long long)at);
            }
        }
    }
    if (code != PS_RPC_OK) {
        pthread_rwlock_unlock(&s->table_lock);
        if (code == PS_RPC_INVALID_ARGUMENT)
            count_bad(s);
        ps_rpc_fail(call, code, "%s", err);
        pending_free(p);
        return;
    }
    /* Values that cannot be written where asked fail the push before it
     * changes anything. */
    if (p->into != NULL && !into_ok(s, call, p->vars, p->into, p->nitems)) {
        pthread_rwlock_unlock(&s->table_lock);
        pending_free(p);
        return;
    }

    /* Phase 2: apply. Async parts now; sync parts join their step. The
     * pending push is listed before any part joins, with every sync part
     * counted, so that whichever thread applies the last part's step sees
     * the whole count; it completes the push only once armed, that is once
     * this handler is done with it. */
    size_t nsync = 0;
    for (size_t i = 0; i < r->ngrads; i++)
        nsync += p->vars[i]->consistency == PSD_SYNC;
    if (nsync > 0) {
        pthread_mutex_lock(&s->wait_mu);
        p->nleft = nsync;
        p->next = s->pending;
        s->pending = p;
        pthread_mutex_unlock(&s->wait_mu);
    }
    uint64_t bytes = 0;
    for (size_t i = 0; i < r->ngrads; i++) {
        psd_var *v = p->vars[i];
        const ps_pbcur g = r->grads[i].data;
        bytes += v->n * sizeof(float);
        pthread_rwlock_wrlock(&v->lock);
        if (v->consistency != PSD_SYNC) {
            grad_apply(s, v, g, &tb->straddle, v->version + 1);
            p->versions[i] = __atomic_add_fetch(&v->version, 1, __ATOMIC_RELEASE);
            atomic_fetch_add(&s->apply_seq, 1);
            pthread_rwlock_unlock(&v->lock);
            continue;
        }
        /* The step may have been applied since phase 1 checked it (this
         * push was a retry the others completed): this part is then done
         * already, and must not spill into the next step's aggregate. */
        if (v->step != r->step) {
            pthread_mutex_lock(&s->wait_mu);
            p->versions[i] = v->version;
            p->nleft--;
            pthread_mutex_unlock(&s->wait_mu);
            pthread_rwlock_unlock(&v->lock);
            continue;
        }
        /* A worker pushing a step again (a retry after its deadline) adds
         * nothing and just waits for the step again. */
        if (mark_pushed(v, r->worker)) {
            if (v->accum == NULL)
                v->accum = alloc_floats(v->n);
            grad_accumulate(v->accum, v->accum_count == 0, g, &tb->straddle);
            v->accum_count++;
        }
        pending_push *ready = maybe_apply_step(s, v);
        pthread_rwlock_unlock(&v->lock);
        while (ready != NULL) {
            pending_push *q = ready;
            ready = q->next;
            push_complete(s, q);
        }
    }
    bool done = nsync == 0;
    if (nsync > 0) {
        pthread_mutex_lock(&s->wait_mu);
        p->armed = true;
        if (p->nleft == 0) {
            for (pending_push **pp = &s->pending; *pp != NULL; pp = &(*pp)->next)
                if (*pp == p) {
                    *pp = p->next;
                    break;
                }
            done = true;
        }
        pthread_mutex_unlock(&s->wait_mu);
    }
    /* Answered before table_lock is let go: a reply with values reads the
     * variables, which only a Restore (holding it for writing) frees. */
    if (done)
        push_complete(s, p);
    pthread_rwlock_unlock(&s->table_lock);
    atomic_fetch_add(&s->bytes_in, bytes);
    atomic_fetch_add(&s->shm_bytes, shm_in);
    wake_waiters(s);
}

/* The coordinator's word on how many workers are alive: every SYNC
 * variable's step now waits for that many pushes, and a step that already
 * holds them is applied at once. */
static void set_sync_workers(ps_rpc_call *call, const uint8_t *req, size_t len,
                             void *ctx)
{
    psd_shard *s = ctx;
    Ps__V1__SetSyncWorkersRequest *r =
        ps__v1__set_sync_workers_request__unpack(NULL, len, req);
    if (r == NULL || r->workers < 1 || r->workers > 65536) {
        count_bad(s);
        ps_rpc_fail(call, PS_RPC_INVALID_ARGUMENT, "SetSyncWorkers: %s",
                    r == NULL ? "bytes that are not a SetSyncWorkersRequest"
                              : "workers must be in [1, 65536]");
        if (r)
            ps__v1__set_sync_workers_request__free_unpacked(r, NULL);
        return;
    }
    uint32_t n = r->workers, previous = s->o.workers;
    ps__v1__set_sync_workers_request__free_unpacked(r, NULL);
    pthread_rwlock_rdlock(&s->table_lock);
    for (size_t i = 0; i < s->nvars; i++) {
        psd_var *v = s->vars[i];
        if (v->consistency != PSD_SYNC)
            continue;
        pthread_rwlock_wrlock(&v->lock);
        previous = v->num_workers;
        v->num_workers = n;
        pending_push *ready = v->accum_count > 0 ? maybe_apply_step(s, v) : NULL;
        pthread_rwlock_unlock(&v->lock);
        while (ready != NULL) {
            pending_push *q = ready;
            ready = q->next;
            push_complete(s, q);
        }
    }
    pthread_rwlock_unlock(&s->table_lock);
    wake_waiters(s);
    ps_log_info("sync variables now aggregate %u worker(s) per step (were %u)",
                n, previous);
    Ps__V1__SetSyncWorkersResponse resp = PS__V1__SET_SYNC_WORKERS_RESPONSE__INIT;
    resp.previous = previous;
    ps_rpc_reply_pb(call, &resp);
}

static int cmp_vars(const void *a, const void *b)
{
    return strcmp((*(psd_var *const *)a)->name, (*(psd_var *const *)b)->name);
}

static void list_variables(ps_rpc_call *call, const uint8_t *req, size_t len,
                           void *ctx)
{
    psd_shard *s = ctx;
    Ps__V1__ListVariablesRequest *r =
        ps__v1__list_variables_request__unpack(NULL, len, req);
    if (r == NULL) {
        count_bad(s);
        ps_rpc_fail(call, PS_RPC_INVALID_ARGUMENT,
                    "ListVariables: %zu bytes that are not a ListVariablesRequest", len);
        return;
    }
    ps__v1__list_variables_request__free_unpacked(r, NULL);
    pthread_rwlock_rdlock(&s->table_lock);
    size_t n = s->nvars;
    Ps__V1__ListVariablesResponse resp = PS__V1__LIST_VARIABLES_RESPONSE__INIT;
    Ps__V1__VariableInfo *infos = calloc(n ? n : 1, sizeof *infos);
    Ps__V1__VariableInfo **pi = calloc(n ? n : 1, sizeof *pi);
    if (infos == NULL || pi == NULL) {
        pthread_rwlock_unlock(&s->table_lock);
        free(infos);
        free(pi);
        ps_rpc_fail(call, PS_RPC_RESOURCE_EXHAUSTED, "ListVariables: out of memory");
        return;
    }
    for (size_t i = 0; i < n; i++) {
        psd_var *v = s->vars[i];
        ps__v1__variable_info__init(&infos[i]);
        infos[i].spec = v->spec;
        pthread_rwlock_rdlock(&v->lock);
        infos[i].version = v->version;
        pthread_rwlock_unlock(&v->lock);
        infos[i].value_bytes = v->n * sizeof(float);
        infos[i].slot_bytes = v->n * (size_t)v->nslots * sizeof(float);
        pi[i] = &infos[i];
    }
    resp.n_variables = n;
    resp.variables = pi;
    ps_rpc_reply_pb(call, &resp);
    pthread_rwlock_unlock(&s->table_lock);
    free(infos);
    free(pi);
}

static void stats(ps_rpc_call *call, const uint8_t *req, size_t len, void *ctx)
{
    psd_shard *s = ctx;
    Ps__V1__StatsRequest *r = ps__v1__stats_request__unpack(NULL, len, req);
    if (r == NULL) {
        count_bad(s);
        ps_rpc_fail(call, PS_RPC_INVALID_ARGUMENT,
                    "Stats: %zu bytes that are not a StatsRequest", len);
        return;
    }
    ps__v1__stats_request__free_unpacked(r, NULL);
    Ps__V1__StatsResponse resp = PS__V1__STATS_RESPONSE__INIT;
    pthread_rwlock_rdlock(&s->table_lock);
    resp.variables = s->nvars;
    for (size_t i = 0; i < s->nvars; i++) {
        psd_var *v = s->vars[i];
        resp.value_bytes += v->n * sizeof(float);
        resp.slot_bytes += v->n * (size_t)v->nslots * sizeof(float) +
                           (v->accum ? v->n * sizeof(float) : 0);
    }
    pthread_rwlock_unlock(&s->table_lock);
    resp.pushes = atomic_load(&s->pushes);
    resp.pulls = atomic_load(&s->pulls);
    resp.bytes_received = atomic_load(&s->bytes_in);
    resp.bytes_sent = atomic_load(&s->bytes_out);
    resp.stale_pushes_refused = atomic_load(&s->stale);
    resp.bad_requests = atomic_load(&s->bad);
    resp.nonfinite_refused = atomic_load(&s->nonfinite);
    resp.shm_bytes = atomic_load(&s->shm_bytes);
    resp.shm_regions = psd_shmmap_count(s->shm);
    resp.commits = psd_store_commits(s->store);
    resp.resident_bytes = psd_rss_bytes();
    resp.fixed_overhead_bytes = s->fixed_overhead;
    resp.uptime_seconds = (double)(ps_now_ms() - s->started_ms) / 1000.0;
    resp.last_checkpoint_step = atomic_load(&s->last_ckpt);
    ps_rpc_reply_pb(call, &resp);
}

/* Hands a Checkpoint, Restore or big CreateVariable to the checkpoint
 * thread, in order. */
static void ckpt_enqueue(psd_shard *s, struct ckpt_job *j)
{
    pthread_mutex_lock(&s->ckpt_mu);
    *s->ckpt_tail = j;
    s->ckpt_tail = &j->next;
    pthread_cond_signal(&s->ckpt_cond);
    pthread_mutex_unlock(&s->ckpt_mu);
}

static void checkpoint(ps_rpc_call *call, const uint8_t *req, size_t len, void *ctx)
{
    psd_shard *s = ctx;
    Ps__V1__CheckpointRequest *r = ps__v1__checkpoint_request__unpack(NULL, len, req);
    if (r == NULL) {
        count_bad(s);
        ps_rpc_fail(call, PS_RPC_INVALID_ARGUMENT,
                    "Checkpoint: %zu bytes that are not a CheckpointRequest", len);
        return;
    }
    struct ckpt_job *j = calloc(1, sizeof *j);
    if (j == NULL) {
        ps__v1__checkpoint_request__free_unpacked(r, NULL);
        ps_rpc_fail(call, PS_RPC_RESOURCE_EXHAUSTED, "Checkpoint: out of memory");
        return;
    }
    *j = (struct ckpt_job){NULL, call, r->step, r->keep_at_least, JOB_CHECKPOINT,
                           NULL, 0};
    ps__v1__checkpoint_request__free_unpacked(r, NULL);
    ckpt_enqueue(s, j);
}

/* Takes one checkpoint and answers its call. On the checkpoint thread. */
static void checkpoint_run(psd_shard *s, ps_rpc_call *call, uint64_t step,
                           size_t keep_at_least)
{
    /* Everything acknowledged so far goes into the store, then the copy is
     * taken from one read transaction while pushes go on. */
    pthread_mutex_lock(&s->flush_mu);
    int rc = flush_locked(s);
    uint64_t nvars = 0;
    pthread_rwlock_rdlock(&s->table_lock);
    nvars = s->nvars;
    if (step == 0)
        for (size_t i = 0; i < s->nvars; i++)
            if (s->vars[i]->version > step)
                step = s->vars[i]->version;
    pthread_rwlock_unlock(&s->table_lock);
    pthread_mutex_unlock(&s->flush_mu);
    if (rc != 0) {
        ps_rpc_fail(call, ps_rpc_code_from_err(rc),
                    "Checkpoint: flushing to LMDB failed: %s", ps_strerror(rc));
        return;
    }
    char path[4096];
    uint64_t bytes = 0;
    rc = psd_ckpt_write(s->store, s->ckpt_root, step, nvars, path, sizeof path, &bytes);
    if (rc != 0) {
        ps_rpc_fail(call, ps_rpc_code_from_err(rc),
                    "Checkpoint at step %llu in %s/checkpoints failed: %s%s",
                    (unsigned long long)step, s->ckpt_root, ps_strerror(rc),
                    rc == PS_EFULL ? " (disk full; earlier checkpoints are intact)"
                                   : "");
        return;
    }
    atomic_store(&s->last_ckpt, step);
    if (s->o.checkpoint_keep > 0)
        psd_ckpt_prune(s->ckpt_root, s->o.checkpoint_keep > keep_at_least
                                         ? s->o.checkpoint_keep : keep_at_least);
    ps_log_info("checkpoint at step %llu: %s (%llu bytes)",
                (unsigned long long)step, path, (unsigned long long)bytes);
    Ps__V1__CheckpointResponse resp = PS__V1__CHECKPOINT_RESPONSE__INIT;
    resp.path = path;
    resp.step = step;
    resp.bytes = bytes;
    ps_rpc_reply_pb(call, &resp);
}

static void restore_run(psd_shard *s, ps_rpc_call *call, uint64_t step);

static void *ckpt_main(void *arg)
{
    psd_shard *s = arg;
    pthread_setname_np(pthread_self(), "psd-ckpt");
    pthread_mutex_lock(&s->ckpt_mu);
    for (;;) {
        while (!s->ckpt_quit && s->ckpt_jobs == NULL)
            pthread_cond_wait(&s->ckpt_cond, &s->ckpt_mu);
        struct ckpt_job *j = s->ckpt_jobs;
        if (j == NULL)
            break; /* quit, nothing left */
        s->ckpt_jobs = j->next;
        if (s->ckpt_jobs == NULL)
            s->ckpt_tail = &s->ckpt_jobs;
        bool quit = s->ckpt_quit;
        pthread_mutex_unlock(&s->ckpt_mu);
        if (quit)
            ps_rpc_fail(j->call, PS_RPC_UNAVAILABLE, "psd is shutting down");
        else if (j->kind == JOB_RESTORE)
            restore_run(s, j->call, j->step);
        else if (j->kind == JOB_CREATE)
            create_variable_run(s, j->call, j->req, j->len, true);
        else
            checkpoint_run(s, j->call, j->step, j->keep_at_least);
        free(j->req);
        free(j);
        pthread_mutex_lock(&s->ckpt_mu);
    }
    pthread_mutex_unlock(&s->ckpt_mu);
    return NULL;
}

/* Fails every waiting call: Restore replaces the variables they point to. */
static void fail_all_waits(psd_shard *s, enum ps_rpc_code code, const char *msg)
{
    pthread_mutex_lock(&s->wait_mu);
    pull_waiter *w = s->waiters;
    s->waiters = NULL;
    pending_push *p = s->pending;
    s->pending = NULL;
    /* Pushes waiting for their commit: their updates are gone with the
     * variables they changed. */
    pending_push *d = s->durable;
    s->durable = NULL;
    pthread_mutex_unlock(&s->wait_mu);
    while (d != NULL) {
        pending_push *next = d->next;
        ps_rpc_fail(d->call, code, "%s", msg);
        pending_free(d);
        d = next;
    }
    while (w != NULL) {
        pull_waiter *next = w->next;
        ps_rpc_fail(w->call, code, "%s", msg);
        waiter_free(w);
        w = next;
    }
    while (p != NULL) {
        pending_push *next = p->next;
        ps_rpc_fail(p->call, code, "%s", msg);
        pending_free(p);
        p = next;
    }
}

/* Restore runs on the checkpoint thread (after any checkpoint before it):
 * loading a big checkpoint and writing it into the live store take
 * seconds, during which the serving thread goes on answering with the
 * variables as they are; only the swap holds every call. */
static void restore(ps_rpc_call *call, const uint8_t *req, size_t len, void *ctx)
{
    psd_shard *s = ctx;
    Ps__V1__RestoreRequest *r = ps__v1__restore_request__unpack(NULL, len, req);
    if (r == NULL) {
        count_bad(s);
        ps_rpc_fail(call, PS_RPC_INVALID_ARGUMENT,
                    "Restore: %zu bytes that are not a RestoreRequest", len);
        return;
    }
    struct ckpt_job *j = calloc(1, sizeof *j);
    if (j == NULL) {
        ps__v1__restore_request__free_unpacked(r, NULL);
        ps_rpc_fail(call, PS_RPC_RESOURCE_EXHAUSTED, "Restore: out of memory");
        return;
    }
    *j = (struct ckpt_job){NULL, call, r->step, 0, JOB_RESTORE, NULL, 0};
    ps__v1__restore_request__free_unpacked(r, NULL);
    ckpt_enqueue(s, j);
}

static void restore_run(psd_shard *s, ps_rpc_call *call, uint64_t step)
{
    int rc = 0;
    if (step == 0 && (rc = psd_ckpt_latest(s->ckpt_root, &step)) != 0) {
        ps_rpc_fail(call, PS_RPC_NOT_FOUND,
                    "Restore: no complete checkpoint under %s/checkpoints",
                    s->ckpt_root);
        return;
    }
    char path[4096];
    rc = psd_ckpt_path(s->ckpt_root, step, path, sizeof path);
    if (rc != 0) {
        ps_rpc_fail(call, rc == PS_ECORRUPT ? PS_RPC_DATA_LOSS : PS_RPC_NOT_FOUND,
                    "Restore: checkpoint %llu under %s/checkpoints %s",
                    (unsigned long long)step, s->ckpt_root,
                    rc == PS_ECORRUPT ? "is corrupt (its checksum does not match)"
                                      : "does not exist or is incomplete");
        return;
    }
    psd_store *ck;
    rc = psd_store_open(path, 0, PSD_STORE_RDONLY, &ck);
    struct load_ctx lc;
    if (rc == 0) {
        rc = load_store(ck, &lc);
        psd_store_close(ck);
    }
    if (rc != 0) {
        ps_rpc_fail(call, PS_RPC_DATA_LOSS, "Restore: checkpoint %s does not "
                    "load: %s", path, ps_strerror(rc));
        return;
    }
    /* The live store first, with the flusher held off (flush_mu) but calls
     * going on: updates from now to the swap are lost with the variables
     * they change, as a restore means. */
    pthread_mutex_lock(&s->flush_mu);
    /* CreateVariable checks this under table_lock, held through its own
     * store write: one done before is cleared below, one after refused. */
    pthread_rwlock_wrlock(&s->table_lock);
    s->restoring = true;
    pthread_rwlock_unlock(&s->table_lock);
    psd_store_txn *t;
    rc = psd_store_begin(s->store, &t);
    if (rc == 0)
        rc = psd_store_clear(t);
    for (size_t i = 0; i < lc.n && rc == 0; i++) {
        psd_var_rec rec;
        var_rec(lc.vars[i], &rec);
        rc = psd_store_put(t, &rec);
    }
    if (rc == 0)
        rc = psd_store_commit(t);
    else if (t != NULL)
        psd_store_abort(t);
    if (rc == 0) {
        /* The swap: no handler runs now, so every waiting call is listed
         * and armed. */
        pthread_rwlock_wrlock(&s->table_lock);
        fail_all_waits(s, PS_RPC_ABORTED, "the variables were restored from a "
                       "checkpoint while this call waited; pull again");
        for (size_t i = 0; i < s->nvars; i++)
            var_free(s->vars[i]);
        free(s->vars);
        s->vars = lc.vars;
        s->nvars = s->cap = lc.n;
        qsort(s->vars, s->nvars, sizeof *s->vars, cmp_vars);
        atomic_store(&s->committed_seq, atomic_load(&s->apply_seq));
        s->restoring = false;
        pthread_rwlock_unlock(&s->table_lock);
    } else {
        /* Not committed: LMDB kept the store as it was, the live
         * variables'. */
        pthread_rwlock_wrlock(&s->table_lock);
        s->restoring = false;
        pthread_rwlock_unlock(&s->table_lock);
    }
    pthread_mutex_unlock(&s->flush_mu);
    if (rc != 0) {
        for (size_t i = 0; i < lc.n; i++)
            var_free(lc.vars[i]);
        free(lc.vars);
        ps_rpc_fail(call, ps_rpc_code_from_err(rc), "Restore: writing the "
                    "checkpoint into the live store failed: %s (the variables "
                    "are unchanged)", ps_strerror(rc));
        return;
    }
    ps_log_info("restored %zu variable(s) from checkpoint %llu", lc.n,
                (unsigned long long)step);
    Ps__V1__RestoreResponse resp = PS__V1__RESTORE_RESPONSE__INIT;
    resp.step = step;
    resp.variables = lc.n;
    ps_rpc_reply_pb(call, &resp);
}

/* ---- lifetime --------------------------------------------------------- */

int psd_shard_open(const psd_shard_opts *opts, psd_shard **out)
{
    if (opts->data_dir == NULL || opts->data_dir[0] == '\0' ||
        opts->commit_interval_ms <= 0 || opts->workers == 0)
        return PS_EINVAL_ARG;
    psd_shard *s = calloc(1, sizeof *s);
    if (s == NULL)
        return -ENOMEM;
    s->o = *opts;
    if (s->o.max_message_bytes == 0)
        s->o.max_message_bytes = PS_RPC_DEFAULT_MAX_MESSAGE;
    s->data_dir = strdup(opts->data_dir);
    s->o.data_dir = s->data_dir;
    s->ckpt_root = strdup(opts->checkpoint_root && opts->checkpoint_root[0]
                              ? opts->checkpoint_root : opts->data_dir);
    s->o.checkpoint_root = s->ckpt_root;
    pthread_rwlock_init(&s->table_lock, NULL);
    pthread_mutex_init(&s->wait_mu, NULL);
    pthread_cond_init(&s->wait_cond, NULL);
    pthread_mutex_init(&s->flush_mu, NULL);
    pthread_cond_init(&s->flush_cond, NULL);
    pthread_mutex_init(&s->ckpt_mu, NULL);
    pthread_cond_init(&s->ckpt_cond, NULL);
    s->ckpt_tail = &s->ckpt_jobs;
    s->started_ms = ps_now_ms();
    int rc = psd_shmmap_create(&s->shm);
    if (rc != 0)
        goto fail;
    rc = psd_store_open(s->data_dir, opts->map_size, 0, &s->store);
    if (rc != 0) {
        ps_log_err(rc, "cannot open the store in %s", s->data_dir);
        goto fail;
    }
    struct load_ctx lc;
    rc = load_store(s->store, &lc);
    if (rc != 0) {
        ps_log_err(rc, "cannot load the variables in %s", s->data_dir);
        goto fail;
    }
    s->vars = lc.vars;
    s->nvars = lc.n;
    s->cap = lc.cap;
    uint64_t last = 0;
    if (psd_ckpt_latest(s->ckpt_root, &last) == 0)
        atomic_store(&s->last_ckpt, last);
    if (pthread_create(&s->ckpt_thread, NULL, ckpt_main, s) == 0)
        s->ckpt_started = true;
    if (!s->ckpt_started || psd_assist_start(&s->assist) != 0 ||
        pthread_create(&s->flusher, NULL, flusher_main, s) != 0 ||
        pthread_create(&s->sweeper, NULL, sweeper_main, s) != 0) {
        rc = -EAGAIN;
        goto fail; /* (a started flusher is stopped by close) */
    }
    s->threads_started = true;
    ps_log_info("loaded %zu variable(s) from %s", s->nvars, s->data_dir);
    *out = s;
    return 0;
fail:
    psd_shard_close(s);
    return rc;
}

size_t psd_shard_nvars(psd_shard *s)
{
    pthread_rwlock_rdlock(&s->table_lock);
    size_t n = s->nvars;
    pthread_rwlock_unlock(&s->table_lock);
    return n;
}

void psd_shard_set_fixed_overhead(psd_shard *s, uint64_t bytes)
{
    s->fixed_overhead = bytes;
}

int psd_shard_register(psd_shard *s, ps_rpc_server *srv)
{
    static const struct {
        const char *path;
        ps_rpc_handler fn;
    } m[] = {
        {"/ps.v1.ParameterServer/CreateVariable", create_variable},
        {"/ps.v1.ParameterServer/Pull", pull},
        {"/ps.v1.ParameterServer/ListVariables", list_variables},
        {"/ps.v1.ParameterServer/Stats", stats},
        {"/ps.v1.ParameterServer/Checkpoint", checkpoint},
        {"/ps.v1.ParameterServer/Restore", restore},
        {"/ps.v1.ParameterServer/SetSyncWorkers", set_sync_workers},
    };
    /* Push reads its request in the pieces it arrived in (wire.h). */
    int prc = ps_rpc_server_add_method_pieces(srv, "/ps.v1.ParameterServer/Push",
                                              push, s);
    if (prc != 0)
        return prc;
    for (size_t i = 0; i < sizeof m / sizeof m[0]; i++) {
        int rc = ps_rpc_server_add_method(srv, m[i].path, PS_RPC_UNARY, m[i].fn, s);
        if (rc != 0)
            return rc;
    }
    return 0;
}

void psd_shard_stop(psd_shard *s)
{
    pthread_mutex_lock(&s->wait_mu);
    s->stopping = true;
    pthread_cond_signal(&s->wait_cond);
    pthread_mutex_unlock(&s->wait_mu);
    /* Durable pushes are answered by one last flush. */
    psd_shard_flush(s);
    /* Let the sweeper answer the waits; wait until it has. */
    for (int i = 0; i < 500; i++) {
        pthread_mutex_lock(&s->wait_mu);
        bool empty = s->waiters == NULL && s->pending == NULL;
        pthread_mutex_unlock(&s->wait_mu);
        if (empty)
            break;
        struct timespec ts = {0, 2 * 1000000L};
        nanosleep(&ts, NULL);
    }
}

int psd_shard_close(psd_shard *s)
{
    if (s == NULL)
        return 0;
    int rc = 0;
    if (s->threads_started) {
        pthread_mutex_lock(&s->wait_mu);
        s->closing = true;
        s->stopping = true;
        pthread_cond_signal(&s->wait_cond);
        pthread_mutex_unlock(&s->wait_mu);
        pthread_mutex_lock(&s->flush_mu);
        pthread_cond_signal(&s->flush_cond);
        pthread_mutex_unlock(&s->flush_mu);
        pthread_join(s->flusher, NULL);
        pthread_join(s->sweeper, NULL);
        rc = psd_shard_flush(s);
        fail_all_waits(s, PS_RPC_UNAVAILABLE, "psd is shutting down");
    }
    if (s->ckpt_started) {
        /* A checkpoint under way finishes; queued ones are refused. */
        pthread_mutex_lock(&s->ckpt_mu);
        s->ckpt_quit = true;
        pthread_cond_signal(&s->ckpt_cond);
        pthread_mutex_unlock(&s->ckpt_mu);
        pthread_join(s->ckpt_thread, NULL);
    }
    pthread_mutex_destroy(&s->ckpt_mu);
    pthread_cond_destroy(&s->ckpt_cond);
    psd_assist_stop(s->assist);
    psd_shmmap_destroy(s->shm);
    psd_store_close(s->store);
    for (size_t i = 0; i < s->nvars; i++)
        var_free(s->vars[i]);
    free(s->vars);
    pthread_rwlock_destroy(&s->table_lock);
    pthread_mutex_destroy(&s->wait_mu);
    pthread_cond_destroy(&s->wait_cond);
    pthread_mutex_destroy(&s->flush_mu);
    pthread_cond_destroy(&s->flush_cond);
    free(s->data_dir);
    free(s->ckpt_root);
    free(s);
    return rc;
}
