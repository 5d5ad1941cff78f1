#include "server/optim.h"

#include "common/errors.h"
#include "common/simd.h" /* VECTOR_CLONES */

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

/* The proto's "0 means ..." defaults, in one place. */
#define DEFAULT_LR 0.01f
#define DEFAULT_MOMENTUM 0.9f
#define DEFAULT_INITIAL_ACCUMULATOR 0.1f
#define DEFAULT_BETA1 0.9f
#define DEFAULT_BETA2 0.999f
#define DEFAULT_EPSILON 1e-7f
#define DEFAULT_LR_POWER (-0.5f) /* Keras' and TF's FtrlOptimizer's */

static const char *const kind_names[] = {"SGD", "MOMENTUM", "ADAGRAD", "ADAM",
                                             "FTRL"};

static bool kind_known(enum psd_opt_kind kind)
{
    return (unsigned)kind <= (unsigned)PSD_OPT_FTRL;
}

const char *psd_opt_name(enum psd_opt_kind kind)
{
    return kind_known(kind) ? kind_names[kind] : "UNKNOWN";
}

static void default_if_zero(float *f, float def)
{
    if (*f == 0.0f) /* also -0 */
        *f = def;
}

void psd_opt_defaults(psd_opt *o)
{
    default_if_zero(&o->lr, DEFAULT_LR);
    default_if_zero(&o->momentum, DEFAULT_MOMENTUM);
    default_if_zero(&o->initial_accumulator, DEFAULT_INITIAL_ACCUMULATOR);
    default_if_zero(&o->beta1, DEFAULT_BETA1);
    default_if_zero(&o->beta2, DEFAULT_BETA2);
    default_if_zero(&o->epsilon, DEFAULT_EPSILON);
    default_if_zero(&o->lr_power, DEFAULT_LR_POWER);
}

/* Formats the reason for a refusal and returns PS_EINVAL_ARG, so that each
 * check in psd_opt_validate is one line. */
static int refuse(char *why, size_t whylen, const char *field,
                  const char *expected, float got)
{
    if (why != NULL && whylen > 0)
        snprintf(why, whylen, "%s must be %s, got %g", field, expected,
                 (double)got);
    return PS_EINVAL_ARG;
}

static bool in_unit_interval(float x) /* [0, 1) */
{
    return x >= 0.0f && x < 1.0f;
}

/* FTRL's fields, as TF's ApplyFtrlV2 and Keras' Ftrl check them (lr_power
 * <= 0, the strengths >= 0) within the bounds of optim.h. Other kinds only
 * need them finite. */
static int validate_ftrl(const psd_opt *o, bool ftrl, char *why, size_t whylen)
{
    if (ftrl ? !(o->lr_power >= PSD_OPT_MIN_LR_POWER && o->lr_power <= 0.0f)
             : !isfinite(o->lr_power))
        return refuse(why, whylen, "learning_rate_power",
                      ftrl ? "in [-10, 0]" : "finite", o->lr_power);
    const struct { const char *name; float v; } f[] = {
        {"l1", o->l1}, {"l2", o->l2}, {"l2_shrinkage", o->l2_shrinkage},
        {"beta", o->beta}};
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) {
        if (!ftrl && !isfinite(f[i].v))
            return refuse(why, whylen, f[i].name, "finite", f[i].v);
        if (ftrl && !(f[i].v >= 0.0f && f[i].v <= PSD_OPT_MAX_REGULARIZATION))
            return refuse(why, whylen, f[i].name, "in [0, 1e+30]", f[i].v);
    }
    return 0;
}

