/*
 * fuzz_common.h - what the fuzz targets and their seed writer agree on: the
 * ParameterServer methods in the order an input's first byte picks them
 * (fuzz_handlers), and the variables and sparse tables fuzz_handlers
 * creates before the first input, so that seeds written by fuzz_seeds name
 * variables that exist.
 *
 * Threads and lifetime: constants and one pure function; nothing to free.
 */
#ifndef PS_FUZZ_COMMON_H
#define PS_FUZZ_COMMON_H

#include "proto/ps.pb-c.h"

#include <stdbool.h>
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
    FUZZ_SET_SYNC_WORKERS,
    FUZZ_DELETE_VARIABLE,
    FUZZ_SPARSE_PULL,
    FUZZ_SPARSE_PUSH,
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
    "/ps.v1.ParameterServer/SetSyncWorkers",
    "/ps.v1.ParameterServer/DeleteVariable",
    "/ps.v1.ParameterServer/SparsePull",
    "/ps.v1.ParameterServer/SparsePush",
    "/ps.v1.ParameterServer/NoSuchMethod",
};

/* The variables that exist before the first input: one dense variable per
 * optimizer, one of them SYNC with two workers (a push waits for the other
 * worker until its deadline), and sparse tables (shape [dim]) over the
 * tier's variants: float32 rows with ADAGRAD and with FTRL, float16 rows
 * with bfloat16 slots, bfloat16 rows with float32 slots that a pull
 * inserts, and a table of at most 4 rows with a TTL and admission after
 * two pushes, which the sweep keeps evicting. Names are one byte long so
 * that mutations find them. */
struct fuzz_var {
    const char *name;
    int64_t shape[2];
    size_t ndim;
    Ps__V1__Optimizer__Kind opt;
    Ps__V1__Initializer__Kind init;
    Ps__V1__Consistency consistency;
    uint32_t num_workers;
    /* Sparse tables only (sparse set). */
    bool sparse;
    Ps__V1__DType row_dtype, slot_dtype;
    uint64_t max_rows, ttl_steps;
    uint32_t admit_after;
    bool insert_on_pull;
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
    {.name = "e", .shape = {4}, .ndim = 1, .opt = PS__V1__OPTIMIZER__KIND__ADAGRAD,
     .init = PS__V1__INITIALIZER__KIND__UNIFORM, .consistency = PS__V1__CONSISTENCY__ASYNC,
     .sparse = true},
    {.name = "f", .shape = {3}, .ndim = 1, .opt = PS__V1__OPTIMIZER__KIND__FTRL,
     .init = PS__V1__INITIALIZER__KIND__NORMAL, .consistency = PS__V1__CONSISTENCY__ASYNC,
     .sparse = true},
    {.name = "h", .shape = {8}, .ndim = 1, .opt = PS__V1__OPTIMIZER__KIND__ADAM,
     .init = PS__V1__INITIALIZER__KIND__CONSTANT, .consistency = PS__V1__CONSISTENCY__ASYNC,
     .sparse = true, .row_dtype = PS__V1__DTYPE__DTYPE_FLOAT16,
     .slot_dtype = PS__V1__DTYPE__DTYPE_BFLOAT16},
    {.name = "g", .shape = {2}, .ndim = 1, .opt = PS__V1__OPTIMIZER__KIND__MOMENTUM,
     .init = PS__V1__INITIALIZER__KIND__UNIFORM, .consistency = PS__V1__CONSISTENCY__ASYNC,
     .sparse = true, .row_dtype = PS__V1__DTYPE__DTYPE_BFLOAT16,
     .slot_dtype = PS__V1__DTYPE__DTYPE_FLOAT32, .insert_on_pull = true},
    {.name = "r", .shape = {2}, .ndim = 1, .opt = PS__V1__OPTIMIZER__KIND__SGD,
     .init = PS__V1__INITIALIZER__KIND__ZEROS, .consistency = PS__V1__CONSISTENCY__ASYNC,
     .sparse = true, .max_rows = 4, .ttl_steps = 3, .admit_after = 2},
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
    if (v->opt == PS__V1__OPTIMIZER__KIND__FTRL)
        c->opt.l1 = 0.01f;
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
    c->spec.sparse = v->sparse;
    c->spec.row_dtype = v->row_dtype;
    c->spec.slot_dtype = v->slot_dtype;
    c->spec.max_rows = v->max_rows;
    c->spec.ttl_steps = v->ttl_steps;
    c->spec.admit_after = v->admit_after;
    c->spec.insert_on_pull = v->insert_on_pull;
    c->req.spec = &c->spec;
}

#endif
