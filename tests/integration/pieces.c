/*
 * pieces - drives psclient.c's pieces (ps_client_set_pieces) against a real
 * psd for test_pieces.py: for each case two variables of the same spec,
 * one pushed and pulled in pieces by one client, the other whole by a
 * second client with pieces off, the same gradients to both, then both
 * compared bit for bit, with their versions; then half pushes with error
 * feedback that fail part-way (failed_part_way). The size, 300007 elements, is
 * more than 64 pieces of 16 KiB, so psclient cuts it in 62 pieces of 4839
 * elements (its cap on pieces a call) and a short last one of 4828.
 *
 *   pieces ADDR
 *
 * Prints one "ok ..." or "FAIL ..." line per check and exits 0 when every
 * check passed, else 1 (2: the helper could not run).
 */
#include "common/errors.h"
#include "common/half.h"
#include "common/psclient.h"
#include "proto/ps.pb-c.h"

#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define N 300007
#define PIECE_BYTES 16384
#define STEPS 4
#define DEADLINE_MS 20000

static int failed;

__attribute__((format(printf, 2, 3))) static void check(int ok, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    printf("%s ", ok ? "ok  " : "FAIL");
    vprintf(fmt, ap);
    printf("\n");
    fflush(stdout);
    va_end(ap);
    failed += !ok;
}

static void die(const char *what, int rc, const ps_rpc_status *st)
{
    fprintf(stderr, "pieces: %s: %s: %s\n", what, ps_strerror(rc), st ? st->message : "");
    exit(2);
}

/* A (N,) variable: Adam (its step count makes the version count matter)
 * or SGD at learning rate 1 (the sum invariant of error feedback), async,
 * or SYNC for two workers; initial values uniform. */
static void create(ps_client *c, const char *name, int opt_kind, int sync_workers)
{
    Ps__V1__VariableSpec spec = PS__V1__VARIABLE_SPEC__INIT;
    Ps__V1__Initializer init = PS__V1__INITIALIZER__INIT;
    Ps__V1__Optimizer opt = PS__V1__OPTIMIZER__INIT;
    int64_t shape[1] = {N};
    spec.name = (char *)name;
    spec.dtype = PS__V1__DTYPE__DTYPE_FLOAT32;
    spec.n_shape = 1;
    spec.shape = shape;
    init.kind = PS__V1__INITIALIZER__KIND__UNIFORM;
    init.minval = -1;
    init.maxval = 1;
    init.seed = 11;
    opt.kind = opt_kind;
    opt.learning_rate = opt_kind == PS__V1__OPTIMIZER__KIND__SGD ? 1.0f : 0.01f;
    spec.initializer = &init;
    spec.optimizer = &opt;
    if (sync_workers > 0) {
        spec.consistency = PS__V1__CONSISTENCY__SYNC;
        spec.num_workers = (uint32_t)sync_workers;
    }
    ps_rpc_status st = {0};
    int rc = ps_client_create_variable(c, &spec, NULL, NULL, DEADLINE_MS, &st);
    if (rc != 0)
        die(name, rc, &st);
}

static void gradient(float *g, int step, int seed)
{
    uint64_t x = (uint64_t)step * 7919u + (uint64_t)seed * 104729u + 1;
    for (size_t i = 0; i < N; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        g[i] = (float)((int64_t)(x >> 40) - (1 << 23)) / (float)(1 << 23) * 0.37f;
    }
}

static ps_client *client(const char *addr, bool pieces)
{
    ps_client *c;
    ps_rpc_client_opts o = {.deadline_ms = DEADLINE_MS};
    int rc = ps_client_create(addr, &o, &c);
    if (rc != 0)
        die("client", rc, NULL);
    if (ps_client_set_pieces(c, pieces ? PIECE_BYTES : 0, 4) != 0)
        die("ps_client_set_pieces", PS_EINVAL_ARG, NULL);
    return c;
}

static size_t first_diff(const float *a, const float *b)
{
    for (size_t i = 0; i < N; i++)
        if (memcmp(&a[i], &b[i], sizeof(float)) != 0)
            return i;
    return N;
}

/* STEPS push-and-pulls of the same gradients to a (in pieces) and b
 * (whole), then a pull of each: the values equal bit for bit after every
 * step, the versions count one a step. */
