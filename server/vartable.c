/*
 * vartable.c - the shard's table of variables: lookup and insertion, the
 * normalisation and validation of a VariableSpec, and the methods that
 * read or grow the table (CreateVariable, ListVariables, Stats). The lock
 * order is in shard_internal.h.
 */
#include "server/shard_internal.h"

#include "common/buf.h"
#include "common/probe.h"

#include "common/clock.h"
#include "common/errors.h"
#include "server/init.h"
#include "server/sparse.h"
#include "common/log.h"
#include "common/tensor.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- small helpers ---------------------------------------------------- */

float *shard_alloc_floats(size_t n)
{
    size_t bytes = (n * sizeof(float) + 63) & ~(size_t)63;
    return aligned_alloc(64, bytes ? bytes : 64);
}

const char *shard_dtype_name(int d)
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
const char *shard_name_problem(const char *name, size_t len)
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
psd_var *shard_find_var(psd_shard *s, const char *name, size_t len,
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

void shard_var_free(psd_var *v)
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
    psd_sparse_table_free(v->sparse);
    shard_pieces_free(v);
    PS_FREE_ALL(v->slots, v->accum, v->pushed);
    pthread_rwlock_destroy(&v->lock);
    free(v);
}

/* ---- specs ------------------------------------------------------------ */

static void opt_from_pb(const Ps__V1__Optimizer *p, psd_opt *o)
{
    *o = (psd_opt){.kind = (enum psd_opt_kind)p->kind,
                   .lr = p->learning_rate,
                   .momentum = p->momentum,
                   .nesterov = p->nesterov,
                   .initial_accumulator = p->initial_accumulator,
                   .beta1 = p->beta1,
                   .beta2 = p->beta2,
                   .epsilon = p->epsilon,
                   .lr_power = p->learning_rate_power,
                   .l1 = p->l1,
                   .l2 = p->l2,
                   .l2_shrinkage = p->l2_shrinkage,
                   .beta = p->beta};
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

    psd_opt o;
    opt_from_pb(&out->opt, &o);
    out->opt.learning_rate = o.lr;
    /* Only the optimizer's own hyper-parameters are kept, so that an
     * irrelevant field cannot make two SGD specs differ. */
    out->opt.momentum = o.kind == PSD_OPT_MOMENTUM ? o.momentum : 0;
    out->opt.nesterov = o.kind == PSD_OPT_MOMENTUM ? o.nesterov : 0;
    bool ftrl = o.kind == PSD_OPT_FTRL;
    out->opt.initial_accumulator =
        o.kind == PSD_OPT_ADAGRAD || ftrl ? o.initial_accumulator : 0;
    out->opt.learning_rate_power = ftrl ? o.lr_power : 0;
    out->opt.l1 = ftrl ? o.l1 : 0;
    out->opt.l2 = ftrl ? o.l2 : 0;
    out->opt.l2_shrinkage = ftrl ? o.l2_shrinkage : 0;
    out->opt.beta = ftrl ? o.beta : 0;
    out->opt.beta1 = o.kind == PSD_OPT_ADAM ? o.beta1 : 0;
    out->opt.beta2 = o.kind == PSD_OPT_ADAM ? o.beta2 : 0;
    out->opt.epsilon = o.kind == PSD_OPT_ADAM || o.kind == PSD_OPT_ADAGRAD ? o.epsilon : 0;

    psd_init i;
    init_from_pb(&out->init, &i);
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
    if (out->spec.consistency == PS__V1__CONSISTENCY__CONSISTENCY_DEFAULT &&
        out->spec.sparse)
        out->spec.consistency = PS__V1__CONSISTENCY__ASYNC;
    if (out->spec.consistency == PS__V1__CONSISTENCY__CONSISTENCY_DEFAULT)
        out->spec.consistency = (Ps__V1__Consistency)s->o.consistency;
    if (out->spec.consistency == PS__V1__CONSISTENCY__SYNC) {
        if (out->spec.num_workers == 0)
            out->spec.num_workers = s->o.workers;
    } else {
        out->spec.num_workers = 0;
    }
    if (out->spec.consistency != PS__V1__CONSISTENCY__BOUNDED_STALENESS)
        out->spec.staleness = 0;
    if (!out->spec.sparse) { /* meaningless for a dense variable */
        out->spec.admit_after = 0;
        out->spec.ttl_steps = out->spec.max_rows = 0;
        out->spec.insert_on_pull = false;
    }
    if (out->spec.row_dtype == PS__V1__DTYPE__DTYPE_FLOAT32) /* the default, spelled out */
        out->spec.row_dtype = PS__V1__DTYPE__DTYPE_UNSPECIFIED;
    if (out->spec.slot_dtype == PS__V1__DTYPE__DTYPE_FLOAT32)
        out->spec.slot_dtype = PS__V1__DTYPE__DTYPE_UNSPECIFIED;
}