int psd_opt_validate(const psd_opt *o, char *why, size_t whylen)
{
    if (!kind_known(o->kind)) {
        if (why != NULL && whylen > 0)
            snprintf(why, whylen,
                     "optimizer kind %d is unknown (expected 0 SGD, 1 "
                     "MOMENTUM, 2 ADAGRAD, 3 ADAM or 4 FTRL)", (int)o->kind);
        return PS_EINVAL_ARG;
    }
    if (!(isfinite(o->lr) && o->lr > 0.0f))
        return refuse(why, whylen, "learning_rate", "> 0 and finite", o->lr);
    if (o->lr > PSD_OPT_MAX_LR)
        return refuse(why, whylen, "learning_rate", "at most 1000", o->lr);

    /* Fields the kind ignores must still be finite: a NaN anywhere in a spec
     * is a client bug, and it would make two identical specs compare
     * unequal. */
    bool momentum = o->kind == PSD_OPT_MOMENTUM;
    bool adagrad = o->kind == PSD_OPT_ADAGRAD;
    bool adam = o->kind == PSD_OPT_ADAM;
    bool ftrl = o->kind == PSD_OPT_FTRL;
    if (momentum ? !in_unit_interval(o->momentum) : !isfinite(o->momentum))
        return refuse(why, whylen, "momentum",
                      momentum ? "in [0, 1)" : "finite", o->momentum);
    if ((adagrad || ftrl) && isfinite(o->initial_accumulator) &&
        o->initial_accumulator > PSD_OPT_MAX_INITIAL_ACCUMULATOR)
        return refuse(why, whylen, "initial_accumulator", "at most 1e+30",
                      o->initial_accumulator);
    if (adagrad || ftrl ? !(isfinite(o->initial_accumulator) &&
                            o->initial_accumulator >= 0.0f)
                        : !isfinite(o->initial_accumulator))
        return refuse(why, whylen, "initial_accumulator",
                      adagrad || ftrl ? ">= 0 and finite" : "finite",
                      o->initial_accumulator);
    if (adam ? !in_unit_interval(o->beta1) : !isfinite(o->beta1))
        return refuse(why, whylen, "beta1", adam ? "in [0, 1)" : "finite",
                      o->beta1);
    if (adam ? !in_unit_interval(o->beta2) : !isfinite(o->beta2))
        return refuse(why, whylen, "beta2", adam ? "in [0, 1)" : "finite",
                      o->beta2);
    if (adagrad || adam ? !(isfinite(o->epsilon) && o->epsilon > 0.0f)
                        : !isfinite(o->epsilon))
        return refuse(why, whylen, "epsilon",
                      adagrad || adam ? "> 0 and finite" : "finite",
                      o->epsilon);
    if ((adagrad || adam) && o->epsilon < PSD_OPT_MIN_EPSILON)
        return refuse(why, whylen, "epsilon", "at least 1e-30", o->epsilon);
    return validate_ftrl(o, ftrl, why, whylen);
}

int psd_opt_slot_count(const psd_opt *o)
{
    switch (o->kind) {
    case PSD_OPT_SGD:
        return 0;
    case PSD_OPT_MOMENTUM:
    case PSD_OPT_ADAGRAD:
        return 1;
    case PSD_OPT_ADAM:
    case PSD_OPT_FTRL:
        return 2;
    }
    return 0;
}

void psd_opt_init_slots(const psd_opt *o, float *slots, size_t n)
{
    size_t count = (size_t)psd_opt_slot_count(o) * n;
    if (o->kind == PSD_OPT_ADAGRAD || o->kind == PSD_OPT_FTRL) {
        float a0 = o->initial_accumulator;
        for (size_t i = 0; i < n; i++)
            slots[i] = a0;
        if (count > n) /* FTRL's linear */
            memset(slots + n, 0, (count - n) * sizeof *slots);
    } else if (count > 0) {
        memset(slots, 0, count * sizeof *slots); /* all-zero bits are +0.0f */
    }
}

/*
 * The update loops. Each is one pass that reads every array once and writes
 * each output once, with restrict pointers and no branch inside, so that the
 * compiler vectorizes it (server/meson.build builds this file at -O3 without
 * errno from sqrtf, which is what lets sqrt vectorize). A push of a 64 MiB
 * variable runs through here while the variable's lock is held, so these
 * loops bound the server's update rate.
 *
 * On x86-64 each loop is also compiled for AVX2 and the loader picks the
 * clone the CPU runs (an ifunc): measured 1.1x (ADAM) to 1.5x (SGD) faster
 * than the SSE2 baseline on 64 MiB arrays, where both are memory-bound.
 * Only "avx2", not "fma", so no multiply-add is fused and both clones give
 * the same bits.
 */
/* The magnitude of x as its bits without the sign: for finite floats the
 * order of these integers is the order of |x|, and Inf and NaN are at or
 * above EXP_MASK. An integer max over them vectorizes where a float max
 * (NaN rules) does not. */
