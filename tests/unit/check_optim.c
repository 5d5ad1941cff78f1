#include "common/errors.h"
#include "server/optim.h"
#include "tests/unit/pscheck.h"
#include "tests/unit/refusals.h"

#include <check.h>
#include <float.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Odd and not a multiple of any vector width, so the loops' tails run too. */
#define N 1037
#define STEPS 12

/* A small deterministic generator for test data (xorshift64*). */
static uint64_t rng_state;
static void rng_seed(uint64_t s)
{
    rng_state = s * 2654435761u + 1;
}
static double rng_unit(void) /* [0, 1) */
{
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (double)((rng_state * 2685821657736338717ull) >> 11) * 0x1p-53;
}

static float from_bits(uint32_t bits)
{
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* ---- psd_opt_defaults ------------------------------------------------- */

START_TEST(test_defaults_fill_zero_fields)
{
    psd_opt o = {.kind = PSD_OPT_ADAM};
    psd_opt_defaults(&o);
    ck_assert_int_eq(o.kind, PSD_OPT_ADAM);
    ck_assert_float_eq(o.lr, 0.01f);
    ck_assert_float_eq(o.momentum, 0.9f);
    ck_assert_float_eq(o.initial_accumulator, 0.1f);
    ck_assert_float_eq(o.beta1, 0.9f);
    ck_assert_float_eq(o.beta2, 0.999f);
    ck_assert_float_eq(o.epsilon, 1e-7f);
    ck_assert_float_eq(o.lr_power, -0.5f);
    ck_assert(o.l1 == 0.0f && o.l2 == 0.0f && o.l2_shrinkage == 0.0f &&
              o.beta == 0.0f);
    ck_assert(!o.nesterov);
}
END_TEST

START_TEST(test_defaults_keep_set_fields)
{
    psd_opt o = {.kind = PSD_OPT_MOMENTUM, .lr = 0.5f, .momentum = 0.25f,
                 .nesterov = true, .initial_accumulator = 2.0f,
                 .beta1 = 0.5f, .beta2 = 0.75f, .epsilon = 1e-3f};
    psd_opt_defaults(&o);
    ck_assert_int_eq(o.kind, PSD_OPT_MOMENTUM);
    ck_assert_float_eq(o.lr, 0.5f);
    ck_assert_float_eq(o.momentum, 0.25f);
    ck_assert(o.nesterov);
    ck_assert_float_eq(o.initial_accumulator, 2.0f);
    ck_assert_float_eq(o.beta1, 0.5f);
    ck_assert_float_eq(o.beta2, 0.75f);
    ck_assert_float_eq(o.epsilon, 1e-3f);
}
END_TEST

START_TEST(test_defaults_negative_zero)
{
    psd_opt o = {.kind = PSD_OPT_SGD, .lr = -0.0f, .epsilon = -0.0f};
    psd_opt_defaults(&o);
    ck_assert_float_eq(o.lr, 0.01f);
    ck_assert_float_eq(o.epsilon, 1e-7f);
}
END_TEST

/* ---- psd_opt_validate ------------------------------------------------- */

static psd_opt defaulted(enum psd_opt_kind kind)
{
    psd_opt o = {.kind = kind};
    psd_opt_defaults(&o);
    return o;
}

START_TEST(test_validate_accepts_defaults)
{
    char why[256];
    for (int k = PSD_OPT_SGD; k <= PSD_OPT_FTRL; k++) {
        psd_opt o = defaulted((enum psd_opt_kind)k);
        ck_assert_int_eq(psd_opt_validate(&o, why, sizeof why), 0);
        o.nesterov = true;
        ck_assert_int_eq(psd_opt_validate(&o, why, sizeof why), 0);
    }
}
END_TEST

START_TEST(test_validate_unknown_kind)
{
    char why[256] = "";
    psd_opt o = defaulted(PSD_OPT_SGD);
    o.kind = (enum psd_opt_kind)5;
    ck_assert_int_eq(psd_opt_validate(&o, why, sizeof why), PS_EINVAL_ARG);
    ck_assert_ptr_nonnull(strstr(why, "optimizer kind 5 is unknown"));
    o.kind = (enum psd_opt_kind)-1;
    ck_assert_int_eq(psd_opt_validate(&o, why, sizeof why), PS_EINVAL_ARG);
    ck_assert_ptr_nonnull(strstr(why, "kind -1"));
}
END_TEST

/* psd_opt_validate on a row of a refusal table (refusals.h). */
static int validate_row(const struct ps_refusal *row, char *why, size_t whylen)
{
    psd_opt o = defaulted((enum psd_opt_kind)row->kind);
    ps_refusal_apply(&o, row);
    return psd_opt_validate(&o, why, whylen);
}

#define SET(field, v) {offsetof(psd_opt, field), v}

/* Each field's refusals, and the values each kind lets through. */
START_TEST(test_validate_fields)
{
    const struct ps_refusal t[] = {
        /* learning_rate */
        {PSD_OPT_SGD, {SET(lr, -1.0f)}, PS_EINVAL_ARG,
         "learning_rate must be > 0 and finite, got -1"},
        /* not defaulted: refused */
        {PSD_OPT_SGD, {SET(lr, 0.0f)}, PS_EINVAL_ARG,
         "learning_rate must be > 0 and finite, got 0"},
        {PSD_OPT_SGD, {SET(lr, NAN)}, PS_EINVAL_ARG, NULL, "learning_rate"},
        {PSD_OPT_SGD, {SET(lr, INFINITY)}, PS_EINVAL_ARG,
         "learning_rate must be > 0 and finite, got inf"},
        {PSD_OPT_SGD, {SET(lr, FLT_TRUE_MIN)}, 0},
        /* issue 13 f: lr 1e38 turned one finite push into (-inf, inf) */
        {PSD_OPT_SGD, {SET(lr, 1e38f)}, PS_EINVAL_ARG,
         "learning_rate must be at most 1000, got 1e+38"},
        {PSD_OPT_ADAM, {SET(lr, 1001.0f)}, PS_EINVAL_ARG, NULL, "at most 1000"},
        {PSD_OPT_MOMENTUM, {SET(lr, 1000.0f)}, 0},
        /* momentum */
        {PSD_OPT_MOMENTUM, {SET(momentum, 1.0f)}, PS_EINVAL_ARG,
         "momentum must be in [0, 1), got 1"},
        {PSD_OPT_MOMENTUM, {SET(momentum, -0.5f)}, PS_EINVAL_ARG,
         "momentum must be in [0, 1), got -0.5"},
        {PSD_OPT_MOMENTUM, {SET(momentum, NAN)}, PS_EINVAL_ARG},
        /* a set 0 (no defaults applied) is in range */
        {PSD_OPT_MOMENTUM, {SET(momentum, 0.0f)}, 0},
        {PSD_OPT_MOMENTUM, {SET(momentum, nextafterf(1.0f, 0.0f))}, 0},
        /* SGD ignores momentum: any finite value passes, NaN does not. */
        {PSD_OPT_SGD, {SET(momentum, 5.0f)}, 0},
        {PSD_OPT_SGD, {SET(momentum, NAN)}, PS_EINVAL_ARG, "momentum must be finite, got nan"},
        /* beta1, beta2 */
        {PSD_OPT_ADAM, {SET(beta1, 1.0f)}, PS_EINVAL_ARG, "beta1 must be in [0, 1), got 1"},
        {PSD_OPT_ADAM, {SET(beta1, -0.1f)}, PS_EINVAL_ARG, NULL, "beta1 must be in [0, 1)"},
        {PSD_OPT_ADAM, {SET(beta2, 1.5f)}, PS_EINVAL_ARG, "beta2 must be in [0, 1), got 1.5"},
        {PSD_OPT_ADAM, {SET(beta2, INFINITY)}, PS_EINVAL_ARG, NULL, "beta2"},
        /* Only ADAM range-checks the betas. */
        {PSD_OPT_MOMENTUM, {SET(beta1, 2.0f), SET(beta2, -3.0f)}, 0},
        {PSD_OPT_MOMENTUM, {SET(beta1, 2.0f), SET(beta2, -INFINITY)}, PS_EINVAL_ARG,
         "beta2 must be finite, got -inf"},
        /* initial_accumulator */
        {PSD_OPT_ADAGRAD, {SET(initial_accumulator, -0.1f)}, PS_EINVAL_ARG, NULL,
         "initial_accumulator must be >= 0 and finite, got -0.1"},
        {PSD_OPT_ADAGRAD, {SET(initial_accumulator, INFINITY)}, PS_EINVAL_ARG},
        {PSD_OPT_ADAGRAD, {SET(initial_accumulator, 0.0f)}, 0}, /* >= 0 */
        {PSD_OPT_ADAGRAD, {SET(initial_accumulator, 3e38f)}, PS_EINVAL_ARG,
         "initial_accumulator must be at most 1e+30, got 3e+38"},
        {PSD_OPT_ADAGRAD, {SET(initial_accumulator, 1e30f)}, 0},
        {PSD_OPT_ADAM, {SET(initial_accumulator, -0.1f)}, 0},
        {PSD_OPT_ADAM, {SET(initial_accumulator, NAN)}, PS_EINVAL_ARG,
         "initial_accumulator must be finite, got nan"},
        /* FTRL: TF's own checks (lr_power <= 0, strengths >= 0) within
         * optim.h's bounds; other kinds only ask these fields to be finite. */
        {PSD_OPT_FTRL, {SET(lr_power, 0.5f)}, PS_EINVAL_ARG,
         "learning_rate_power must be in [-10, 0], got 0.5"},
        {PSD_OPT_FTRL, {SET(lr_power, -11.0f)}, PS_EINVAL_ARG, NULL,
         "learning_rate_power must be in [-10, 0]"},
        {PSD_OPT_FTRL, {SET(lr_power, NAN)}, PS_EINVAL_ARG, NULL, "learning_rate_power"},
        {PSD_OPT_FTRL, {SET(lr_power, -10.0f)}, 0},
        {PSD_OPT_FTRL, {SET(lr_power, 0.0f)}, 0}, /* set after defaults */
        {PSD_OPT_FTRL, {SET(lr_power, PSD_OPT_LR_POWER_ZERO)}, 0},
        {PSD_OPT_FTRL, {SET(l1, -1.0f)}, PS_EINVAL_ARG, "l1 must be in [0, 1e+30], got -1"},
        {PSD_OPT_FTRL, {SET(l2, INFINITY)}, PS_EINVAL_ARG, "l2 must be in [0, 1e+30], got inf"},
        {PSD_OPT_FTRL, {SET(l2_shrinkage, -0.5f)}, PS_EINVAL_ARG, NULL, "l2_shrinkage"},
        {PSD_OPT_FTRL, {SET(beta, 2e30f)}, PS_EINVAL_ARG, NULL, "beta must be in [0, 1e+30]"},
        {PSD_OPT_FTRL, {SET(l1, 1e30f), SET(beta, 3.0f)}, 0},
        {PSD_OPT_FTRL, {SET(initial_accumulator, -1.0f)}, PS_EINVAL_ARG, NULL,
         "initial_accumulator must be >= 0"},
        {PSD_OPT_FTRL, {SET(initial_accumulator, 2e30f)}, PS_EINVAL_ARG, NULL,
         "initial_accumulator must be at most 1e+30"},
        /* Unused by ADAM: any finite value, but not NaN. */
        {PSD_OPT_ADAM, {SET(l1, -1.0f), SET(lr_power, 3.0f)}, 0},
        {PSD_OPT_ADAM, {SET(beta, NAN)}, PS_EINVAL_ARG, "beta must be finite, got nan"},
    };
    PS_CHECK_REFUSALS(t, validate_row);
}
END_TEST

START_TEST(test_validate_epsilon)
{
    for (int k = PSD_OPT_ADAGRAD; k <= PSD_OPT_ADAM; k++) {
        const struct ps_refusal t[] = {
            {k, {SET(epsilon, 0.0f)}, PS_EINVAL_ARG, "epsilon must be > 0 and finite, got 0"},
            {k, {SET(epsilon, -1e-8f)}, PS_EINVAL_ARG, NULL, "epsilon must be > 0"},
            {k, {SET(epsilon, NAN)}, PS_EINVAL_ARG},
            {k, {SET(epsilon, 1e-38f)}, PS_EINVAL_ARG,
             "epsilon must be at least 1e-30, got 1e-38"},
            {k, {SET(epsilon, 1e-30f)}, 0},
        };
        PS_CHECK_REFUSALS(t, validate_row);
    }
    const struct ps_refusal sgd[] = {{PSD_OPT_SGD, {SET(epsilon, -1.0f)}, 0}};
    PS_CHECK_REFUSALS(sgd, validate_row);
}
END_TEST

#undef SET

START_TEST(test_validate_why_null_or_short)
{
    psd_opt o = defaulted(PSD_OPT_SGD);
    o.lr = -1.0f;
    ck_assert_int_eq(psd_opt_validate(&o, NULL, 0), PS_EINVAL_ARG);
    char why[8];
    memset(why, 'x', sizeof why);
    ck_assert_int_eq(psd_opt_validate(&o, why, sizeof why), PS_EINVAL_ARG);
    ck_assert_str_eq(why, "learnin");
    o.kind = (enum psd_opt_kind)9;
    ck_assert_int_eq(psd_opt_validate(&o, NULL, 0), PS_EINVAL_ARG);
}
END_TEST

/* ---- psd_opt_slot_count, psd_opt_name --------------------------------- */

START_TEST(test_slot_count)
{
    psd_opt o = {.kind = PSD_OPT_SGD};
    ck_assert_int_eq(psd_opt_slot_count(&o), 0);
    o.kind = PSD_OPT_MOMENTUM;
    ck_assert_int_eq(psd_opt_slot_count(&o), 1);
    o.kind = PSD_OPT_ADAGRAD;
    ck_assert_int_eq(psd_opt_slot_count(&o), 1);
    o.kind = PSD_OPT_ADAM;
    ck_assert_int_eq(psd_opt_slot_count(&o), 2);
    o.kind = PSD_OPT_FTRL;
    ck_assert_int_eq(psd_opt_slot_count(&o), 2);
    o.kind = (enum psd_opt_kind)17;
    ck_assert_int_eq(psd_opt_slot_count(&o), 0);
}
END_TEST

START_TEST(test_name)
{
    static const char *const names[] = {"SGD", "MOMENTUM", "ADAGRAD", "ADAM",
                                        "FTRL"};
    for (int k = PSD_OPT_SGD; k <= PSD_OPT_FTRL; k++)
        ck_assert_str_eq(psd_opt_name((enum psd_opt_kind)k), names[k - PSD_OPT_SGD]);
    ck_assert_str_eq(psd_opt_name((enum psd_opt_kind)5), "UNKNOWN");
    ck_assert_str_eq(psd_opt_name((enum psd_opt_kind)-1), "UNKNOWN");
}
END_TEST

/* ---- psd_opt_init_slots ----------------------------------------------- */

START_TEST(test_init_slots)
{
    float slots[2 * N];
    psd_opt o = defaulted(PSD_OPT_ADAGRAD);
    o.initial_accumulator = 0.25f;
    memset(slots, 0x7f, sizeof slots);
    psd_opt_init_slots(&o, slots, N);
    for (size_t i = 0; i < N; i++)
        ck_assert_float_eq(slots[i], 0.25f);
    ck_assert_uint_eq(*(unsigned char *)&slots[N], 0x7f); /* untouched */

    o = defaulted(PSD_OPT_MOMENTUM);
    memset(slots, 0x7f, sizeof slots);
    psd_opt_init_slots(&o, slots, N);
    for (size_t i = 0; i < N; i++)
        ck_assert(slots[i] == 0.0f && !signbit(slots[i]));
    ck_assert_uint_eq(*(unsigned char *)&slots[N], 0x7f);

    o = defaulted(PSD_OPT_ADAM);
    memset(slots, 0x7f, sizeof slots);
    psd_opt_init_slots(&o, slots, N);
    for (size_t i = 0; i < 2 * N; i++)
        ck_assert(slots[i] == 0.0f && !signbit(slots[i]));

    o = defaulted(PSD_OPT_FTRL); /* accumulator, then linear at 0 */
    o.initial_accumulator = 0.5f;
    memset(slots, 0x7f, sizeof slots);
    psd_opt_init_slots(&o, slots, N);
    for (size_t i = 0; i < N; i++)
        ck_assert(slots[i] == 0.5f && slots[N + i] == 0.0f && !signbit(slots[N + i]));

    o = defaulted(PSD_OPT_SGD);
    psd_opt_init_slots(&o, NULL, N); /* no slots: nothing touched */
    o = defaulted(PSD_OPT_ADAM);
    psd_opt_init_slots(&o, NULL, 0);
}
END_TEST

/* ---- psd_opt_apply against a double-precision reference --------------- */

/* The reference: the documented formulas, one element at a time, in
 * double. w and slots are double copies of the float state. */
static void ref_apply(const psd_opt *o, double *w, double *slots,
                      const double *g, size_t n, double scale, uint64_t t)
{
    double lr = o->lr, mu = o->momentum, eps = o->epsilon;
    double b1 = o->beta1, b2 = o->beta2;
    for (size_t i = 0; i < n; i++) {
        double gi = g[i] * scale;
        switch (o->kind) {
        case PSD_OPT_SGD:
            w[i] -= lr * gi;
            break;
        case PSD_OPT_MOMENTUM:
            slots[i] = mu * slots[i] + gi;
            if (o->nesterov)
                w[i] -= lr * (gi + mu * slots[i]);
            else
                w[i] -= lr * slots[i];
            break;
        case PSD_OPT_ADAGRAD:
            slots[i] += gi * gi;
            w[i] -= lr * gi / (sqrt(slots[i]) + eps);
            break;
        case PSD_OPT_ADAM: {
            double *m = slots, *v = slots + n;
            double lr_t = lr * sqrt(1.0 - pow(b2, (double)t)) /
                          (1.0 - pow(b1, (double)t));
            m[i] = b1 * m[i] + (1.0 - b1) * gi;
            v[i] = b2 * v[i] + (1.0 - b2) * gi * gi;
            w[i] -= lr_t * m[i] / (sqrt(v[i]) + eps);
            break;
        }
        case PSD_OPT_FTRL: /* ref_ftrl, in float */
            break;
        }
    }
}

/* Asserts once per array (a passing ck_assert costs Check a message to its
 * runner, which makes a million of them slow under valgrind). */
static void assert_close(const float *got, const double *want, size_t n,
                         const char *what, int step)
{
    for (size_t i = 0; i < n; i++) {
        double tol = 1e-6 * fabs(want[i]);
        if (!(fabs((double)got[i] - want[i]) <= tol))
            ck_abort_msg("%s[%zu] after step %d: got %.9g, want %.9g", what,
                         i, step, (double)got[i], want[i]);
    }
}

/* Runs STEPS updates of o on both implementations and compares w and every
 * slot after each. Each element's gradient keeps its sign over the steps
 * and its magnitude stays in [0.1, 1] (or is 0 now and then), and w starts
 * at magnitude 1 to 2 on the side the updates move it away from 0: nothing
 * cancels towards 0, so a relative tolerance of 1e-6 per element holds for a
 * correct float implementation. */
static void run_against_reference(psd_opt o, float scale)
{
    static float w[N], slots[2 * N], g[N];
    static double rw[N], rslots[2 * N], rg[N];
    static double sign[N];
    char why[256];
    ck_assert_int_eq(psd_opt_validate(&o, why, sizeof why), 0);
    int nslots = psd_opt_slot_count(&o);

    rng_seed((uint64_t)o.kind * 10 + o.nesterov);
    for (size_t i = 0; i < N; i++) {
        sign[i] = rng_unit() < 0.5 ? -1.0 : 1.0;
        w[i] = (float)(-sign[i] * (1.0 + rng_unit()));
        rw[i] = w[i];
    }
    psd_opt_init_slots(&o, slots, N);
    for (size_t i = 0; i < (size_t)nslots * N; i++)
        rslots[i] = slots[i];

    for (int step = 1; step <= STEPS; step++) {
        for (size_t i = 0; i < N; i++) {
            double r = rng_unit();
            g[i] = r < 0.1 ? 0.0f : (float)(sign[i] * (0.1 + 0.9 * rng_unit()));
            rg[i] = g[i];
        }
        psd_opt_apply(&o, w, slots, g, N, scale, (uint64_t)step);
        ref_apply(&o, rw, rslots, rg, N, scale, (uint64_t)step);
        assert_close(w, rw, N, "w", step);
        for (int k = 0; k < nslots; k++)
            assert_close(slots + (size_t)k * N, rslots + (size_t)k * N, N,
                         "slot", step);
    }
}

/* psd applies a gradient part by part, as it arrived in pieces: any split
 * must give the same bits as one whole apply, slots included. */
START_TEST(test_apply_parts_same_bits)
{
    enum { M = 10007 };
    static const enum psd_opt_kind kinds[] = {PSD_OPT_SGD, PSD_OPT_MOMENTUM,
                                              PSD_OPT_ADAGRAD, PSD_OPT_ADAM,
                                              PSD_OPT_FTRL};
    static float w1[M], w2[M], s1[2 * M], s2[2 * M], g[M];
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
        psd_opt o = {.kind = kinds[k], .lr = 0.01f, .nesterov = k == 1,
                     .l1 = 0.001f, .l2_shrinkage = 0.01f};
        psd_opt_defaults(&o);
        rng_seed(1000 + k);
        for (size_t i = 0; i < M; i++)
            w1[i] = w2[i] = (float)(rng_unit() - 0.5);
        psd_opt_init_slots(&o, s1, M);
        psd_opt_init_slots(&o, s2, M);
        for (int step = 1; step <= 3; step++) {
            for (size_t i = 0; i < M; i++)
                g[i] = (float)(rng_unit() - 0.5);
            psd_opt_apply(&o, w1, s1, g, M, 0.5f, (uint64_t)step);
            /* Parts of 1, 3, 7, ... elements: odd lengths and offsets. */
            size_t off = 0, len = 1;
            while (off < M) {
                size_t n = len < M - off ? len : M - off;
                psd_opt_apply_part(&o, w2 + off, s2 + off, M, g + off, n, 0.5f,
                                   (uint64_t)step);
                off += n;
                len = len * 2 + 1;
            }
        }
        int nslots = psd_opt_slot_count(&o);
        ck_assert_msg(memcmp(w1, w2, sizeof w1) == 0, "%s: values differ",
                      psd_opt_name(o.kind));
        ck_assert_msg(memcmp(s1, s2, (size_t)nslots * M * sizeof(float)) == 0,
                      "%s: slots differ", psd_opt_name(o.kind));
    }
}
END_TEST