static void same_path(ps_client *cp, ps_client *cw, const char *a, const char *b,
                      const char *what, float *g0, float *va, float *vb, ps_rpc_msg *gm)
{
    int same = 1, versions = 1;
    for (int s = 1; s <= STEPS; s++) {
        gradient(g0, s, 1);
        ps_client_item pa = {.name = a, .data = g0, .n = N};
        if (gm != NULL) {
            /* In a message buffer, as workerd's: the pieces go in place. */
            ps_rpc_msg_wait_unshared(gm);
            memcpy(ps_rpc_msg_data(gm), g0, N * sizeof(float));
            pa.data = (float *)(void *)ps_rpc_msg_data(gm);
            pa.msg = gm;
        }
        ps_client_item qa = {.name = a, .data = va, .n = N};
        ps_client_item pb = {.name = b, .data = g0, .n = N};
        ps_client_item qb = {.name = b, .data = vb, .n = N};
        ps_rpc_status st = {0};
        int rc = ps_client_push_pull(cp, 0, (uint64_t)s, &pa, &qa, 1, DEADLINE_MS, &st);
        if (rc != 0)
            die("push_pull in pieces", rc, &st);
        rc = ps_client_push_pull(cw, 0, (uint64_t)s, &pb, &qb, 1, DEADLINE_MS, &st);
        if (rc != 0)
            die("push_pull whole", rc, &st);
        size_t d = first_diff(va, vb);
        if (d != N && same) {
            printf("     step %d: element %zu: %.9g in pieces, %.9g whole\n", s, d,
                   (double)va[d], (double)vb[d]);
            same = 0;
        }
        if (pa.version != (uint64_t)s || qa.version != (uint64_t)s ||
            pb.version != (uint64_t)s) {
            printf("     step %d: versions %llu/%llu in pieces, %llu whole\n", s,
                   (unsigned long long)pa.version, (unsigned long long)qa.version,
                   (unsigned long long)pb.version);
            versions = 0;
        }
    }
    check(same, "%s: %d pushes with values back, in pieces and whole, equal bit for bit",
          what, STEPS);
    check(versions, "%s: the version rises once a push, in pieces as whole", what);
    ps_client_item la = {.name = a, .data = va, .n = N};
    ps_client_item lb = {.name = b, .data = vb, .n = N};
    ps_rpc_status st = {0};
    int rc = ps_client_pull(cp, &la, 1, DEADLINE_MS, &st);
    if (rc == 0)
        rc = ps_client_pull(cw, &lb, 1, DEADLINE_MS, &st);
    if (rc != 0)
        die("pull", rc, &st);
    check(first_diff(va, vb) == N && la.version == STEPS && lb.version == STEPS,
          "%s: a pull in pieces equals a whole one (version %llu and %llu)", what,
          (unsigned long long)la.version, (unsigned long long)lb.version);
}

/* bf16 with error feedback on SGD at rate 1: w = w0 - sum(sent), and the
 * client keeps sum(g) - sum(sent) as its residual, below bf16's rounding
 * step of each element's g + r. */
static void sum_invariant(ps_client *cp, const char *a, const float *w0, float *g,
                          double *sum, float *va)
{
    ps_client_item la = {.name = a, .data = va, .n = N};
    ps_rpc_status st = {0};
    int rc = ps_client_set_wire_dtype(cp, PS__V1__DTYPE__DTYPE_FLOAT32, false);
    if (rc == 0)
        rc = ps_client_pull(cp, &la, 1, DEADLINE_MS, &st);
    if (rc != 0)
        die("pull f32", rc, &st);
    double worst = 0;
    size_t at = 0;
    for (size_t i = 0; i < N; i++) {
        /* |residual| <= half a bf16 step of |g + r| <= 2^-8 of a bound of
         * it: every |g| < 0.37, so |g + r| < 0.38. */
        double r = sum[i] - ((double)w0[i] - (double)va[i]);
        if (fabs(r) > worst) {
            worst = fabs(r);
            at = i;
        }
    }
    (void)g;
    check(worst <= 0.38 / 256 + 1e-5,
          "bf16 in pieces: sum of gradients - applied change within bf16's rounding "
          "(largest %.3g at element %zu)", worst, at);
}

/* ---- error feedback when a push fails part-way ----------------------------
 *
 * Gradients on a grid of 2^-12 below 0.5, variables starting at zero with
 * SGD at rate 1: every sum, rounding and residual is exact in float32, so
 * that psd's value w and the client's residual r must give back the sum S
 * of the gradients bit for bit: -w + r == S. */

