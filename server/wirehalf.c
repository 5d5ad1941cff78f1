/*
 * wirehalf.c - dense gradients and values in float16 or bfloat16 on the
 * wire (PushRequest.wire_dtype, PullItem.wire_dtype). The shard keeps
 * float32 values and optimizer state: a half gradient is widened to
 * float32 before the push is checked and applied, so that the rest of the
 * push path sees FLOAT32 only, and a value is narrowed as its reply is
 * built. The widening finds each gradient's largest magnitude on the way,
 * which is the check's finiteness test and the apply's proof
 * (shard_half_mags), so a half gradient is read once. The conversions are
 * common/half.h's (F16C, AVX512-BF16 where the CPU has them).
 */
#include "server/shard_internal.h"

#include "common/half.h"
#include "common/wire.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

bool shard_is_half(int dtype)
{
    return dtype == PS__V1__DTYPE__DTYPE_FLOAT16 || dtype == PS__V1__DTYPE__DTYPE_BFLOAT16;
}

static bool known_wire(int dtype)
{
    return dtype == 0 || dtype == PS__V1__DTYPE__DTYPE_FLOAT32 || shard_is_half(dtype);
}

/* This thread's widened gradients: every half gradient of the push being
 * handled, one after another, float-aligned; and the largest magnitude of
 * each gradient of that push (UINT32_MAX: not widened), for its check. */
static __thread ps_buf scratch;
static __thread ps_buf mags;

/* Half values are widened this many at a time, taken from the request's
 * slices into a chunk that stays in L1 (a value may straddle two slices,
 * at any alignment). */
#define WIDEN_CHUNK 4096

/* Widens the n half values of cursor c into out in one pass, which also
 * finds their largest magnitude: returned as float32 bits without the
 * sign (psd_max_mag's measure: PSD_NONFINITE_MAG or more for NaN or Inf). */
static uint32_t widen_mag(int dtype, ps_wire_bytes *c, float *out, size_t n)
{
    uint16_t chunk[WIDEN_CHUNK], mag = 0;
    for (size_t i = 0; i < n; i += WIDEN_CHUNK) {
        size_t k = n - i < WIDEN_CHUNK ? n - i : WIDEN_CHUNK;
        ps_wire_bytes_take(c, chunk, k * 2);
        uint16_t m = ps_half_to_f32_mag(dtype, chunk, out + i, k);
        mag = m > mag ? m : mag;
    }
    float f = ps_half_to_f32_one(dtype, mag);
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    return bits & 0x7fffffffu;
}

/* Fails call INVALID_ARGUMENT with the message, counted as bad input. */
__attribute__((format(printf, 3, 4))) static bool
refuse(psd_shard *s, ps_rpc_call *call, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    shard_count_bad(s);
    ps_rpc_fail(call, PS_RPC_INVALID_ARGUMENT, "%s", msg);
    return false;
}