START_TEST(test_apply_sgd)
{
    psd_opt o = {.kind = PSD_OPT_SGD, .lr = 0.05f};
    psd_opt_defaults(&o);
    run_against_reference(o, 1.0f);
}
END_TEST

START_TEST(test_apply_momentum)
{
    psd_opt o = {.kind = PSD_OPT_MOMENTUM, .lr = 0.01f, .momentum = 0.8f};
    psd_opt_defaults(&o);
    run_against_reference(o, 1.0f);
}
END_TEST

START_TEST(test_apply_nesterov)
{
    psd_opt o = {.kind = PSD_OPT_MOMENTUM, .nesterov = true};
    psd_opt_defaults(&o);
    run_against_reference(o, 1.0f);
}
END_TEST

START_TEST(test_apply_adagrad)
{
    psd_opt o = {.kind = PSD_OPT_ADAGRAD, .lr = 0.1f};
    psd_opt_defaults(&o);
    run_against_reference(o, 1.0f);
}
END_TEST

START_TEST(test_apply_adam)
{
    psd_opt o = {.kind = PSD_OPT_ADAM, .lr = 0.02f, .beta1 = 0.8f,
                 .beta2 = 0.99f, .epsilon = 1e-6f};
    psd_opt_defaults(&o);
    run_against_reference(o, 1.0f);
    o = defaulted(PSD_OPT_ADAM);
    run_against_reference(o, 1.0f);
}
END_TEST