#define EXP_MASK 0x7f800000u

static inline __attribute__((always_inline)) int32_t mag(float x)
{
    uint32_t b;
    memcpy(&b, &x, sizeof b);
    return (int32_t)(b & 0x7fffffffu);
}

static inline __attribute__((always_inline)) int32_t max32(int32_t a, int32_t b)
{
    return a > b ? a : b;
}

/* One element's update for each kind, written once and inlined both into
 * the loops that write (apply_*) and into the loop that only looks
 * (check_*), so that the check sees exactly the bits the update would
 * write. */
static inline __attribute__((always_inline)) void
sgd_elem(float w, float g, float c, float *wn)
{
    *wn = w - c * g;
}

static inline __attribute__((always_inline)) void
momentum_elem(float w, float v, float g, float lr, float mu, float scale,
              bool nesterov, float *wn, float *vn)
{
    float gi = scale * g;
    float vi = mu * v + gi;
    *vn = vi;
    *wn = w - lr * (nesterov ? gi + mu * vi : vi);
}

static inline __attribute__((always_inline)) void
adagrad_elem(float w, float a, float g, float lr, float eps, float scale,
             float *wn, float *an)
{
    float gi = scale * g;
    float ai = a + gi * gi;
    *an = ai;
    *wn = w - lr * gi / (sqrtf(ai) + eps);
}

static inline __attribute__((always_inline)) void
adam_elem(float w, float m, float v, float g, float lr_t, float b1, float b2,
          float eps, float scale, float *wn, float *mn, float *vn)
{
    float c1 = 1.0f - b1, c2 = 1.0f - b2;
    float gi = scale * g;
    float mi = b1 * m + c1 * gi;
    float vi = b2 * v + c2 * gi * gi;
    *mn = mi;
    *vn = vi;
    *wn = w - lr_t * mi / (sqrtf(vi) + eps);
}

/* FTRL's constants, computed once per update in float as Keras and the
 * kernel compute them: l2 gains beta / (2 lr) (Keras' "adjusted l2"), the
 * kernel doubles it and doubles l2_shrinkage. */
struct ftrl_k {
    float lr, l1, l2x2, l2sx2, p; /* p = -lr_power */
    bool shrink;                  /* l2_shrinkage > 0: ApplyFtrlV2 */
};

static struct ftrl_k ftrl_consts(const psd_opt *o)
{
    float l2 = o->l2 + o->beta / (2.0f * o->lr);
    return (struct ftrl_k){.lr = o->lr, .l1 = o->l1, .l2x2 = 2.0f * l2,
                           .l2sx2 = 2.0f * o->l2_shrinkage, .p = -o->lr_power,
                           .shrink = o->l2_shrinkage > 0.0f};
}

/* One element of TF's ApplyFtrl / ApplyFtrlV2 (training_ops.cc), the same
 * operations in the same order: Keras calls ApplyFtrl when l2_shrinkage is
 * 0, whose gradient has no shrinkage term (not even + 0 * w, which would
 * turn a -0 gradient into +0). `half` is the kernel's special case for
 * lr_power -0.5 (sqrt instead of pow), a constant in each caller so that
 * the sqrt loop vectorizes. */
static inline __attribute__((always_inline)) void
ftrl_elem(float w, float n, float z, float g, struct ftrl_k k, float scale,
          bool half, float *wn, float *nn, float *zn)
{
    float gi = scale * g;
    float gs = k.shrink ? gi + k.l2sx2 * w : gi;
    float na = n + gi * gi;
    float pn = half ? sqrtf(na) : powf(na, k.p);
    float po = half ? sqrtf(n) : powf(n, k.p);
    float zi = z + (gs - (pn - po) / k.lr * w);
    float x = (zi > 0.0f ? k.l1 : -k.l1) - zi; /* sign(z) * l1 - z */
    float y = pn / k.lr + k.l2x2;
    *zn = zi;
    *nn = na;
    *wn = fabsf(zi) > k.l1 ? x / y : 0.0f;
}

