/*
 * pjrt_grad - the PJRT backend's gradients against the CPU backend's on
 * fixed batches: `pjrt_grad [--image HxWxC] PLUGIN SPEC BATCH...` builds
 * SPEC for 28x28x1 (or HxWxC) inputs and 10 classes on both backends with the same values, runs one
 * step per BATCH on the same pseudo-random examples and compares every
 * gradient tensor and the loss. A tensor passes when
 * max |pjrt - cpu| <= 1e-5 * max |cpu| (relative to the tensor's scale:
 * single elements near zero differ by float rounding of sums taken in
 * another order). Prints one line per batch and tensor; exits 0 when all
 * pass, 1 when one does not, 2 when the plugin or the model cannot be set up
 * (with the reason). Also times the step on both (--time N: N more steps
 * each, then one JSON line), for bench/train.
 */
#include "worker/model.h"

#include "common/errors.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define TOL 1e-5

static uint64_t rng = 0x9e3779b97f4a7c15ULL;

static uint32_t next_u32(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 32);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* One batch on both: 1 when a tensor differs beyond TOL. */
static int compare(ps_model *cpu, ps_model *pj, int batch, const float *x,
                   const int32_t *y, float *gp)
{
    float lc, lp;
    if (ps_model_forward_backward(cpu, x, y, batch, &lc) != 0 ||
        ps_model_forward_backward(pj, x, y, batch, &lp) != 0) {
        fprintf(stderr, "pjrt_grad: step: %s%s\n", ps_model_errmsg(cpu),
                ps_model_errmsg(pj));
        exit(2);
    }
    if (ps_model_grads_to_host(pj, gp) != 0) {
        fprintf(stderr, "pjrt_grad: %s\n", ps_model_errmsg(pj));
        exit(2);
    }
    const float *gc = ps_model_grads(cpu);
    int bad = 0;
    for (int t = 0; t < ps_model_param_count(cpu); t++) {
        const struct ps_param_info *in = ps_model_param_info(cpu, t);
        double mx = 0.0, diff = 0.0;
        for (size_t k = 0; k < in->count; k++) {
            double c = gc[in->offset + k], p = gp[in->offset + k];
            mx = fmax(mx, fabs(c));
            diff = fmax(diff, fabs(c - p));
        }
        bool ok = diff <= TOL * mx && mx > 0.0;
        printf("batch %d %-14s max|cpu| %.6e max|diff| %.3e rel %.3e %s\n", batch,
               in->name, mx, diff, mx > 0 ? diff / mx : 0.0, ok ? "ok" : "FAIL");
        bad |= !ok;
    }
    bool lok = fabs(lc - lp) <= TOL * fabs(lc);
    printf("batch %d loss cpu %.7f pjrt %.7f %s\n", batch, lc, lp, lok ? "ok" : "FAIL");
    return bad | !lok;
}

/* Steps per second of each, after the first (compiling) step. */
static void time_steps(ps_model *cpu, ps_model *pj, int batch, const float *x,
                       const int32_t *y, int n)
{
    double t0 = now_s();
    for (int i = 0; i < n; i++)
        ps_model_forward_backward(cpu, x, y, batch, NULL);
    double tc = now_s() - t0;
    t0 = now_s();
    for (int i = 0; i < n; i++) {
        ps_model_params_from_host(pj, ps_model_params(cpu)); /* as a pull does */
        ps_model_forward_backward(pj, x, y, batch, NULL);
    }
    double tp = now_s() - t0;
    printf("{\"spec\":\"%s\",\"batch\":%d,\"steps\":%d,\"cpu_examples_per_s\":%.1f,"
           "\"pjrt_examples_per_s\":%.1f,\"pjrt_compile_s\":%.3f}\n",
           ps_model_spec(cpu), batch, n, n * batch / tc, n * batch / tp,
           ps_pjrt_compile_seconds());
}

int main(int argc, char **argv)
{
    int timed = 0, a = 1, ih = 28, iw = 28, ic = 1;
    for (;;) {
        if (argc > a + 1 && strcmp(argv[a], "--time") == 0)
            timed = atoi(argv[a + 1]);
        else if (argc > a + 1 && strcmp(argv[a], "--image") == 0)
            sscanf(argv[a + 1], "%dx%dx%d", &ih, &iw, &ic);
        else
            break;
        a += 2;
    }
    int insz = ih * iw * ic;
    if (argc - a < 3) {
        fprintf(stderr, "usage: pjrt_grad [--time N] [--image HxWxC] PLUGIN SPEC "
                "BATCH...\n");
        return 2;
    }
    const char *plugin = argv[a], *spec = argv[a + 1];
    char err[512];
    const struct ps_backend *be = ps_backend_pjrt(plugin, 0, err, sizeof err);
    if (be == NULL) {
        fprintf(stderr, "pjrt_grad: %s\n", err);
        return 2;
    }
    int maxb = 0;
    for (int i = a + 2; i < argc; i++)
        maxb = atoi(argv[i]) > maxb ? atoi(argv[i]) : maxb;
    ps_model *cpu, *pj;
    if (ps_model_create(spec, ih, iw, ic, 10, maxb, &cpu, err, sizeof err) != 0 ||
        ps_model_create_on(be, spec, ih, iw, ic, 10, maxb, &pj, err, sizeof err) != 0) {
        fprintf(stderr, "pjrt_grad: %s\n", err);
        return 2;
    }
    ps_model_init_params(cpu, 42);
    size_t np = ps_model_nparams(cpu);
    /* Non-zero biases, so that their path is checked too. */
    float *params = ps_model_params(cpu);
    for (int t = 0; t < ps_model_param_count(cpu); t++) {
        const struct ps_param_info *in = ps_model_param_info(cpu, t);
        if (in->ndim == 1)
            for (size_t k = 0; k < in->count; k++)
                params[in->offset + k] = ((float)(next_u32() % 2001) - 1000.0f) * 1e-4f;
    }
    ps_model_params_from_host(pj, params);
    float *x = malloc((size_t)maxb * insz * sizeof *x), *gp = malloc(np * sizeof *gp);
    int32_t *y = malloc((size_t)maxb * sizeof *y);
    for (int i = 0; i < maxb * insz; i++)
        x[i] = (float)(next_u32() % 256) / 255.0f;
    for (int i = 0; i < maxb; i++)
        y[i] = (int32_t)(next_u32() % 10);
    int bad = 0;
    for (int i = a + 2; i < argc; i++)
        bad |= compare(cpu, pj, atoi(argv[i]), x, y, gp);
    if (timed > 0)
        time_steps(cpu, pj, maxb, x, y, timed);
    ps_model_destroy(pj);
    ps_model_destroy(cpu);
    free(x);
    free(y);
    free(gp);
    return bad;
}