bool shard_half_widen(psd_shard *s, ps_rpc_call *call, ps_wire_push *r)
{
    int declared = r->wire_dtype ? r->wire_dtype : PS__V1__DTYPE__DTYPE_FLOAT32;
    if (!known_wire(r->wire_dtype)) {
        char d[16];
        snprintf(d, sizeof d, "%d", r->wire_dtype);
        return refuse(s, call, "Push: wire_dtype %s is not FLOAT32, FLOAT16 or "
                      "BFLOAT16", d);
    }
    size_t total = 0;
    for (size_t i = 0; i < r->ngrads; i++) {
        ps_wire_grad *g = &r->grads[i];
        if (!g->has_tensor)
            continue; /* push_check names it */
        if (g->dtype != declared)
            return refuse(s, call, "variable '%s': gradient dtype is %s, the push "
                          "declares %s (PushRequest.wire_dtype)", g->name,
                          shard_dtype_name(g->dtype), shard_dtype_name(declared));
        if (!shard_is_half(declared))
            continue;
        if (g->shm.set)
            return refuse(s, call, "variable '%s': a gradient in shared memory is "
                          "FLOAT32, not %s", g->name, shard_dtype_name(declared));
        if (g->nbytes % 2 != 0)
            return refuse(s, call, "variable '%s': a %s gradient of an odd number "
                          "of bytes", g->name, shard_dtype_name(declared));
        total += g->nbytes / 2;
    }
    if (total == 0)
        return true;
    if (ps_buf_reserve(&scratch, total * sizeof(float)) != 0 ||
        ps_buf_reserve(&mags, r->ngrads * sizeof(uint32_t)) != 0) {
        ps_rpc_fail(call, PS_RPC_RESOURCE_EXHAUSTED, "Push: out of memory");
        return false;
    }
    float *out = (float *)(void *)scratch.data;
    uint32_t *mag = (uint32_t *)(void *)mags.data;
    for (size_t i = 0; i < r->ngrads; i++)
        mag[i] = UINT32_MAX;
    for (size_t i = 0; i < r->ngrads; i++) {
        ps_wire_grad *g = &r->grads[i];
        if (!g->has_tensor || !shard_is_half(g->dtype))
            continue;
        size_t n = g->nbytes / 2;
        mag[i] = widen_mag(declared, &g->data, out, n);
        if (mag[i] >= PSD_NONFINITE_MAG) {
            atomic_fetch_add(&s->nonfinite, 1);
            return refuse(s, call, "variable '%s': the %s gradient holds NaN or "
                          "Inf; refused", g->name, shard_dtype_name(declared));
        }
        g->shm_piece = (struct ps_piece){(const uint8_t *)out, n * sizeof(float)};
        ps_wire_bytes_init(&g->data, &g->shm_piece, 1);
        g->nbytes = n * sizeof(float);
        g->widened_from = g->dtype;
        g->dtype = PS__V1__DTYPE__DTYPE_FLOAT32;
        out += n;
    }
    atomic_fetch_add(&s->half_pushes, 1);
    return true;
}

const uint32_t *shard_half_mags(const ps_wire_push *r)
{
    return shard_is_half(r->wire_dtype) && mags.data != NULL
               ? (const uint32_t *)(const void *)mags.data : NULL;
}

bool shard_half_wire_ok(psd_shard *s, ps_rpc_call *call, const void *pull_request,
                        int *dtype)
{
    const Ps__V1__PullRequest *r = pull_request;
    int d = r->n_items > 0 ? (int)r->items[0]->wire_dtype : 0;
    for (size_t i = 0; i < r->n_items; i++) {
        int e = (int)r->items[i]->wire_dtype;
        char a[16], b[16];
        if (!known_wire(e)) {
            snprintf(a, sizeof a, "%d", e);
            return refuse(s, call, "Pull: variable '%s': wire_dtype %s is not "
                          "FLOAT32, FLOAT16 or BFLOAT16", r->items[i]->name, a);
        }
        if ((e == 0 ? 1 : e) != (d == 0 ? 1 : d)) {
            snprintf(a, sizeof a, "%s", shard_dtype_name(e ? e : 1));
            snprintf(b, sizeof b, "%s", shard_dtype_name(d ? d : 1));
            return refuse(s, call, "Pull: variable '%s' asks wire_dtype %s, the "
                          "first item %s: one Pull takes one wire dtype",
                          r->items[i]->name, a, b);
        }
        if (shard_is_half(e) && r->items[i]->into != NULL)
            return refuse(s, call, "Pull: variable '%s': a value into shared memory "
                          "is FLOAT32, not %s", r->items[i]->name,
                          shard_dtype_name(e));
    }
    *dtype = d;
    if (shard_is_half(d))
        atomic_fetch_add(&s->half_pulls, 1);
    return true;
}

bool shard_half_value(psd_shard *s, const psd_var *v, psd_range r, int dtype,
                      ps_rpc_part *part)
{
    size_t n = r.n != 0 ? r.n : v->n;
    uint16_t *h = malloc(n ? n * 2 : 1);
    if (h == NULL)
        return false;
    size_t clamped = ps_half_from_f32(dtype, v->value + r.off, h, n);
    if (clamped > 0)
        atomic_fetch_add(&s->wire_clamped, clamped);
    *part = (ps_rpc_part){h, n * 2, free, h};
    return true;
}