/* `scale` multiplies the gradient before everything, g^2 included. */
START_TEST(test_apply_scale)
{
    for (int k = PSD_OPT_SGD; k <= PSD_OPT_ADAM; k++) { /* FTRL: test_apply_ftrl */
        psd_opt o = defaulted((enum psd_opt_kind)k);
        run_against_reference(o, 0.25f);
        run_against_reference(o, 3.0f);
        o.nesterov = true;
        run_against_reference(o, 0.5f);
    }
}
END_TEST

/* Sync mode: sum four pushes with psd_accumulate, apply with scale 1/4;
 * that is the same update as applying their mean. */
START_TEST(test_apply_sync_average)
{
    static float g[4][N], acc[N], w[N], slots[2 * N], w2[N], slots2[2 * N],
        mean[N];
    rng_seed(99);
    for (int p = 0; p < 4; p++)
        for (size_t i = 0; i < N; i++)
            g[p][i] = (float)(rng_unit() * 2.0 - 1.0);
    memset(acc, 0, sizeof acc);
    for (int p = 0; p < 4; p++)
        psd_accumulate(acc, g[p], N);
    for (size_t i = 0; i < N; i++)
        mean[i] = acc[i] / 4.0f; /* exact: a power of two */
    psd_opt o = defaulted(PSD_OPT_ADAM);
    for (size_t i = 0; i < N; i++)
        w[i] = w2[i] = 1.0f + (float)i / N;
    psd_opt_init_slots(&o, slots, N);
    psd_opt_init_slots(&o, slots2, N);
    psd_opt_apply(&o, w, slots, acc, N, 0.25f, 1);
    psd_opt_apply(&o, w2, slots2, mean, N, 1.0f, 1);
    ck_assert_mem_eq(w, w2, sizeof w);
    ck_assert_mem_eq(slots, slots2, sizeof slots);
}
END_TEST