#define EF_SMALL 1000
#define EF_HUGE (1 << 22)

/* A client with the default pieces. */
static ps_client *client_default(const char *addr)
{
    ps_client *c;
    ps_rpc_client_opts o = {.deadline_ms = DEADLINE_MS};
    int rc = ps_client_create(addr, &o, &c);
    if (rc != 0)
        die("client", rc, NULL);
    return c;
}

static void grid_gradient(float *g, size_t n, int step, int seed)
{
    uint64_t x = (uint64_t)step * 7919u + (uint64_t)seed * 104729u + 5;
    for (size_t i = 0; i < n; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        g[i] = (float)((int64_t)((x >> 33) % 4095) - 2047) / 4096.0f;
    }
}

/* A variable of n elements at zero, SGD at rate 1. */
static void create_zero(ps_client *c, const char *name, size_t n)
{
    Ps__V1__VariableSpec spec = PS__V1__VARIABLE_SPEC__INIT;
    Ps__V1__Optimizer opt = PS__V1__OPTIMIZER__INIT;
    int64_t shape[1] = {(int64_t)n};
    spec.name = (char *)name;
    spec.dtype = PS__V1__DTYPE__DTYPE_FLOAT32;
    spec.n_shape = 1;
    spec.shape = shape;
    opt.kind = PS__V1__OPTIMIZER__KIND__SGD;
    opt.learning_rate = 1.0f;
    spec.optimizer = &opt;
    ps_rpc_status st = {0};
    int rc = ps_client_create_variable(c, &spec, NULL, NULL, DEADLINE_MS, &st);
    if (rc != 0)
        die(name, rc, &st);
}

/* Checks -w + r == S for variable name (n elements) but element skip, and
 * counts the elements whose value is not prev (the ones applied since). */
static void ef_check(ps_client *c, ps_client *reader, const char *name, const float *sum,
                     size_t n, size_t skip, float *w, const float *prev, size_t *changed,
                     const char *what)
{
    ps_client_item it = {.name = name, .data = w, .n = n};
    ps_rpc_status st = {0};
    int rc = ps_client_pull(reader, &it, 1, DEADLINE_MS, &st);
    if (rc != 0)
        die("pull (float32)", rc, &st);
    const float *r = NULL;
    size_t rn = 0;
    rc = ps_client_residual(c, name, &r, &rn);
    size_t bad = n, nch = 0;
    for (size_t i = 0; rc == 0 && rn == n && i < n; i++) {
        if (prev != NULL && w[i] != prev[i])
            nch++;
        if (i != skip && bad == n && -w[i] + r[i] != sum[i])
            bad = i;
    }
    if (changed != NULL)
        *changed = nch;
    check(rc == 0 && rn == n && bad == n,
          "%s: '%s': applied + residual == sum of the gradients, bit for bit", what,
          name);
    if (rc == 0 && rn == n && bad != n)
        printf("  element %zu: -w %.9g + r %.9g != %.9g\n", bad, (double)-w[bad],
               (double)r[bad], (double)sum[bad]);
}

/* Half pushes with error feedback that fail part-way, against psd: what
 * psd did not apply stays in the residual, whole, and the next push sends
 * it. */
