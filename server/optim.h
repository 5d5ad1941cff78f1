/*
 * optim.h - the optimizers psd applies to pushed gradients.
 *
 * Pure arithmetic on float32 arrays: no locks, no I/O, no allocation. The
 * caller (the variable store) owns the variable w, its optimizer slots and
 * the gradient, and serializes updates to one variable.
 *
 * The update rules follow TensorFlow 2 / Keras, field for field as in
 * proto/ps.proto's Optimizer message:
 *   SGD       w -= lr * g
 *   MOMENTUM  v = momentum * v + g; w -= lr * v
 *             Nesterov: v as above, then w -= lr * (g + momentum * v)
 *   ADAGRAD   a += g^2; w -= lr * g / (sqrt(a) + epsilon)
 *   ADAM      m = beta1 * m + (1 - beta1) * g
 *             v = beta2 * v + (1 - beta2) * g^2
 *             lr_t = lr * sqrt(1 - beta2^t) / (1 - beta1^t)
 *             w -= lr_t * m / (sqrt(v) + epsilon)
 *   FTRL      TensorFlow's ApplyFtrlV2 kernel (FTRL-Proximal, McMahan et
 *             al. 2013) with Keras' beta folded into l2, p = -lr_power:
 *             gs = g + 2 * l2_shrinkage * w
 *             n' = n + g^2
 *             z += gs - (n'^p - n^p) / lr * w
 *             w = |z| > l1 ? (sign(z) * l1 - z) / (n'^p / lr + 2 * l2') : 0
 *             n = n'    with l2' = l2 + beta / (2 * lr)
 *             (lr_power -0.5 takes sqrt, as the kernel's special case does)
 * where g is the pushed gradient times `scale` (sync mode sums the pushes of
 * a step and passes scale = 1/N to average them).
 *
 * Slots are one float array of psd_opt_slot_count(o) * n floats; slot k of a
 * variable of n elements starts at slots + k * n (MOMENTUM: v; ADAGRAD: a;
 * ADAM: m then v; FTRL: the accumulator n then the linear z, as Keras names
 * them "accumulator" and "linear"). That layout is what checkpoints store, so keep it.
 *
 * Threads and lifetime: every function is reentrant and keeps no state; two
 * threads may update different variables at once. Arrays passed to one call
 * must not overlap (the update loops are declared restrict).
 */
#ifndef PSD_OPTIM_H
#define PSD_OPTIM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Bounds psd_opt_validate enforces. A learning rate of 1000 is already far
 * past any schedule in use (warm-up peaks stay below 100); an epsilon below
 * 1e-30 divides a gradient into overflow; an accumulator start above 1e30
 * leaves no room for the squares added to it. */
#define PSD_OPT_MAX_LR 1000.0f
#define PSD_OPT_MIN_EPSILON 1e-30f
#define PSD_OPT_MAX_INITIAL_ACCUMULATOR 1e30f
/* FTRL: learning_rate_power in [-10, 0] (TF asks only <= 0; -0.5 and 0 are
 * the values in use, and past -10 n^p overflows once the accumulator
 * passes 7e3); l1, l2, l2_shrinkage and beta in [0, 1e30], like the
 * accumulator's start. A learning_rate_power of 0 on the wire means the
 * default -0.5 (the proto's zero-means-unset rule; protobuf-c 1.4 has no
 * proto3 `optional`): TF's lr_power 0, a fixed step size, is asked for
 * as PSD_OPT_LR_POWER_ZERO, which gives the same bits, since the
 * accumulator is never 0 (it starts at initial_accumulator > 0 and only
 * grows) and powf(n, 1e-38) rounds to 1 for every positive float n. */
#define PSD_OPT_MIN_LR_POWER (-10.0f)
#define PSD_OPT_MAX_REGULARIZATION 1e30f
#define PSD_OPT_LR_POWER_ZERO (-1e-38f)

/* The same numbering as proto Optimizer.Kind. */
enum psd_opt_kind {
    PSD_OPT_SGD = 0,
    PSD_OPT_MOMENTUM = 1,
    PSD_OPT_ADAGRAD = 2,
    PSD_OPT_ADAM = 3,
    PSD_OPT_FTRL = 4,
};

/* A float at any address: gradients are read where gRPC received them,
 * which need not be 4-byte aligned. The vector loops load them unaligned. */
typedef float psd_ufloat __attribute__((aligned(1)));

/* The proto's Optimizer message, in C. */
typedef struct psd_opt {
    enum psd_opt_kind kind;
    float lr;                  /* learning_rate */
    float momentum;            /* MOMENTUM */
    bool nesterov;             /* MOMENTUM */
    float initial_accumulator; /* ADAGRAD, FTRL */
    float beta1, beta2;        /* ADAM */
    float epsilon;             /* ADAGRAD, ADAM */
    float lr_power;            /* FTRL: learning_rate_power, <= 0 */
    float l1, l2;              /* FTRL: l1 and l2 regularization strengths */
    float l2_shrinkage;        /* FTRL: l2 on the gradient (ApplyFtrlV2) */
    float beta;                /* FTRL: Keras' beta, added to l2 as beta/(2 lr) */
} psd_opt;

/* Replaces each zero field (+0 or -0) with the proto's documented default:
 * learning_rate 0.01, momentum 0.9, initial_accumulator 0.1, beta1 0.9,
 * beta2 0.999, epsilon 1e-7, lr_power -0.5 (l1, l2, l2_shrinkage and beta
 * default to 0, which they are). Every field is filled whatever the kind, so two
 * specs that differ only in unset fields are equal afterwards. Call it once,
 * when a spec arrives, before psd_opt_validate. */