/* Adam's first step moves each weight by about lr * sign(g) (the bias
 * correction at work), and t = 0 is taken as 1. */
START_TEST(test_apply_adam_first_step)
{
    float w[3] = {1.0f, 1.0f, 1.0f}, g[3] = {0.5f, -2.0f, 1e-3f};
    float slots[6];
    psd_opt o = defaulted(PSD_OPT_ADAM);
    psd_opt_init_slots(&o, slots, 3);
    psd_opt_apply(&o, w, slots, g, 3, 1.0f, 0);
    ck_assert_float_eq_tol(w[0], 1.0f - 0.01f, 1e-6f);
    ck_assert_float_eq_tol(w[1], 1.0f + 0.01f, 1e-6f);
    ck_assert_float_eq_tol(w[2], 1.0f - 0.01f, 1e-4f); /* eps matters */
}
END_TEST

/* Late steps: beta^t underflows and the correction tends to 1. */
START_TEST(test_apply_adam_large_t)
{
    float w[1] = {0.0f}, g[1] = {1.0f}, slots[2] = {1.0f, 1.0f};
    psd_opt o = defaulted(PSD_OPT_ADAM);
    psd_opt_apply(&o, w, slots, g, 1, 1.0f, UINT64_C(1) << 40);
    ck_assert(isfinite(w[0]));
    ck_assert_float_eq_tol(w[0], -0.01f / (1.0f + 1e-7f), 1e-8f);
}
END_TEST