static void failed_part_way(const char *addr)
{
    ps_client *cf = client(addr, true), *cw = client(addr, false);
    ps_client *reader = client(addr, false);
    ps_client_set_wire_dtype(cf, PS_HALF_BF16, true);
    ps_client_set_wire_dtype(cw, PS_HALF_BF16, true);
    float *g = malloc(N * sizeof *g), *sum = calloc(N, sizeof *sum),
          *w = malloc(N * sizeof *w), *prev = malloc(N * sizeof *prev);
    float gs[EF_SMALL], s1[EF_SMALL] = {0}, s2[EF_SMALL] = {0}, ws[EF_SMALL];
    if (g == NULL || sum == NULL || w == NULL || prev == NULL)
        die("malloc", -12, NULL);
    create_zero(cf, "ef/big", N);
    create_zero(cf, "ef/nan", N);
    create_zero(cf, "ef/w1", EF_SMALL);
    create_zero(cf, "ef/w2", EF_SMALL);
    ps_rpc_status st = {0};

    /* In pieces: one push that goes, then one beside a variable psd does
     * not have, whose call (the small items', first) is refused while the
     * pieces after it go out: some applied, the rest never sent. */
    grid_gradient(g, N, 1, 7);
    for (size_t i = 0; i < N; i++)
        sum[i] += g[i];
    ps_client_item big = {.name = "ef/big", .data = g, .n = N};
    int rc = ps_client_push(cf, 0, 1, &big, 1, DEADLINE_MS, &st);
    if (rc != 0)
        die("ef/big push 1", rc, &st);
    ef_check(cf, reader, "ef/big", sum, N, N, prev, NULL, NULL, "bf16 in pieces, pushed");
    grid_gradient(g, N, 2, 7);
    for (size_t i = 0; i < N; i++)
        sum[i] += g[i];
    grid_gradient(gs, EF_SMALL, 2, 8);
    ps_client_item two[2] = {{.name = "ef/big", .data = g, .n = N},
                             {.name = "no/such", .data = gs, .n = EF_SMALL}};
    rc = ps_client_push(cf, 0, 2, two, 2, DEADLINE_MS, &st);
    check(rc == PS_ERPC && st.code == PS_RPC_NOT_FOUND,
          "a bf16 push in pieces beside no variable fails NOT_FOUND (%s)", st.message);
    size_t changed = 0, owed = 0;
    ef_check(cf, reader, "ef/big", sum, N, N, w, prev, &changed,
             "a bf16 push in pieces refused part-way");
    for (size_t i = 0; i < N; i++)
        owed += g[i] != 0 && w[i] == prev[i];
    check(owed > 0, "the failed push left pieces unapplied (%zu of %d elements "
          "applied, %zu owed)", changed, N, owed);
    const float *r = NULL;
    size_t rn = 0;
    rc = ps_client_residual(cf, "no/such", &r, &rn);
    check(rc == 0 && rn == EF_SMALL && memcmp(r, gs, sizeof gs) == 0,
          "the refused small gradient is all in its residual");
    grid_gradient(g, N, 3, 7);
    for (size_t i = 0; i < N; i++)
        sum[i] += g[i];
    rc = ps_client_push(cf, 0, 3, &big, 1, DEADLINE_MS, &st);
    if (rc != 0)
        die("ef/big push 3", rc, &st);
    ef_check(cf, reader, "ef/big", sum, N, N, w, NULL, NULL,
             "the next push in pieces after it");
    rc = ps_client_residual(cf, "ef/big", &r, &rn);
    float worst = 0;
    for (size_t i = 0; rc == 0 && i < rn; i++)
        worst = fabsf(r[i]) > worst ? fabsf(r[i]) : worst;
    check(rc == 0 && worst <= 1.0f / 128,
          "the next push sent what the failed one owed (largest residual %g)",
          (double)worst);

    /* Bigger, in the client's default pieces (1 MiB, about 8 ms of sending
     * for this push on loopback): the small call's refusal comes back
     * while the pieces still go out, and the ones after it are never sent,
     * some never rounded. */
    ps_client *cd = client_default(addr);
    ps_client_set_wire_dtype(cd, PS_HALF_BF16, true);
    float *hg = malloc(EF_HUGE * sizeof *hg), *hw = malloc(EF_HUGE * sizeof *hw),
          *hs = calloc(EF_HUGE, sizeof *hs);
    if (hg == NULL || hw == NULL || hs == NULL)
        die("malloc", -12, NULL);
    create_zero(cd, "ef/huge", EF_HUGE);
    grid_gradient(hg, EF_HUGE, 1, 12);
    ps_client_item huge[2] = {{.name = "no/such3", .data = gs, .n = EF_SMALL},
                              {.name = "ef/huge", .data = hg, .n = EF_HUGE}};
    rc = ps_client_push(cd, 0, 1, huge, 2, DEADLINE_MS, &st);
    check(rc == PS_ERPC && st.code == PS_RPC_NOT_FOUND,
          "a bigger bf16 push in pieces beside no variable fails NOT_FOUND (%s)",
          st.message);
    ef_check(cd, reader, "ef/huge", hg, EF_HUGE, EF_HUGE, hw, hs, &changed,
             "a bigger bf16 push in pieces refused part-way");
    printf("  %zu of %d elements applied\n", changed, EF_HUGE);
    for (size_t i = 0; i < EF_HUGE; i++)
        hs[i] = hg[i];
    grid_gradient(hg, EF_HUGE, 2, 12);
    for (size_t i = 0; i < EF_HUGE; i++)
        hs[i] += hg[i];
    rc = ps_client_push(cd, 0, 2, &huge[1], 1, DEADLINE_MS, &st);
    if (rc != 0)
        die("ef/huge push 2", rc, &st);
    ef_check(cd, reader, "ef/huge", hs, EF_HUGE, EF_HUGE, hw, NULL, NULL,
             "the next bigger push in pieces after it");
    free(hg);
    free(hw);
    free(hs);
    ps_client_destroy(cd);

    /* A piece in the middle refused for a NaN: the pieces before it and
     * those already sent are applied, the rest are owed. */
    size_t mid = N / 2;
    grid_gradient(g, N, 1, 9);
    g[mid] = NAN;
    big.name = "ef/nan";
    rc = ps_client_push(cf, 0, 1, &big, 1, DEADLINE_MS, &st);
    check(rc == PS_ERPC && st.code == PS_RPC_INVALID_ARGUMENT,
          "a bf16 push in pieces with a NaN is refused (%s)", st.message);
    memset(prev, 0, N * sizeof *prev);
    ef_check(cf, reader, "ef/nan", g, N, mid, w, prev, &changed,
             "a bf16 piece refused for a NaN");
    rc = ps_client_residual(cf, "ef/nan", &r, &rn);
    check(rc == 0 && isnan(r[mid]) && changed > 0 && changed < N,
          "the NaN stays in its residual, %zu of %d elements applied", changed, N);

    /* Whole (not cut), two variables a push, ef/w2's element 5 at 3e38:
     * step 2 would take it past float's range, so psd applies ef/w1 and
     * refuses ef/w2, saying ef/w1 was applied; step 3 goes beside a
     * variable psd does not have and step 4 holds a NaN, both refused
     * before anything is applied. */
    float a[EF_SMALL], b[EF_SMALL];
    for (int step = 1; step <= 4; step++) {
        grid_gradient(a, EF_SMALL, step, 10);
        grid_gradient(b, EF_SMALL, step, 11);
        b[5] = step == 4 ? NAN : 3e38f;
        for (size_t i = 0; i < EF_SMALL; i++) {
            s1[i] += a[i];
            s2[i] += step != 3 ? b[i] : 0;
        }
        ps_client_item it[2] = {{.name = "ef/w1", .data = a, .n = EF_SMALL},
                                {.name = step == 3 ? "no/such2" : "ef/w2", .data = b,
                                 .n = EF_SMALL}};
        rc = ps_client_push(cw, 0, (uint64_t)step, it, 2, DEADLINE_MS, &st);
        if (step == 1 && rc != 0)
            die("whole push 1", rc, &st);
        if (step == 2)
            check(rc == PS_ERPC && st.code == PS_RPC_INVALID_ARGUMENT &&
                      strstr(st.message, "grads[1] in this push were applied") != NULL,
                  "a whole bf16 push whose second gradient would overflow is refused, "
                  "the first applied (%s)", st.message);
        if (step == 3)
            check(rc == PS_ERPC && st.code == PS_RPC_NOT_FOUND,
                  "a whole bf16 push beside no variable fails NOT_FOUND (%s)", st.message);
        if (step == 4)
            check(rc == PS_ERPC && st.code == PS_RPC_INVALID_ARGUMENT,
                  "a whole bf16 push with a NaN is refused (%s)", st.message);
        const char *what[] = {"", "whole push", "whole push refused after its first gradient",
                              "whole push refused beside no variable",
                              "whole push refused for a NaN"};
        ef_check(cw, reader, "ef/w1", s1, EF_SMALL, EF_SMALL, ws, NULL, NULL, what[step]);
        ef_check(cw, reader, "ef/w2", s2, EF_SMALL, 5, ws, NULL, NULL, what[step]);
    }
    free(g);
    free(sum);
    free(w);
    free(prev);
    ps_client_destroy(reader);
    ps_client_destroy(cw);
    ps_client_destroy(cf);
}