/*
 * The update loops. Each is one pass that reads every array once and writes
 * each output once, with restrict pointers and no branch inside, so that the
 * compiler vectorizes it (server/meson.build builds this file at -O3 without
 * errno from sqrtf, which is what lets sqrt vectorize). A push of a 64 MiB
 * variable runs through here while the variable's lock is held, so these
 * loops bound the server's update rate.
 *
 * Each loop also returns the largest magnitude it wrote (mag(), over the
 * values and the slots): an integer max reduction in registers, free in a
 * loop bound by memory. The server keeps it with the variable, and the
 * next update's psd_opt_safe proves from it that the update stays finite
 * without a pass of its own (psd_opt_safe).
 *
 * On x86-64 each loop is also compiled for AVX2 and the loader picks the
 * clone the CPU runs (an ifunc): measured 1.1x (ADAM) to 1.5x (SGD) faster
 * than the SSE2 baseline on 64 MiB arrays, where both are memory-bound.
 * Only "avx2", not "fma", so no multiply-add is fused and both clones give
 * the same bits.
 */
VECTOR_CLONES
static int32_t apply_sgd(float *restrict w, const psd_ufloat *restrict g,
                         size_t n, float lr_scale)
{
    int32_t mx = 0;
    for (size_t i = 0; i < n; i++) {
        float wn;
        sgd_elem(w[i], g[i], lr_scale, &wn);
        w[i] = wn;
        mx = max32(mx, mag(wn));
    }
    return mx;
}

/* Momentum and Nesterov momentum differ only in the step taken along the new
 * velocity. The loop is written once and inlined into each of the two cloned
 * functions below with nesterov a constant, so the choice is made at compile
 * time and each loop stays branch-free (and vectorized). */
static inline __attribute__((always_inline)) int32_t
momentum_loop(float *restrict w, float *restrict v, const psd_ufloat *restrict g,
              size_t n, float lr, float mu, float scale, bool nesterov)
{
    int32_t mx = 0;
    for (size_t i = 0; i < n; i++) {
        float wn, vn;
        momentum_elem(w[i], v[i], g[i], lr, mu, scale, nesterov, &wn, &vn);
        v[i] = vn;
        w[i] = wn;
        mx = max32(mx, max32(mag(wn), mag(vn)));
    }
    return mx;
}

VECTOR_CLONES
static int32_t apply_momentum(float *restrict w, float *restrict v,
                              const psd_ufloat *restrict g, size_t n, float lr,
                              float mu, float scale)
{
    return momentum_loop(w, v, g, n, lr, mu, scale, false);
}

VECTOR_CLONES
static int32_t apply_nesterov(float *restrict w, float *restrict v,
                              const psd_ufloat *restrict g, size_t n, float lr,
                              float mu, float scale)
{
    return momentum_loop(w, v, g, n, lr, mu, scale, true);
}

VECTOR_CLONES
static int32_t apply_adagrad(float *restrict w, float *restrict a,
                             const psd_ufloat *restrict g, size_t n, float lr,
                             float eps, float scale)
{
    int32_t mx = 0;
    for (size_t i = 0; i < n; i++) {
        float wn, an;
        adagrad_elem(w[i], a[i], g[i], lr, eps, scale, &wn, &an);
        a[i] = an;
        w[i] = wn;
        mx = max32(mx, max32(mag(wn), mag(an)));
    }
    return mx;
}

VECTOR_CLONES
static int32_t apply_adam(float *restrict w, float *restrict m,
                          float *restrict v, const psd_ufloat *restrict g,
                          size_t n, float lr_t, float b1, float b2, float eps,
                          float scale)
{
    int32_t mx = 0;
    for (size_t i = 0; i < n; i++) {
        float wn, mn, vn;
        adam_elem(w[i], m[i], v[i], g[i], lr_t, b1, b2, eps, scale, &wn, &mn, &vn);
        m[i] = mn;
        v[i] = vn;
        w[i] = wn;
        mx = max32(mx, max32(mag(wn), max32(mag(mn), mag(vn))));
    }
    return mx;
}

/* FTRL with lr_power -0.5 (sqrt, vectorized) and with any other (powf, one
 * element at a time: glibc's powf has no vector form without -ffast-math). */