START_TEST(test_apply_empty_and_unknown)
{
    psd_opt o = defaulted(PSD_OPT_ADAM);
    psd_opt_apply(&o, NULL, NULL, NULL, 0, 1.0f, 1);
    float w[2] = {1.0f, 2.0f}, g[2] = {1.0f, 1.0f};
    o.kind = (enum psd_opt_kind)9;
    psd_opt_apply(&o, w, NULL, g, 2, 1.0f, 1);
    ck_assert_float_eq(w[0], 1.0f);
    ck_assert_float_eq(w[1], 2.0f);
}
END_TEST

/* ---- FTRL against a scalar transcription of TF's kernel --------------- */

/* TensorFlow's ApplyFtrl / ApplyFtrlV2 (core/kernels/training_ops.cc), one
 * element at a time in float, written from the kernel rather than from
 * optim.c: Keras passes l2 + beta / (2 lr) as the kernel's l2 and calls
 * ApplyFtrl (no shrinkage term) when l2_shrinkage is 0. Slots: n then z. */
static void ref_ftrl(const psd_opt *o, float *w, float *slots, const float *g,
                     size_t n, float scale)
{
    float *acc = slots, *lin = slots + n;
    float lr = o->lr, l1 = o->l1, p = o->lr_power;
    float l2 = o->l2 + o->beta / (2.0f * lr);
    for (size_t i = 0; i < n; i++) {
        float grad = g[i] * scale;
        float gws = o->l2_shrinkage > 0.0f ? grad + 2.0f * o->l2_shrinkage * w[i]
                                           : grad;
        float new_acc = acc[i] + grad * grad;
        float pn, po;
        if (p == -0.5f) {
            pn = sqrtf(new_acc);
            po = sqrtf(acc[i]);
        } else {
            pn = powf(new_acc, -p);
            po = powf(acc[i], -p);
        }
        lin[i] += gws - (pn - po) / lr * w[i];
        float sign = lin[i] > 0.0f ? 1.0f : lin[i] < 0.0f ? -1.0f : 0.0f;
        float x = l1 * sign - lin[i];
        float y = pn / lr + 2.0f * l2;
        w[i] = fabsf(lin[i]) > l1 ? x / y : 0.0f;
        acc[i] += grad * grad;
    }
}

/* STEPS updates of o by psd_opt_apply and by ref_ftrl from the same random
 * state; every value and slot must have the same bits after each. */