/* Worker 1's whole push of a sync step, on a thread of its own (it is
 * answered once worker 0's push completes the step). */
struct worker1 {
    ps_client *c;
    const char *name;
    uint64_t step;
    float *g;
    int rc;
    ps_rpc_status st;
};

static void *worker1_push(void *p)
{
    struct worker1 *w = p;
    ps_client_item it = {.name = w->name, .data = w->g, .n = N};
    w->rc = ps_client_push(w->c, 1, w->step, &it, 1, DEADLINE_MS, &w->st);
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: pieces ADDR\n");
        return 2;
    }
    ps_client *cp = client(argv[1], true), *cw = client(argv[1], false);
    ps_client *c1 = client(argv[1], false);
    float *g1 = malloc(N * sizeof *g1);
    float *g = malloc(N * sizeof *g), *va = malloc(N * sizeof *va),
          *vb = malloc(N * sizeof *vb), *w0 = malloc(N * sizeof *w0);
    double *sum = calloc(N, sizeof *sum);
    if (g == NULL || va == NULL || vb == NULL || w0 == NULL || sum == NULL)
        die("malloc", -12, NULL);

    create(cp, "f32/pieces", PS__V1__OPTIMIZER__KIND__ADAM, 0);
    create(cp, "f32/whole", PS__V1__OPTIMIZER__KIND__ADAM, 0);
    ps_rpc_msg *gm = ps_rpc_msg_new(N * sizeof(float));
    if (gm == NULL)
        die("ps_rpc_msg_new", -12, NULL);
    same_path(cp, cw, "f32/pieces", "f32/whole", "f32 Adam, sent in place", g, va, vb,
              gm);
    ps_rpc_msg_wait_unshared(gm);
    ps_rpc_msg_unref(gm);

    create(cp, "bf16/pieces", PS__V1__OPTIMIZER__KIND__SGD, 0);
    create(cp, "bf16/whole", PS__V1__OPTIMIZER__KIND__SGD, 0);
    ps_client_item l0 = {.name = "bf16/pieces", .data = w0, .n = N};
    ps_rpc_status st = {0};
    int rc = ps_client_pull(cp, &l0, 1, DEADLINE_MS, &st);
    if (rc != 0)
        die("pull w0", rc, &st);
    ps_client_set_wire_dtype(cp, PS_HALF_BF16, true);
    ps_client_set_wire_dtype(cw, PS_HALF_BF16, true);
    same_path(cp, cw, "bf16/pieces", "bf16/whole", "bf16 with error feedback", g, va, vb,
              NULL);
    for (int s = 1; s <= STEPS; s++) {
        gradient(g, s, 1);
        for (size_t i = 0; i < N; i++)
            sum[i] += g[i];
    }
    sum_invariant(cp, "bf16/pieces", w0, g, sum, va);
    ps_client_set_wire_dtype(cw, PS__V1__DTYPE__DTYPE_FLOAT32, false);

    /* SYNC, two workers a step: worker 0 in pieces, worker 1 whole, on one
     * variable; both whole on the other. One step, one version. */
    create(cp, "sync/pieces", PS__V1__OPTIMIZER__KIND__ADAM, 2);
    create(cp, "sync/whole", PS__V1__OPTIMIZER__KIND__ADAM, 2);
    int same = 1, versions = 1, back_same = 1;
    float *back = malloc(N * sizeof *back);
    if (back == NULL)
        die("malloc", -12, NULL);
    for (int s = 0; s < STEPS && same && versions; s++) {
        const char *names[2] = {"sync/pieces", "sync/whole"};
        for (int v = 0; v < 2; v++) {
            gradient(g1, s, 2);
            struct worker1 w1 = {c1, names[v], (uint64_t)s, g1, 0, {0}};
            pthread_t t;
            if (pthread_create(&t, NULL, worker1_push, &w1) != 0)
                die("pthread_create", -11, NULL);
            gradient(g, s, 1);
            ps_client_item p0 = {.name = names[v], .data = g, .n = N};
            /* In pieces with the value back: the pieces before the last
             * are answered at once, the last with the whole value once the
             * step is applied. */
            ps_client_item q0 = {.name = names[v], .data = back, .n = N};
            if (v == 0)
                rc = ps_client_push_pull(cp, 0, (uint64_t)s, &p0, &q0, 1, DEADLINE_MS,
                                         &st);
            else
                rc = ps_client_push(cw, 0, (uint64_t)s, &p0, 1, DEADLINE_MS, &st);
            pthread_join(t, NULL);
            if (rc != 0)
                die("sync push of worker 0", rc, &st);
            if (w1.rc != 0)
                die("sync push of worker 1", w1.rc, &w1.st);
            if (p0.version != (uint64_t)s + 1)
                versions = 0;
        }
        ps_client_item la = {.name = "sync/pieces", .data = va, .n = N};
        ps_client_item lb = {.name = "sync/whole", .data = vb, .n = N};
        if (ps_client_pull(cp, &la, 1, DEADLINE_MS, &st) != 0 ||
            ps_client_pull(cw, &lb, 1, DEADLINE_MS, &st) != 0)
            die("sync pull", PS_ERPC, &st);
        same = same && first_diff(va, vb) == N;
        back_same = back_same && first_diff(back, va) == N;
        versions = versions && la.version == (uint64_t)s + 1 && lb.version == la.version;
    }
    check(same, "sync, 2 workers, one pushing in pieces: the aggregate applied equals "
          "two whole pushes' bit for bit");
    check(versions, "sync: a step pushed in pieces is one step, one version");
    check(back_same, "sync: the value a push in pieces brings back is the step's applied value");
    free(back);

    /* Refusals still name the variable, and change nothing. */
    float *big = malloc((N + 5) * sizeof *big);
    if (big == NULL)
        die("malloc", -12, NULL);
    ps_client_item la = {.name = "f32/pieces", .data = va, .n = N};
    rc = ps_client_pull(cp, &la, 1, DEADLINE_MS, &st);
    if (rc != 0)
        die("pull before", rc, &st);
    uint64_t before = la.version;
    memset(big, 0, (N + 5) * sizeof *big);
    ps_client_item wrong = {.name = "f32/pieces", .data = big, .n = N + 5};
    rc = ps_client_push(cp, 0, 9, &wrong, 1, DEADLINE_MS, &st);
    check(rc == PS_ERPC && st.code == PS_RPC_INVALID_ARGUMENT &&
              strstr(st.message, "'f32/pieces'") != NULL &&
              strstr(st.message, "300012") != NULL,
          "a gradient of N + 5 elements in pieces is refused naming the variable (%s)",
          st.message);
    rc = ps_client_pull(cp, &wrong, 1, DEADLINE_MS, &st);
    check(rc != 0 && st.code == PS_RPC_FAILED_PRECONDITION &&
              strstr(st.message, "'f32/pieces'") != NULL,
          "a pull in pieces into N + 5 elements is refused naming the variable (%s)",
          st.message);
    ps_client_item lb = {.name = "f32/pieces", .data = vb, .n = N};
    rc = ps_client_pull(cp, &lb, 1, DEADLINE_MS, &st);
    check(rc == 0 && lb.version == before && first_diff(va, vb) == N,
          "the refused push changed nothing (version %llu)", (unsigned long long)lb.version);
    ps_client_item missing = {.name = "no/such", .data = g, .n = N};
    rc = ps_client_push(cp, 0, 9, &missing, 1, DEADLINE_MS, &st);
    check(rc == PS_ERPC && st.code == PS_RPC_NOT_FOUND && strstr(st.message, "'no/such'"),
          "a push in pieces to no variable is NOT_FOUND naming it (%s)", st.message);
    /* The same in bfloat16, whose pieces are made and rounded ahead of
     * their calls: the refusal drops the pieces not sent, and the client's
     * next push in pieces goes through whole. */
    ps_client_set_wire_dtype(cp, PS_HALF_BF16, true);
    rc = ps_client_push(cp, 0, 9, &missing, 1, DEADLINE_MS, &st);
    check(rc == PS_ERPC && st.code == PS_RPC_NOT_FOUND && strstr(st.message, "'no/such'"),
          "a bf16 push in pieces to no variable is NOT_FOUND naming it (%s)", st.message);
    gradient(g, STEPS + 1, 1);
    ps_client_item next = {.name = "bf16/pieces", .data = g, .n = N};
    rc = ps_client_push(cp, 0, STEPS + 1, &next, 1, DEADLINE_MS, &st);
    check(rc == 0 && next.version == STEPS + 1,
          "the next bf16 push in pieces is applied once (rc %d, version %llu)", rc,
          (unsigned long long)next.version);

    failed_part_way(argv[1]);

    free(big);
    free(g1);
    ps_client_destroy(c1);
    free(g);
    free(va);
    free(vb);
    free(w0);
    free(sum);
    ps_client_destroy(cp);
    ps_client_destroy(cw);
    return failed ? 1 : 0;
}