static inline __attribute__((always_inline)) int32_t
ftrl_loop(float *restrict w, float *restrict a, float *restrict z,
          const psd_ufloat *restrict g, size_t n, struct ftrl_k k, float scale,
          bool half)
{
    int32_t mx = 0;
    for (size_t i = 0; i < n; i++) {
        float wn, an, zn;
        ftrl_elem(w[i], a[i], z[i], g[i], k, scale, half, &wn, &an, &zn);
        a[i] = an;
        z[i] = zn;
        w[i] = wn;
        mx = max32(mx, max32(mag(wn), max32(mag(an), mag(zn))));
    }
    return mx;
}

VECTOR_CLONES
static int32_t apply_ftrl_half(float *restrict w, float *restrict a,
                               float *restrict z, const psd_ufloat *restrict g,
                               size_t n, struct ftrl_k k, float scale)
{
    return ftrl_loop(w, a, z, g, n, k, scale, true);
}

static int32_t apply_ftrl_pow(float *restrict w, float *restrict a,
                              float *restrict z, const psd_ufloat *restrict g,
                              size_t n, struct ftrl_k k, float scale)
{
    return ftrl_loop(w, a, z, g, n, k, scale, false);
}

/* Adam's bias-corrected step size for update t, computed in double because
 * beta^t for large t and 1 - beta^t for small t both lose float precision. */
static float adam_lr_t(const psd_opt *o, uint64_t t)
{
    double td = (double)(t == 0 ? 1 : t);
    double bc1 = 1.0 - pow((double)o->beta1, td);
    double bc2 = 1.0 - pow((double)o->beta2, td);
    return (float)((double)o->lr * sqrt(bc2) / bc1);
}

uint32_t psd_opt_apply(const psd_opt *o, float *restrict w, float *restrict slots,
                       const psd_ufloat *restrict g, size_t n, float scale,
                       uint64_t t)
{
    return psd_opt_apply_part(o, w, slots, n, g, n, scale, t);
}

uint32_t psd_opt_apply_part(const psd_opt *o, float *restrict w,
                            float *restrict slots, size_t slot_stride,
                            const psd_ufloat *restrict g, size_t n, float scale,
                            uint64_t t)
{
    switch (o->kind) {
    case PSD_OPT_SGD:
        return (uint32_t)apply_sgd(w, g, n, o->lr * scale);
    case PSD_OPT_MOMENTUM:
        if (o->nesterov)
            return (uint32_t)apply_nesterov(w, slots, g, n, o->lr, o->momentum,
                                            scale);
        return (uint32_t)apply_momentum(w, slots, g, n, o->lr, o->momentum, scale);
    case PSD_OPT_ADAGRAD:
        return (uint32_t)apply_adagrad(w, slots, g, n, o->lr, o->epsilon, scale);
    case PSD_OPT_ADAM:
        return (uint32_t)apply_adam(w, slots, slots + slot_stride, g, n,
                                    adam_lr_t(o, t), o->beta1, o->beta2,
                                    o->epsilon, scale);
    case PSD_OPT_FTRL:
        if (o->lr_power == -0.5f)
            return (uint32_t)apply_ftrl_half(w, slots, slots + slot_stride, g,
                                             n, ftrl_consts(o), scale);
        return (uint32_t)apply_ftrl_pow(w, slots, slots + slot_stride, g, n,
                                        ftrl_consts(o), scale);
    }
    return 0;
}

/* The look-only twins of the update loops: the same element functions, an
 * OR over "this output is Inf or NaN", nothing written. Run in blocks so
 * that a bad block stops the scan and is then searched one element at a
 * time (the same arithmetic, so the same verdict). */
#define CHECK_BLOCK 4096

static inline __attribute__((always_inline)) int32_t bad(float x)
{
    return mag(x) >= (int32_t)EXP_MASK;
}