void psd_opt_defaults(psd_opt *o);

/* Checks a spec after psd_opt_defaults. Returns 0, or PS_EINVAL_ARG with a
 * sentence in `why` (NUL-terminated, truncated to whylen; why may be NULL)
 * naming the field, what was expected and what was given, e.g.
 * "learning_rate must be > 0 and finite, got -1". Refused: an unknown kind;
 * any non-finite float field; learning_rate <= 0 or above
 * PSD_OPT_MAX_LR; and, for the fields the kind uses, momentum or beta1 or
 * beta2 outside [0, 1), epsilon below PSD_OPT_MIN_EPSILON, initial_accumulator
 * < 0 or above PSD_OPT_MAX_INITIAL_ACCUMULATOR, lr_power outside
 * [PSD_OPT_MIN_LR_POWER, 0], l1, l2, l2_shrinkage or beta outside
 * [0, PSD_OPT_MAX_REGULARIZATION]. The bounds keep one update
 * of ordinary gradients far from float overflow (issue 13 f: lr 1e38 made
 * the value (-inf, inf) at the first push). Fields the kind does not use are not
 * range-checked (the proto gives them no meaning). */
int psd_opt_validate(const psd_opt *o, char *why, size_t whylen);

/* Number of slot arrays of n floats the kind keeps: SGD 0, MOMENTUM 1,
 * ADAGRAD 1, ADAM 2, FTRL 2; 0 for an unknown kind. */
int psd_opt_slot_count(const psd_opt *o);

/* The proto's name of the kind ("SGD", "MOMENTUM", "ADAGRAD", "ADAM", "FTRL"), or
 * "UNKNOWN". A static string, never NULL. */
const char *psd_opt_name(enum psd_opt_kind kind);

/* Sets a new variable's slots (slot_count * n floats): ADAGRAD's and FTRL's
 * accumulator to initial_accumulator, every other slot (FTRL's linear
 * included) to 0. Nothing for SGD (slots may
 * then be NULL). */
void psd_opt_init_slots(const psd_opt *o, float *slots, size_t n);

/* Applies one update in place to w (n floats) and slots (slot_count * n
 * floats) from the gradient g (n floats), which is multiplied by `scale`
 * first. t is the 1-based number of updates applied to this variable
 * including this one (ADAM's bias correction; 0 is taken as 1): a sparse
 * table's row passes its own count, which makes ADAM lazy (each row
 * corrected by its own number of updates, as LazyAdam). The spec must
 * have passed psd_opt_validate; an unknown kind changes nothing. w, slots and
 * g must not overlap. One pass over memory: each array is read once and
 * written at most once. Returns the largest magnitude written, over the
 * values and the slots, as the bits of a float without its sign (EXP_MASK
 * 0x7f800000 or more: something written is Inf or NaN); psd_opt_safe takes
 * it for the next update. */
uint32_t psd_opt_apply(const psd_opt *o, float *restrict w, float *restrict slots,
                       const float *restrict g, size_t n, float scale, uint64_t t);

/* The same for a part of a variable: w and slots point at the part's first
 * element, slot k of element i is slots[k * slot_stride + i] (slot_stride is
 * the whole variable's element count). Applying every part of a gradient
 * gives the same bits as one psd_opt_apply, and the max of the parts'
 * results is its result. g may be at any address. */
uint32_t psd_opt_apply_part(const psd_opt *o, float *restrict w,
                            float *restrict slots, size_t slot_stride,
                            const psd_ufloat *restrict g, size_t n, float scale,
                            uint64_t t);

/* What psd_opt_apply_part would do, without writing: returns the index of
 * the first element (< n) whose new value or slot would be Inf or NaN, or n
 * when every one would be finite. The same arithmetic as the update, so the
 * verdict is exact. About the cost of the update itself. */
size_t psd_opt_check_part(const psd_opt *o, const float *w, const float *slots,
                          size_t slot_stride, const psd_ufloat *g, size_t n,
                          float scale, uint64_t t);

/* Proves, from magnitudes alone, that an update leaves every value and slot
 * finite: state_mag bounds every value and slot (psd_opt_apply's result for
 * the update before), grad_mag every gradient element (psd_max_mag), both
 * as float bits without the sign. True means proven (the update is safe);
 * false means maybe not (check it with psd_opt_check_part). Constant time. */
bool psd_opt_safe(const psd_opt *o, uint32_t state_mag, uint32_t grad_mag,
                  float scale, uint64_t t);

/* The largest |x[i]| as float bits without the sign (0 for n == 0; 0x7f800000
 * or more when an element is Inf or NaN). */
uint32_t psd_max_mag(const psd_ufloat *x, size_t n);

/* True when none of x[0..n) is NaN, +Inf or -Inf (denormals and -0 are
 * finite). True for n == 0. The server refuses a gradient for which this is
 * false with PS_ENONFINITE. */
bool psd_all_finite(const psd_ufloat *x, size_t n);

/* sqrt(sum of x[i]^2), accumulated in double in a fixed order, so the result
 * is the same on every run. NaN or Inf if an element is. */
double psd_l2_norm(const float *x, size_t n);

/* acc[i] += g[i] for i < n: sums the pushes of one sync step. acc and g must
 * not overlap. */
void psd_accumulate(float *restrict acc, const psd_ufloat *restrict g, size_t n);

#endif