static void ftrl_against_reference(psd_opt o, float scale)
{
    static float w[N], s[2 * N], g[N], rw[N], rs[2 * N];
    char why[256];
    ck_assert_msg(psd_opt_validate(&o, why, sizeof why) == 0, "%s", why);
    rng_seed(77);
    for (size_t i = 0; i < N; i++)
        w[i] = rw[i] = (float)(rng_unit() - 0.5);
    psd_opt_init_slots(&o, s, N);
    memcpy(rs, s, sizeof s);
    for (int step = 1; step <= STEPS; step++) {
        for (size_t i = 0; i < N; i++)
            g[i] = rng_unit() < 0.1 ? 0.0f : (float)(rng_unit() * 2.0 - 1.0);
        psd_opt_apply(&o, w, s, g, N, scale, (uint64_t)step);
        ref_ftrl(&o, rw, rs, g, N, scale);
        for (size_t i = 0; i < N; i++)
            if (memcmp(&w[i], &rw[i], 4) || memcmp(&s[i], &rs[i], 4) ||
                memcmp(&s[N + i], &rs[N + i], 4))
                ck_abort_msg("lr_power %g l1 %g l2 %g l2s %g beta %g: element "
                             "%zu after step %d: w %.9g n %.9g z %.9g, want "
                             "%.9g %.9g %.9g", (double)o.lr_power, (double)o.l1,
                             (double)o.l2, (double)o.l2_shrinkage,
                             (double)o.beta, i, step, (double)w[i],
                             (double)s[i], (double)s[N + i], (double)rw[i],
                             (double)rs[i], (double)rs[N + i]);
    }
}

START_TEST(test_apply_ftrl)
{
    static const float lr_powers[] = {-0.5f, -0.25f, -1.0f};
    for (size_t p = 0; p < 3; p++) {
        psd_opt o = {.kind = PSD_OPT_FTRL, .lr = 0.1f, .lr_power = lr_powers[p]};
        psd_opt_defaults(&o);
        ftrl_against_reference(o, 1.0f);
        o.l1 = 0.01f;
        ftrl_against_reference(o, 1.0f);
        o.l2 = 0.1f;
        ftrl_against_reference(o, 0.5f);
        o.l2_shrinkage = 0.05f;
        ftrl_against_reference(o, 1.0f);
        o.beta = 1.0f;
        o.initial_accumulator = 0.5f;
        ftrl_against_reference(o, 3.0f);
    }
}
END_TEST

/* TF's lr_power 0 is asked for as PSD_OPT_LR_POWER_ZERO: the same bits as
 * the kernel at exactly 0, whose powers are all 1. */
START_TEST(test_apply_ftrl_lr_power_zero)
{
    psd_opt o = {.kind = PSD_OPT_FTRL, .lr = 0.05f, .l1 = 0.001f,
                 .lr_power = PSD_OPT_LR_POWER_ZERO};
    psd_opt_defaults(&o);
    ck_assert_float_eq(o.lr_power, PSD_OPT_LR_POWER_ZERO);
    static float w[N], s[2 * N], g[N], rw[N], rs[2 * N];
    rng_seed(5);
    for (size_t i = 0; i < N; i++)
        w[i] = rw[i] = (float)(rng_unit() - 0.5);
    psd_opt_init_slots(&o, s, N);
    memcpy(rs, s, sizeof s);
    psd_opt z = o;
    z.lr_power = 0.0f; /* the kernel's value, which the proto cannot carry */
    for (int step = 1; step <= STEPS; step++) {
        for (size_t i = 0; i < N; i++)
            g[i] = (float)(rng_unit() * 2.0 - 1.0);
        psd_opt_apply(&o, w, s, g, N, 1.0f, (uint64_t)step);
        ref_ftrl(&z, rw, rs, g, N, 1.0f);
    }
    ck_assert_mem_eq(w, rw, sizeof w);
    ck_assert_mem_eq(s, rs, sizeof s);
    /* The claim behind it: n^1e-38 is 1 for positive floats of every scale. */
    const float ns[] = {FLT_TRUE_MIN, 1e-30f, 0.1f, 1.0f, 7.0f, 1e20f, FLT_MAX};
    for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++)
        ck_assert_float_eq(powf(ns[i], -PSD_OPT_LR_POWER_ZERO), 1.0f);
}
END_TEST

/* A linear term within [-l1, l1] gives exactly 0, the sparsity FTRL is for. */
START_TEST(test_apply_ftrl_l1_zeroes)
{
    psd_opt o = {.kind = PSD_OPT_FTRL, .lr = 0.1f, .l1 = 1.0f};
    psd_opt_defaults(&o);
    float w[2] = {0.0f, 0.0f}, s[4], g[2] = {0.5f, 4.0f};
    psd_opt_init_slots(&o, s, 2);
    psd_opt_apply(&o, w, s, g, 2, 1.0f, 1);
    ck_assert(w[0] == 0.0f); /* z = 0.5: |z| <= l1 */
    /* z = 4: w = (l1 - z) / (sqrt(n') / lr), against the gradient */
    ck_assert_float_eq_tol(w[1], -3.0f / (sqrtf(16.1f) / 0.1f), 1e-7f);
    ck_assert_float_eq(s[0], 0.1f + 0.25f);
}
END_TEST

/* ---- psd_all_finite --------------------------------------------------- */

START_TEST(test_finite_values)
{
    static float x[10000];
    for (size_t i = 0; i < 10000; i++)
        x[i] = (float)i - 5000.0f;
    ck_assert(psd_all_finite(x, 10000));
    ck_assert(psd_all_finite(x, 0));
    ck_assert(psd_all_finite(NULL, 0));

    /* Edge values that are finite. */
    const float edge[] = {
        -0.0f, 0.0f, FLT_TRUE_MIN, -FLT_TRUE_MIN, FLT_MIN / 2, -FLT_MIN,
        FLT_MAX, -FLT_MAX, from_bits(0x007fffffu) /* largest denormal */,
        from_bits(0x7f7fffffu) /* FLT_MAX by bits */,
    };
    ck_assert(psd_all_finite(edge, sizeof edge / sizeof edge[0]));
}
END_TEST

