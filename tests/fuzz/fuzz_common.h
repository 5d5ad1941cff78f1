/*
 * fuzz_common.h - what the fuzz targets and their seed writer agree on: the
 * ParameterServer methods in the order an input's first byte picks them
 * (fuzz_handlers), and the variables fuzz_handlers creates before the first
 * input, so that seeds written by fuzz_seeds name variables that exist.
 *
 * Threads and lifetime: constants and one pure function; nothing to free.
 */
#ifndef PS_FUZZ_COMMON_H
#define PS_FUZZ_COMMON_H

#include "proto/ps.pb-c.h"

#include <stddef.h>
#include <stdint.h>

/* fuzz_handlers: data[0] % FUZZ_NMETHODS picks the method. The last entry
 * is a path no service registers, so the server's UNIMPLEMENTED path runs. */
enum {
    FUZZ_CREATE_VARIABLE,
    FUZZ_PULL,
    FUZZ_PUSH,
    FUZZ_LIST_VARIABLES,
    FUZZ_STATS,
    FUZZ_CHECKPOINT,
    FUZZ_RESTORE,
    FUZZ_UNKNOWN,
    FUZZ_NMETHODS
};

static const char *const fuzz_methods[FUZZ_NMETHODS] = {
    "/ps.v1.ParameterServer/CreateVariable",
    "/ps.v1.ParameterServer/Pull",
    "/ps.v1.ParameterServer/Push",
    "/ps.v1.ParameterServer/ListVariables",
    "/ps.v1.ParameterServer/Stats",
    "/ps.v1.ParameterServer/Checkpoint",
    "/ps.v1.ParameterServer/Restore",
    "/ps.v1.ParameterServer/NoSuchMethod",
};

/* The variables that exist before the first input: one per optimizer, one
 * of them SYNC with two workers (a push waits for the other worker until
 * its deadline), names one byte long so that mutations find them. */
struct fuzz_var {
    const char *name;
    int64_t shape[2];
    size_t ndim;
    Ps__V1__Optimizer__Kind opt;
    Ps__V1__Initializer__Kind init;
    Ps__V1__Consistency consistency;
    uint32_t num_workers;
};

static const struct fuzz_var fuzz_vars[] = {
    {"w", {4, 0}, 1, PS__V1__OPTIMIZER__KIND__SGD, PS__V1__INITIALIZER__KIND__ZEROS,
     PS__V1__CONSISTENCY__ASYNC, 0},
    {"s", {2, 2}, 2, PS__V1__OPTIMIZER__KIND__MOMENTUM,
     PS__V1__INITIALIZER__KIND__UNIFORM, PS__V1__CONSISTENCY__SYNC, 2},
    {"m", {3, 0}, 1, PS__V1__OPTIMIZER__KIND__ADAM,
     PS__V1__INITIALIZER__KIND__NORMAL, PS__V1__CONSISTENCY__ASYNC, 0},
    {"a", {2, 0}, 1, PS__V1__OPTIMIZER__KIND__ADAGRAD,
     PS__V1__INITIALIZER__KIND__CONSTANT, PS__V1__CONSISTENCY__ASYNC, 0},
};
#define FUZZ_NVARS (sizeof fuzz_vars / sizeof fuzz_vars[0])

/* The CreateVariable request of fuzz_vars[i], with everything it points
 * to, in one struct the caller provides. */
struct fuzz_create {
    Ps__V1__CreateVariableRequest req;
    Ps__V1__VariableSpec spec;
    Ps__V1__Optimizer opt;
    Ps__V1__Initializer init;
    int64_t shape[2];
};

static inline void fuzz_create_request(size_t i, struct fuzz_create *c)
{
    const struct fuzz_var *v = &fuzz_vars[i];
    ps__v1__create_variable_request__init(&c->req);
    ps__v1__variable_spec__init(&c->spec);
    ps__v1__optimizer__init(&c->opt);
    ps__v1__initializer__init(&c->init);
    c->opt.kind = v->opt;
    c->opt.learning_rate = 0.1f;
    c->init.kind = v->init;
    c->init.value = 0.5f;
    c->init.minval = -1.0f;
    c->init.maxval = 1.0f;
    c->init.seed = 7;
    for (size_t d = 0; d < v->ndim; d++)
        c->shape[d] = v->shape[d];
    c->spec.name = (char *)v->name;
    c->spec.dtype = PS__V1__DTYPE__DTYPE_FLOAT32;
    c->spec.n_shape = v->ndim;
    c->spec.shape = c->shape;
    c->spec.optimizer = &c->opt;
    c->spec.initializer = &c->init;
    c->spec.consistency = v->consistency;
    c->spec.num_workers = v->num_workers;
    c->req.spec = &c->spec;
}

#endif