/* Validates a normalized spec. Returns 0, or a project error with one line
 * in why. */
static int validate_spec(psd_shard *s, const Ps__V1__VariableSpec *sp,
                         size_t *n_out, char *why, size_t whylen)
{
    const char *np = shard_name_problem(sp->name, strlen(sp->name));
    if (np != NULL) {
        snprintf(why, whylen, "variable name %s", np);
        return PS_EINVAL_ARG;
    }
    if (sp->dtype != PS__V1__DTYPE__DTYPE_FLOAT32) {
        snprintf(why, whylen, "variable '%s': dtype %s is not served; use "
                 "DTYPE_FLOAT32", sp->name, shard_dtype_name(sp->dtype));
        return PS_EDTYPE;
    }
    if (sp->n_shape > PS_WIRE_MAX_DIMS) {
        snprintf(why, whylen, "variable '%s': %zu dimensions, at most %d",
                 sp->name, sp->n_shape, PS_WIRE_MAX_DIMS);
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
    if (!sp->sparse && sp->row_dtype != PS__V1__DTYPE__DTYPE_UNSPECIFIED) {
        snprintf(why, whylen, "variable '%s': row_dtype %s is for sparse tables; a dense "
                 "variable is FLOAT32 (send it in half precision with wire_dtype)",
                 sp->name, shard_dtype_name(sp->row_dtype));
        return PS_EDTYPE;
    }
    if (!sp->sparse && sp->slot_dtype != PS__V1__DTYPE__DTYPE_UNSPECIFIED) {
        snprintf(why, whylen, "variable '%s': slot_dtype %s is for sparse tables; a dense "
                 "variable's optimizer slots are FLOAT32", sp->name,
                 shard_dtype_name(sp->slot_dtype));
        return PS_EDTYPE;
    }
    if (sp->sparse) {
        int rc = psd_sparse_validate(sp, why, whylen);
        if (rc != 0)
            return rc;
        uint64_t cap = s->o.max_rows_per_table;
        if (cap != 0 && sp->max_rows > cap) {
            snprintf(why, whylen, "sparse table '%s': max_rows %llu is over this psd's "
                     "--max-rows-per-table %llu", sp->name,
                     (unsigned long long)sp->max_rows, (unsigned long long)cap);
            return PS_EFULL;
        }
    }
    if ((unsigned)sp->optimizer->kind > PS__V1__OPTIMIZER__KIND__FTRL) {
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
    if (sp->consistency == PS__V1__CONSISTENCY__BOUNDED_STALENESS &&
        sp->staleness > PSD_MAX_STALENESS) {
        snprintf(why, whylen, "variable '%s': BOUNDED_STALENESS needs "
                 "staleness in [0, %u], got %u", sp->name, PSD_MAX_STALENESS,
                 sp->staleness);
        return PS_EINVAL_ARG;
    }
    if (sp->consistency != PS__V1__CONSISTENCY__ASYNC &&
        sp->consistency != PS__V1__CONSISTENCY__SYNC &&
        sp->consistency != PS__V1__CONSISTENCY__BOUNDED_STALENESS) {
        snprintf(why, whylen, "variable '%s': unknown consistency %d",
                 sp->name, (int)sp->consistency);
        return PS_EINVAL_ARG;
    }
    /* The bound is the server's: the largest num_workers also caps
     * SetSyncWorkers (push.c), so a caller's spec must not raise it. */
    uint32_t most = s->o.max_sync_workers != 0 ? s->o.max_sync_workers : 65536;
    if (s->o.workers > most)
        most = s->o.workers;
    if (sp->consistency == PS__V1__CONSISTENCY__SYNC &&
        (sp->num_workers == 0 || sp->num_workers > most)) {
        snprintf(why, whylen, "variable '%s': SYNC needs num_workers in "
                 "[1, %u] (psd --max-sync-workers), got %u", sp->name, most,
                 sp->num_workers);
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
int shard_var_new(const Ps__V1__VariableSpec *sp, size_t n, psd_var **out)
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
    v->staleness = v->spec->staleness;
    v->num_workers = v->spec->num_workers;
    if (n * sizeof(float) >= VALUE_IN_PLACE_MIN) {
        v->vmsg = ps_rpc_msg_new(n * sizeof(float));
        v->value = v->vmsg ? (float *)(void *)ps_rpc_msg_data(v->vmsg) : NULL;
    } else {
        v->value = shard_alloc_floats(n);
    }
    v->slots = v->nslots ? shard_alloc_floats(n * (size_t)v->nslots) : NULL;
    if (v->value == NULL || (v->nslots && v->slots == NULL))
        goto nomem;
    if (v->spec->sparse && (v->sparse = psd_sparse_table_new(v->spec, &v->opt)) == NULL)
        goto nomem;
    v->persisted_version = UINT64_MAX; /* not in the store yet */
    *out = v;
    return 0;
nomem:
    shard_var_free(v);
    return -ENOMEM;
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
    shard_var_attach(s, v);
    /* Once the coordinator has said how many workers the job has, a SYNC
     * step waits for that many, not for the num_workers a caller's spec
     * names (a worker could name more, and stall the variable's steps). */
    unsigned told = atomic_load(&s->sync_workers);
    if (v->consistency == PSD_SYNC && told != 0 && v->num_workers != told) {
        ps_log_info("variable '%s': sync steps wait for %u worker(s), the "
                    "coordinator's count (its spec says %u)", v->name, told,
                    v->num_workers);
        v->num_workers = told;
    }
    return 0;
}

/* A sparse table's rows join (leave) the shard's tier as its variable
 * enters (leaves) the table. table_lock held for writing. */
void shard_var_attach(psd_shard *s, psd_var *v)
{
    if (v->sparse != NULL)
        psd_sparse_attach(s->sparse, v->sparse, v->step);
}

void shard_var_detach(psd_shard *s, psd_var *v)
{
    if (v->sparse != NULL)
        psd_sparse_detach(s->sparse, v->sparse);
}

/* ---- CreateVariable --------------------------------------------------- */

/* Parses, normalizes and validates a CreateVariableRequest into ns (whose
 * strings point into the request) and its element count n. Returns the
 * request, for the caller to free, or NULL with call failed. */
static Ps__V1__CreateVariableRequest *
create_parse(psd_shard *s, ps_rpc_call *call, const uint8_t *req, size_t len,
             struct norm_spec *ns, size_t *n)
{
    Ps__V1__CreateVariableRequest *r = shard_unpack(
        s, call, "CreateVariable", &ps__v1__create_variable_request__descriptor, req, len);
    if (r == NULL)
        return NULL;
    if (r->spec == NULL) {
        shard_count_bad(s);
        ps_rpc_fail(call, PS_RPC_INVALID_ARGUMENT, "CreateVariable: spec is missing");
        ps__v1__create_variable_request__free_unpacked(r, NULL);
        return NULL;
    }
    normalize(s, r->spec, ns);
    char why[512];
    int rc = validate_spec(s, &ns->spec, n, why, sizeof why);
    if (rc != 0) {
        shard_count_bad(s);
        ps_rpc_fail(call, rc == PS_EDTYPE && ns->spec.sparse ? PS_RPC_UNIMPLEMENTED
                          : rc == PS_EFULL ? PS_RPC_RESOURCE_EXHAUSTED
                                           : PS_RPC_INVALID_ARGUMENT,
                    "%s", why);
        ps__v1__create_variable_request__free_unpacked(r, NULL);
        return NULL;
    }
    if (s->stopping) {
        ps_rpc_fail(call, PS_RPC_UNAVAILABLE, "psd is shutting down");
        ps__v1__create_variable_request__free_unpacked(r, NULL);
        return NULL;
    }
    return r;
}

/* Whether a new variable of this spec is big enough to be created on the
 * checkpoint thread (CREATE_OFFLOAD_BYTES). */
static bool create_is_big(const Ps__V1__VariableSpec *spec, size_t n)
{
    size_t nslots = 0;
    if (spec->optimizer != NULL) {
        psd_opt o;
        opt_from_pb(spec->optimizer, &o);
        nslots = (size_t)psd_opt_slot_count(&o);
    }
    return n * sizeof(float) * (1 + nslots) >= CREATE_OFFLOAD_BYTES;
}

/* Hands the request to the checkpoint thread, which runs it again. */
static void create_offload(psd_shard *s, ps_rpc_call *call, const uint8_t *req,
                           size_t len)
{
    struct ckpt_job *j = calloc(1, sizeof *j);
    uint8_t *copy = malloc(len ? len : 1);
    if (j == NULL || copy == NULL) {
        free(j);
        free(copy);
        ps_rpc_fail(call, PS_RPC_RESOURCE_EXHAUSTED, "CreateVariable: out of "
                    "memory");
        return;
    }
    memcpy(copy, req, len);
    *j = (struct ckpt_job){NULL, call, 0, 0, JOB_CREATE, copy, len};
    shard_ckpt_enqueue(s, j);
}

/* Draws a new variable's initial values and sets its optimizer's slots. */
static void var_fill(psd_var *v)
{
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

/* Answers a CreateVariable for a variable that exists already: OK when the
 * specs mean the same, ALREADY_EXISTS naming the difference when not. */
static void create_existing(psd_shard *s, ps_rpc_call *call, psd_var *old,
                            const Ps__V1__VariableSpec *spec)
{
    /* Compare packed normalized specs: equal bytes, equal meaning. */
    size_t plen = ps__v1__variable_spec__get_packed_size(spec);
    uint8_t *packed = malloc(plen ? plen : 1);
    bool same = packed != NULL;
    if (same) {
        ps__v1__variable_spec__pack(spec, packed);
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
        spec_diff(old->spec, spec, diff, sizeof diff);
        shard_count_bad(s);
        ps_rpc_fail(call, PS_RPC_ALREADY_EXISTS,
                    "variable '%s' already exists with a different spec: %s",
                    spec->name, diff);
    }
}

/* Stores the new variable v, durable before it is acknowledged, inserts it
 * at pos, settles its reservation (limits.c) and answers. Called with
 * table_lock held for writing; lets it go. */
static void create_insert(psd_shard *s, ps_rpc_call *call, psd_var *v, size_t pos)
{
    int rc = shard_store_add(s, v);
    if (rc == 0) {
        v->persisted_version = 0;
        rc = table_insert(s, v, pos);
    }
    shard_caps_settle(s, shard_var_bytes(v), rc == 0);
    pthread_rwlock_unlock(&s->table_lock);
    if (rc != 0) {
        ps_rpc_fail(call, ps_rpc_code_from_err(rc),
                    "variable '%s': cannot store it: %s", v->name,
                    ps_strerror(rc));
        shard_var_free(v);
        return;
    }
    atomic_fetch_add(&s->commits, 1);
    Ps__V1__CreateVariableResponse resp = PS__V1__CREATE_VARIABLE_RESPONSE__INIT;
    resp.created = true;
    ps_rpc_reply_pb(call, &resp);
    char shp[128];
    ps_tensor_shape_str(v->shape, v->ndim, shp, sizeof shp);
    ps_log_info("created variable '%s' %s %s %s", v->name, shp,
                psd_opt_name(v->opt.kind), consistency_name(v->consistency));
}

/* Answers a CreateVariable whose new variable v (NULL: none was built)
 * is not inserted: old exists by its name (and v, built meanwhile, is
 * dropped with its reservation of bytes), or none does but none was built
 * (it was deleted since the first look), or a Restore is rewriting the
 * store, in which a variable created now would be in the store but not
 * among the restored ones. Called with table_lock held, which keeps old
 * alive. */
static void create_not_inserted(psd_shard *s, ps_rpc_call *call, psd_var *old,
                                psd_var *v, const Ps__V1__VariableSpec *spec,
                                uint64_t bytes)
{
    if (v != NULL) {
        shard_var_free(v);
        shard_caps_settle(s, bytes, false);
    }
    if (old != NULL)
        create_existing(s, call, old, spec);
    else if (v == NULL)
        ps_rpc_fail(call, PS_RPC_ABORTED, "variable '%s' was deleted or restored "
                    "away while this CreateVariable ran; create it again", spec->name);
    else
        ps_rpc_fail(call, PS_RPC_UNAVAILABLE, "variable '%s': psd is restoring a "
                    "checkpoint; create it again once that is done", spec->name);
}

/* CreateVariable; on_job_thread: run by the checkpoint thread, where a big
 * new variable is handed (CREATE_OFFLOAD_BYTES). */
void shard_create_variable_run(psd_shard *s, ps_rpc_call *call, const uint8_t *req,
                               size_t len, bool on_job_thread)
{
    struct norm_spec ns;
    size_t n = 0;
    Ps__V1__CreateVariableRequest *r = create_parse(s, call, req, len, &ns, &n);
    if (r == NULL)
        return;
    const char *name = ns.spec.name;

    /* Fast answer for an existing variable, without building a new one. */
    pthread_rwlock_rdlock(&s->table_lock);
    bool exists = shard_find_var(s, name, strlen(name), NULL) != NULL;
    pthread_rwlock_unlock(&s->table_lock);

    /* The caps, before anything is allocated (limits.c); a new variable
     * holds a reservation until create_insert settles it. */
    uint64_t bytes = shard_spec_bytes(&ns.spec, n);
    if (!exists && !shard_caps_reserve(s, call, name, bytes))
        goto out;
    psd_var *v = NULL;
    if (!exists && !on_job_thread && create_is_big(&ns.spec, n)) {
        /* The job thread reserves again: checked here, a refusal is
         * answered at once. */
        shard_caps_settle(s, bytes, false);
        create_offload(s, call, req, len);
        goto out;
    }
    if (!exists) {
        if (shard_var_new(&ns.spec, n, &v) != 0) {
            shard_caps_settle(s, bytes, false);
            ps_rpc_fail(call, PS_RPC_RESOURCE_EXHAUSTED,
                        "variable '%s': cannot allocate its %zu elements and "
                        "their optimizer slots", name, n);
            goto out;
        }
        var_fill(v);
    }

    pthread_rwlock_wrlock(&s->table_lock);
    size_t pos;
    psd_var *old = shard_find_var(s, name, strlen(name), &pos);
    /* A variable that existed at the first look may be deleted since: this
     * call built nothing to insert. */
    if (old != NULL || v == NULL || s->restoring) {
        create_not_inserted(s, call, old, v, &ns.spec, bytes);
        pthread_rwlock_unlock(&s->table_lock);
        goto out;
    }
    create_insert(s, call, v, pos);
out:
    ps__v1__create_variable_request__free_unpacked(r, NULL);
}

void shard_create_variable(ps_rpc_call *call, const uint8_t *req, size_t len,
                           void *ctx)
{
    shard_create_variable_run(ctx, call, req, len, false);
}

/* ---- the table's other readers ---------------------------------------- */

static int cmp_vars(const void *a, const void *b)
{
    return strcmp((*(psd_var *const *)a)->name, (*(psd_var *const *)b)->name);
}

void shard_sort_vars(psd_var **vars, size_t n)
{
    qsort(vars, n, sizeof *vars, cmp_vars);
}

void shard_vars_free(struct var_list *l)
{
    for (size_t i = 0; i < l->n; i++)
        shard_var_free(l->vars[i]);
    free(l->vars);
    free(l->from);
    shard_ckpt_converted_free(l);
    memset(l, 0, sizeof *l);
}

void shard_list_variables(ps_rpc_call *call, const uint8_t *req, size_t len,
                          void *ctx)
{
    psd_shard *s = ctx;
    if (!shard_request_parses(s, call, "ListVariables",
                              &ps__v1__list_variables_request__descriptor, req, len))
        return;
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
        infos[i].slot_bytes = shard_slot_bytes(v);
        infos[i].value_bytes = v->n * sizeof(float);
        if (v->sparse != NULL) {
            struct psd_sparse_brief b;
            psd_sparse_table_brief(s->sparse, v->sparse, &b);
            infos[i].sparse_rows = b.rows;
            infos[i].sparse_disk_bytes = b.rows * b.row_bytes;
            infos[i].sparse_ram_bytes = b.ram_bytes;
            infos[i].sparse_ram_rows = b.ram_rows;
        }
        pi[i] = &infos[i];
    }
    resp.n_variables = n;
    resp.variables = pi;
    ps_rpc_reply_pb(call, &resp);
    pthread_rwlock_unlock(&s->table_lock);
    free(infos);
    free(pi);
}

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

void shard_stats(ps_rpc_call *call, const uint8_t *req, size_t len, void *ctx)
{
    psd_shard *s = ctx;
    if (!shard_request_parses(s, call, "Stats", &ps__v1__stats_request__descriptor, req, len))
        return;
    Ps__V1__StatsResponse resp = PS__V1__STATS_RESPONSE__INIT;
    pthread_rwlock_rdlock(&s->table_lock);
    resp.variables = s->nvars;
    for (size_t i = 0; i < s->nvars; i++) {
        psd_var *v = s->vars[i];
        resp.value_bytes += v->n * sizeof(float);
        resp.slot_bytes += shard_slot_bytes(v);
    }
    psd_sparse_stats(s->sparse, &resp);
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
    resp.commits = shard_store_commits(s);
    resp.resident_bytes = psd_rss_bytes();
    resp.fixed_overhead_bytes = s->fixed_overhead;
    resp.uptime_seconds = (double)(ps_now_ms() - s->started_ms) / 1000.0;
    resp.last_checkpoint_step = atomic_load(&s->last_ckpt);
    resp.insecure = s->o.insecure;
    resp.transport_security = (char *)(s->o.transport_security != NULL
                                           ? s->o.transport_security : "plaintext");
    resp.tokens_required = s->o.tokens_required;
    resp.local_address = (char *)(s->o.local_address != NULL ? s->o.local_address : "");
    resp.host_id = (char *)(s->o.host_id != NULL ? s->o.host_id : "");
    resp.wire_clamped = atomic_load(&s->wire_clamped);
    resp.half_pushes = atomic_load(&s->half_pushes);
    resp.half_pulls = atomic_load(&s->half_pulls);
    if (s->srv != NULL) {
        resp.connections_refused = ps_rpc_server_local_refused(s->srv);
        resp.local_connections = (uint64_t)ps_rpc_server_local_open(s->srv);
    }
    /* Last, in one instant: the lag, dated (a client given this can tell
     * which of its acknowledged updates were durable then). */
    struct timespec wall;
    clock_gettime(CLOCK_REALTIME, &wall);
    resp.write_behind_lag_ms = shard_write_behind_lag_ms(s);
    resp.taken_unix_ms = (uint64_t)wall.tv_sec * 1000 + (uint64_t)wall.tv_nsec / 1000000;
    int files = ps_probe_open_files();
    long max_files = ps_probe_max_files();
    resp.open_files = files > 0 ? (uint64_t)files : 0;
    resp.max_open_files = max_files > 0 ? (uint64_t)max_files : 0;
    ps_rpc_reply_pb(call, &resp);
}