VECTOR_CLONES
static int32_t check_block(const psd_opt *o, const float *restrict w,
                           const float *restrict s0, const float *restrict s1,
                           const psd_ufloat *restrict g, size_t n, float scale,
                           float lr_t)
{
    int32_t any = 0;
    struct ftrl_k fk = ftrl_consts(o);
    float lr = o->lr, mu = o->momentum, eps = o->epsilon;
    float wn, an, bn;
    switch (o->kind) {
    case PSD_OPT_SGD:
        for (size_t i = 0; i < n; i++) {
            sgd_elem(w[i], g[i], lr * scale, &wn);
            any |= bad(wn);
        }
        break;
    case PSD_OPT_MOMENTUM:
        if (o->nesterov) {
            for (size_t i = 0; i < n; i++) {
                momentum_elem(w[i], s0[i], g[i], lr, mu, scale, true, &wn, &an);
                any |= bad(wn) | bad(an);
            }
        } else {
            for (size_t i = 0; i < n; i++) {
                momentum_elem(w[i], s0[i], g[i], lr, mu, scale, false, &wn, &an);
                any |= bad(wn) | bad(an);
            }
        }
        break;
    case PSD_OPT_ADAGRAD:
        for (size_t i = 0; i < n; i++) {
            adagrad_elem(w[i], s0[i], g[i], lr, eps, scale, &wn, &an);
            any |= bad(wn) | bad(an);
        }
        break;
    case PSD_OPT_ADAM:
        for (size_t i = 0; i < n; i++) {
            adam_elem(w[i], s0[i], s1[i], g[i], lr_t, o->beta1, o->beta2, eps,
                      scale, &wn, &an, &bn);
            any |= bad(wn) | bad(an) | bad(bn);
        }
        break;
    case PSD_OPT_FTRL:
        if (o->lr_power == -0.5f) {
            for (size_t i = 0; i < n; i++) {
                ftrl_elem(w[i], s0[i], s1[i], g[i], fk, scale, true, &wn, &an, &bn);
                any |= bad(wn) | bad(an) | bad(bn);
            }
        } else {
            for (size_t i = 0; i < n; i++) {
                ftrl_elem(w[i], s0[i], s1[i], g[i], fk, scale, false, &wn, &an, &bn);
                any |= bad(wn) | bad(an) | bad(bn);
            }
        }
        break;
    }
    return any;
}

size_t psd_opt_check_part(const psd_opt *o, const float *w, const float *slots,
                          size_t slot_stride, const psd_ufloat *g, size_t n,
                          float scale, uint64_t t)
{
    float lr_t = o->kind == PSD_OPT_ADAM ? adam_lr_t(o, t) : 0.0f;
    const float *s0 = slots, *s1 = slots ? slots + slot_stride : NULL;
    for (size_t i = 0; i < n; i += CHECK_BLOCK) {
        size_t k = n - i < CHECK_BLOCK ? n - i : CHECK_BLOCK;
        if (!check_block(o, w + i, s0 ? s0 + i : NULL, s1 ? s1 + i : NULL,
                         g + i, k, scale, lr_t))
            continue;
        for (size_t j = 0; j < k; j++)
            if (check_block(o, w + i + j, s0 ? s0 + i + j : NULL,
                            s1 ? s1 + i + j : NULL, g + i + j, 1, scale, lr_t))
                return i + j;
    }
    return n;
}

/* A float's magnitude back from mag()'s bits. */
static double from_mag(uint32_t m)
{
    float f;
    m &= 0x7fffffffu;
    memcpy(&f, &m, sizeof f);
    return (double)f;
}

/* FTRL's bound: the accumulator n never falls below initial_accumulator (it
 * starts there and only grows), so the denominator n'^p / lr + 2 l2' is at
 * least min(1, a0)^p / lr; the powers of n and n' are at most
 * max(1, S + G^2)^p. Every intermediate of ftrl_elem is within the
 * returned bound. */
static double ftrl_worst(const psd_opt *o, double S, double G)
{
    double lr = o->lr, p = -(double)o->lr_power;
    double l2 = (double)o->l2 + (double)o->beta / (2.0 * lr);
    double na = S + G * G;
    double P = pow(fmax(1.0, na), p);
    double gs = G + 2.0 * (double)o->l2_shrinkage * S;
    double d = 2.0 * P / lr * S;          /* (n'^p - n^p) / lr * w */
    double z = S + gs + d;
    double ymin = fmax(pow(fmin(1.0, (double)o->initial_accumulator), p) / lr,
                       2.0 * l2);
    if (!(ymin > 1e-30)) /* float might round it to 0: not proven */
        return INFINITY;
    double y = P / lr + 2.0 * l2, x = z + (double)o->l1;
    return fmax(fmax(na, fmax(gs, d)), fmax(x, fmax(y, x / ymin)));
}