START_TEST(test_finite_rejects)
{
    static float x[10000];
    const uint32_t bad[] = {
        0x7fc00000u, /* quiet NaN */
        0xffc00000u, /* negative quiet NaN */
        0x7f800001u, /* signalling NaN */
        0x7fffffffu, /* NaN, all payload bits */
        0x7f800000u, /* +Inf */
        0xff800000u, /* -Inf */
    };
    /* First, inside the first block, at a block edge, in the tail, last. */
    const size_t at[] = {0, 1, 17, 4095, 4096, 4097, 8191, 9998, 9999};
    for (size_t b = 0; b < sizeof bad / sizeof bad[0]; b++) {
        for (size_t a = 0; a < sizeof at / sizeof at[0]; a++) {
            for (size_t i = 0; i < 10000; i++)
                x[i] = 1.0f;
            x[at[a]] = from_bits(bad[b]);
            ck_assert_msg(!psd_all_finite(x, 10000), "bits %08x at %zu",
                          bad[b], at[a]);
            /* Not counted when outside the first n. */
            ck_assert(psd_all_finite(x, at[a]));
        }
    }
    ck_assert(!psd_all_finite((const float[]){NAN}, 1));
    ck_assert(!psd_all_finite((const float[]){-INFINITY}, 1));
}
END_TEST

/* ---- psd_l2_norm ------------------------------------------------------ */

START_TEST(test_l2_norm)
{
    ck_assert_double_eq(psd_l2_norm((const float[]){3.0f, 4.0f}, 2), 5.0);
    ck_assert_double_eq(psd_l2_norm(NULL, 0), 0.0);
    ck_assert_double_eq(psd_l2_norm((const float[]){-2.0f}, 1), 2.0);

    static float x[N];
    double sum = 0.0;
    rng_seed(5);
    for (size_t i = 0; i < N; i++) {
        x[i] = (float)(rng_unit() * 2.0 - 1.0);
        sum += (double)x[i] * x[i];
    }
    ck_assert_double_eq_tol(psd_l2_norm(x, N), sqrt(sum), 1e-12 * sqrt(sum));
    /* Squares of floats never overflow a double. */
    double big = psd_l2_norm((const float[]){FLT_MAX, FLT_MAX}, 2);
    ck_assert_double_eq_tol(big, (double)FLT_MAX * sqrt(2.0), 1e-9 * big);
    ck_assert(isnan(psd_l2_norm((const float[]){1.0f, NAN, 2.0f}, 3)));
    ck_assert(isinf(psd_l2_norm((const float[]){1.0f, -INFINITY}, 2)));
}
END_TEST

/* ---- psd_opt_check_part, psd_opt_safe, psd_max_mag (issue 13 f) ------- */

static uint32_t mag_of(float x)
{
    uint32_t b;
    memcpy(&b, &x, sizeof b);
    return b & 0x7fffffffu;
}

/* The largest magnitude of n floats, and whether one is Inf or NaN. */
static uint32_t max_mag_ref(const float *x, size_t n, bool *nonfinite)
{
    uint32_t m = 0;
    for (size_t i = 0; i < n; i++) {
        m = mag_of(x[i]) > m ? mag_of(x[i]) : m;
        if (!isfinite(x[i]))
            *nonfinite = true;
    }
    return m;
}

/* One spec of each kind (Nesterov as a sixth), with the issue's
 * hyperparameters where it gave them. */
#define KIND_SPECS 6
static psd_opt kind_spec(int k)
{
    psd_opt o = {.kind = k == 5 ? PSD_OPT_MOMENTUM : (enum psd_opt_kind)k,
                 .lr = 0.01f, .nesterov = k == 5};
    psd_opt_defaults(&o);
    return o;
}

/* For each kind: a gradient whose element `at` makes the update overflow
 * (3e38 at lr 0.01 on a value of -3.39e38 for the linear kinds; the squares
 * of ADAGRAD and ADAM overflow from any 3e38). psd_opt_check_part names
 * that element and writes nothing; applying instead does turn exactly that
 * element non-finite, so the check and the update agree. */
START_TEST(test_check_finds_first_overflow)
{
    enum { M = 5000 }; /* past one check block */
    static float w[M], slots[2 * M], g[M], w0[M], s0[2 * M];
    for (int k = 0; k < KIND_SPECS; k++) {
        psd_opt o = kind_spec(k);
        size_t at = 4099;
        for (size_t i = 0; i < M; i++) {
            w[i] = i == at ? -3.39e38f : 0.25f;
            g[i] = i == at ? 3e38f : 1.0f;
        }
        psd_opt_init_slots(&o, slots, M);
        memcpy(w0, w, sizeof w);
        memcpy(s0, slots, sizeof slots);
        ck_assert_uint_eq(psd_opt_check_part(&o, w, slots, M, g, M, 1.0f, 1), at);
        ck_assert(memcmp(w, w0, sizeof w) == 0 && memcmp(slots, s0, sizeof s0) == 0);
        /* An element before it is not reported: the check is of the part. */
        ck_assert_uint_eq(psd_opt_check_part(&o, w, slots, M, g, at, 1.0f, 1), at);
        ck_assert(!psd_opt_safe(&o, mag_of(3.39e38f), mag_of(3e38f), 1.0f, 1));
        bool bad = false;
        uint32_t mag = psd_opt_apply(&o, w, slots, g, M, 1.0f, 1);
        ck_assert_uint_ge(mag, 0x7f800000u);
        for (size_t i = 0; i < M; i++) {
            bool nf = !isfinite(w[i]);
            for (int j = 0; j < psd_opt_slot_count(&o); j++)
                nf = nf || !isfinite(slots[(size_t)j * M + i]);
            ck_assert_msg(nf == (i == at), "kind %d element %zu", k, i);
            bad = bad || nf;
        }
        ck_assert(bad);
    }
}
END_TEST

/* Adam's second moment: (1 - beta2) * g * g overflows for g = 3e38 though
 * the value would stay finite (the issue: the element then never moved). */
START_TEST(test_check_adam_second_moment)
{
    psd_opt o = kind_spec(PSD_OPT_ADAM);
    float w[2] = {0.5f, 0.5f}, slots[4] = {0}, g[2] = {1.0f, 3e38f};
    ck_assert_uint_eq(psd_opt_check_part(&o, w, slots, 2, g, 2, 1.0f, 1), 1);
    g[1] = 1e18f; /* squares to 1e36 * 0.001: fine */
    ck_assert_uint_eq(psd_opt_check_part(&o, w, slots, 2, g, 2, 1.0f, 1), 2);
}
END_TEST

