/*
 * linreg.c - a model of your own against psd, in C, through libpsclient.
 *
 * Fits y = 3x - 2 by SGD with the weights held by psd: each step pulls
 * (w, b), computes the gradient of the mean squared error over a batch
 * here, and pushes it; psd applies the update. Build it against an
 * installed psd:
 *
 *   cc linreg.c $(pkg-config --cflags --libs psclient) -o linreg
 *   ./linreg 127.0.0.1:7070
 *
 * Prints the fitted w and b; exits 1 with one line if psd refuses a call.
 */
#include "common/psclient.h"
#include "proto/ps.pb-c.h"

#include <stdio.h>

static int fail(const char *what, const ps_rpc_status *st)
{
    fprintf(stderr, "linreg: %s: %s\n", what, st->message);
    return 1;
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: linreg HOST:PORT\n");
        return 2;
    }
    ps_client *c;
    ps_rpc_status st = {0};
    if (ps_client_create(argv[1], NULL, &c) != 0) {
        fprintf(stderr, "linreg: cannot make a client for %s\n", argv[1]);
        return 1;
    }
    Ps__V1__Optimizer opt = PS__V1__OPTIMIZER__INIT;
    opt.kind = PS__V1__OPTIMIZER__KIND__SGD;
    opt.learning_rate = 0.1f;
    Ps__V1__VariableSpec spec = PS__V1__VARIABLE_SPEC__INIT;
    spec.name = "linreg/wb";
    spec.dtype = PS__V1__DTYPE__DTYPE_FLOAT32;
    int64_t shape[1] = {2};
    spec.n_shape = 1;
    spec.shape = shape;
    spec.optimizer = &opt;
    if (ps_client_create_variable(c, &spec, NULL, NULL, 5000, &st) != 0)
        return fail("CreateVariable", &st);

    float wb[2], g[2];
    for (int step = 0; step < 300; step++) {
        ps_client_item pull = {.name = "linreg/wb", .data = wb, .n = 2};
        if (ps_client_pull(c, &pull, 1, 5000, &st) != 0)
            return fail("Pull", &st);
        g[0] = g[1] = 0;
        for (int i = 0; i < 16; i++) {
            float x = (float)((step * 16 + i) % 23) / 11.0f - 1.0f;
            float err = wb[0] * x + wb[1] - (3.0f * x - 2.0f);
            g[0] += 2 * err * x / 16;
            g[1] += 2 * err / 16;
        }
        ps_client_item push = {.name = "linreg/wb", .data = g, .n = 2};
        if (ps_client_push(c, 0, (uint64_t)step, &push, 1, 5000, &st) != 0)
            return fail("Push", &st);
    }
    ps_client_item pull = {.name = "linreg/wb", .data = wb, .n = 2};
    if (ps_client_pull(c, &pull, 1, 5000, &st) != 0)
        return fail("Pull", &st);
    printf("w %.4f b %.4f version %llu\n", wb[0], wb[1],
           (unsigned long long)pull.version);
    ps_client_destroy(c);
    return 0;
}