/*
 * Bounds, in double, on every intermediate and output of one update of
 * elements whose values and slots are at most S in magnitude with a
 * gradient at most G (already scaled). Each bound is over the worst
 * element, so one true answer covers them all. Kept below FLT_MAX / 4: the
 * float arithmetic rounds each of its few operations by at most a factor
 * 1 + 2^-23, far inside that margin.
 */
bool psd_opt_safe(const psd_opt *o, uint32_t state_mag, uint32_t grad_mag,
                  float scale, uint64_t t)
{
    if (state_mag >= EXP_MASK || grad_mag >= EXP_MASK || !isfinite(scale))
        return false;
    const double lim = (double)FLT_MAX / 4;
    double S = from_mag(state_mag), G = from_mag(grad_mag) * fabs((double)scale);
    double lr = o->lr, mu = o->momentum, eps = o->epsilon, worst;
    switch (o->kind) {
    case PSD_OPT_SGD:
        /* lr * g, w - lr * g; |lr|: push.c applies a delta as lr -1 */
        worst = fmax(fabs(lr) * G, S + fabs(lr) * G);
        break;
    case PSD_OPT_MOMENTUM: {
        double v = mu * S + G;        /* |v'| */
        worst = fmax(v, S + lr * (G + mu * v + v));
        break;
    }
    case PSD_OPT_ADAGRAD:
        /* |g| / (sqrt(a') + eps) <= |g| / eps; a' >= 0 since a starts >= 0
         * and only grows. */
        worst = fmax(S + G * G, fmax(lr * G, S + lr * G / eps));
        break;
    case PSD_OPT_ADAM: {
        double lr_t = adam_lr_t(o, t);
        double m = S + G, v = S + G * G; /* beta < 1 */
        worst = fmax(fmax(m, v), fmax(lr_t * m, S + lr_t * m / eps));
        break;
    }
    case PSD_OPT_FTRL:
        worst = ftrl_worst(o, S, G);
        break;
    default:
        return false;
    }
    return worst < lim;
}

VECTOR_CLONES
uint32_t psd_max_mag(const psd_ufloat *x, size_t n)
{
    int32_t mx = 0;
    for (size_t i = 0; i < n; i++)
        mx = max32(mx, mag(x[i]));
    return (uint32_t)mx;
}

/* Elements are checked in blocks: within a block the test is a branch-free
 * OR over the exponent bits (all ones means Inf or NaN), which vectorizes;
 * between blocks a bad gradient stops the scan early. */
#define FINITE_BLOCK 4096

VECTOR_CLONES
bool psd_all_finite(const psd_ufloat *x, size_t n)
{
    size_t i = 0;
    while (i < n) {
        size_t end = n - i > FINITE_BLOCK ? i + FINITE_BLOCK : n;
        uint32_t bad = 0;
        for (; i < end; i++) {
            uint32_t bits;
            memcpy(&bits, &x[i], sizeof bits);
            bad |= (uint32_t)((bits & EXP_MASK) == EXP_MASK);
        }
        if (bad)
            return false;
    }
    return true;
}

/* Eight partial sums, one per lane, added together at the end: a fixed
 * order (so the same array always gives the same bits) that the compiler can
 * still vectorize without -ffast-math. */
#define NORM_LANES 8

VECTOR_CLONES
double psd_l2_norm(const float *x, size_t n)
{
    double part[NORM_LANES] = {0};
    size_t i = 0;
    for (; i + NORM_LANES <= n; i += NORM_LANES)
        for (size_t j = 0; j < NORM_LANES; j++)
            part[j] += (double)x[i + j] * (double)x[i + j];
    for (size_t j = 0; i < n; i++, j++)
        part[j] += (double)x[i] * (double)x[i];
    double sum = 0.0;
    for (size_t j = 0; j < NORM_LANES; j++)
        sum += part[j];
    return sqrt(sum);
}

VECTOR_CLONES
void psd_accumulate(float *restrict acc, const psd_ufloat *restrict g, size_t n)
{
    for (size_t i = 0; i < n; i++)
        acc[i] += g[i];
}