/* Random states and gradients over many magnitudes: whenever psd_opt_safe
 * says an update is safe, the update writes nothing non-finite, the check
 * agrees, and the magnitude psd_opt_apply returns is the largest it wrote;
 * psd_max_mag is the largest magnitude of the gradient. */
START_TEST(test_safe_is_sound)
{
    enum { M = 67 };
    float w[M], slots[2 * M], g[M];
    int proven = 0;
    rng_seed(13);
    for (int trial = 0; trial < 4000; trial++) {
        psd_opt o = kind_spec(trial % KIND_SPECS);
        if (o.kind == PSD_OPT_FTRL) { /* both paths, some regularization */
            o.lr_power = trial % 12 == 4 ? -0.5f : -(float)rng_unit();
            o.l1 = (float)rng_unit() * 0.01f;
            o.l2 = trial % 3 ? 0.0f : (float)rng_unit();
            o.l2_shrinkage = trial % 2 ? 0.0f : (float)rng_unit();
        }
        o.lr = (float)pow(10.0, -4.0 + 7.0 * rng_unit()); /* up to 1000 */
        double se = pow(10.0, 40.0 * rng_unit() - 2.0);
        double ge = pow(10.0, 40.0 * rng_unit() - 2.0);
        for (size_t i = 0; i < M; i++) {
            w[i] = (float)((rng_unit() * 2.0 - 1.0) * se);
            g[i] = (float)((rng_unit() * 2.0 - 1.0) * ge);
            slots[i] = (float)(rng_unit() * se); /* ADAGRAD and ADAM's v: >= 0 */
            slots[M + i] = (float)(rng_unit() * se);
            if (o.kind == PSD_OPT_MOMENTUM)
                slots[i] -= (float)(se / 2);
        }
        if (o.kind == PSD_OPT_FTRL) /* n >= initial_accumulator; z any sign */
            for (size_t i = 0; i < M; i++) {
                slots[i] = fmaxf(slots[i], o.initial_accumulator);
                slots[M + i] -= (float)(se / 2);
            }
        if (o.kind == PSD_OPT_ADAM)
            for (size_t i = 0; i < M; i++) { /* m may have either sign */
                float t = slots[i];
                slots[i] = slots[M + i] - (float)(se / 2);
                slots[M + i] = t;
            }
        bool nf = false;
        uint32_t smag = max_mag_ref(w, M, &nf);
        uint32_t sm = max_mag_ref(slots, (size_t)psd_opt_slot_count(&o) * M, &nf);
        smag = sm > smag ? sm : smag;
        uint32_t gmag = psd_max_mag(g, M);
        ck_assert_uint_eq(gmag, max_mag_ref(g, M, &nf));
        uint64_t t = 1 + (uint64_t)(rng_unit() * 100);
        if (!psd_opt_safe(&o, smag, gmag, 0.5f, t))
            continue;
        proven++;
        ck_assert_uint_eq(psd_opt_check_part(&o, w, slots, M, g, M, 0.5f, t), M);
        uint32_t mag = psd_opt_apply(&o, w, slots, g, M, 0.5f, t);
        nf = false;
        uint32_t want = max_mag_ref(w, M, &nf);
        sm = max_mag_ref(slots, (size_t)psd_opt_slot_count(&o) * M, &nf);
        want = sm > want ? sm : want;
        ck_assert_msg(!nf, "trial %d: proven safe, went non-finite", trial);
        ck_assert_uint_eq(mag, want);
    }
    ck_assert_int_gt(proven, 1000); /* the proof holds for ordinary numbers */
    ck_assert_uint_eq(psd_max_mag(NULL, 0), 0);
    ck_assert_uint_ge(psd_max_mag((const float[]){1.0f, NAN}, 2), 0x7f800000u);
    psd_opt o = kind_spec(PSD_OPT_SGD);
    ck_assert(!psd_opt_safe(&o, 0x7f800000u, 0, 1.0f, 1)); /* Inf already */
    ck_assert(psd_opt_safe(&o, mag_of(1.0f), mag_of(1.0f), 1.0f, 1));
}
END_TEST

/* ---- psd_accumulate --------------------------------------------------- */

START_TEST(test_accumulate)
{
    float acc[N], g[N];
    for (size_t i = 0; i < N; i++) {
        acc[i] = (float)i;
        g[i] = 0.5f * (float)i - 3.0f;
    }
    psd_accumulate(acc, g, N);
    for (size_t i = 0; i < N; i++)
        ck_assert_float_eq(acc[i], 1.5f * (float)i - 3.0f);
    psd_accumulate(NULL, NULL, 0);
}
END_TEST

PSCHECK_MAIN("optim",
    {"psd_opt_defaults", {test_defaults_fill_zero_fields, test_defaults_keep_set_fields,
                          test_defaults_negative_zero}},
    {"psd_opt_validate", {test_validate_accepts_defaults, test_validate_unknown_kind,
                          test_validate_fields, test_validate_epsilon,
                          test_validate_why_null_or_short}},
    {"psd_opt_slot_count", {test_slot_count}},
    {"psd_opt_name", {test_name}},
    {"psd_opt_init_slots", {test_init_slots}},
    {"psd_opt_apply", {test_apply_sgd, test_apply_momentum, test_apply_nesterov,
                       test_apply_adagrad, test_apply_adam, test_apply_scale,
                       test_apply_sync_average, test_apply_adam_first_step,
                       test_apply_adam_large_t, test_apply_empty_and_unknown,
                       test_apply_parts_same_bits}},
    {"psd_opt_apply FTRL", {test_apply_ftrl, test_apply_ftrl_lr_power_zero,
                            test_apply_ftrl_l1_zeroes}},
    {"psd_opt_check_part", {test_check_finds_first_overflow,
                            test_check_adam_second_moment}},
    {"psd_opt_safe", {test_safe_is_sound}},
    {"psd_all_finite", {test_finite_values, test_finite_rejects}},
    {"psd_l2_norm", {test_l2_norm}},
    {"psd_accumulate", {test_accumulate}})
