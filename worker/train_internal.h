/*
 * train_internal.h - what the training loop's files share: the session, its
 * shards and parts, and the comm threads' interface (worker/comm.c).
 *
 * train.c builds a session (replicas, buffers, placement, clients), runs the
 * loop and tears it down; comm.c holds the per-shard comm threads and the
 * handshake by which the loop posts a job (push the handed-over gradient,
 * pull fresh values) and waits for it. train.h has the picture.
 *
 * Threads and lifetime: the session is owned by the thread that runs the
 * loop. Fields under "mu" are shared with the comm threads and read or
 * written only with mu held; the items' data pointers are rewritten
 * (wd_swap_grads, wd_take_pulled) only while no job runs.
 */
#ifndef PS_WORKER_TRAIN_INTERNAL_H
#define PS_WORKER_TRAIN_INTERNAL_H

#include "worker/train.h"

#include "common/psclient.h"
#include "common/rpc.h"
#include "common/shm.h"
#include "proto/ps.pb-c.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#define MAX_SHARDS 64

/* One psd shard: its client, the tensors placed on it, its comm thread. */
struct shard {
    struct session *s;
    int index;
    const char *address;
    ps_client *client;
    ps_client_item *push_items; /* views of s->grads_send */
    ps_client_item *pull_items; /* views of s->params_pull */
    size_t nitems;
    bool feedback;              /* pushes in half with error feedback */
    ps_client_item *zero_items; /* (nitems) push_items over zeros, made
                                   for the first stale sync push; or NULL */
    size_t bytes;
    pthread_t th;
    uint64_t done;              /* jobs finished */
    /* Async: the pull runs on its own thread and connection, at the same
     * time as the push (upstream and downstream at once), so a job takes
     * about one transfer's time, not two. */
    ps_client *pull_client;
    pthread_t pull_th;
    uint64_t pull_done;
    uint64_t sync_step;         /* sync: the step this shard's variables
                                   aggregate next; each shard keeps its own,
                                   since a change in the live worker count can
                                   reach the shards in different steps */
};

/* One server variable: a whole model tensor, or a row range of one when the
 * coordinator split it over shards. Its floats are contiguous in the
 * parameter and gradient blocks (row-major). */
struct part {
    char name[300];
    int param;              /* model tensor */
    size_t offset, count;   /* in floats, in the blocks */
    int64_t shape[PS_PARAM_MAXDIM];
    int ndim;
    int shard;
    int64_t fan_in, fan_out;/* a split part keeps the whole tensor's fans */
};

/* A float32 variable's CreateVariable spec and the two messages it points
 * to (so it is filled in place, never copied). wd_var_spec_init sets the
 * name and shape (borrowed), the initializer of kind `init` seeded from
 * --init-seed and the variable's index k, and optimizer `opt` with --lr;
 * the caller sets the rest (fans, momentum, consistency). */
struct wd_var_spec {
    Ps__V1__VariableSpec spec;
    Ps__V1__Initializer init;
    Ps__V1__Optimizer opt;
};
void wd_var_spec_init(struct wd_var_spec *v, const struct wd_train_opts *o,
                      const char *name, int ndim, const int64_t *shape,
                      enum ps_init_kind init, int k, Ps__V1__Optimizer__Kind opt);

struct session {
    const struct wd_train_opts *o;
    struct part *parts;
    struct wd_placement local_pl; /* without a coordinator: local_placement */
    int nparts;
    ps_model **replicas;
    int nrep;
    size_t nparams;
    float *grads_send;          /* (nparams) the gradient being pushed */
    ps_rpc_msg *send_msg, *fill_msg; /* the buffers grads_send and grads_fill
                                   lie in: pushes send from them in place */
    float *grads_fill;          /* (nparams) the next one, being reduced into
                                   while the push of grads_send may go on */
    float *params_pull;         /* (nparams) the values being pulled */
    float *params_live;         /* (nparams) the values replica 0 computes
                                   with, when its backend reads host memory
                                   (take_pulled swaps the two) */
    ps_shm *shm;                /* when set, the four blocks above lie in it
                                   and go to and from psd by reference */
    struct shard shards[MAX_SHARDS];
    int nshards;

    pthread_mutex_t mu;
    pthread_cond_t cond;
    uint64_t posted;            /* jobs posted */
    uint64_t job_step;
    bool job_pull_only;
    bool quit;
    int failed;                 /* first comm error */
    char fail_msg[1024];
    uint64_t min_version;       /* sync: pull waits for this */

    /* replicas */
    const struct ps_backend **backends; /* (nrep) where each replica computes */
    float *grads_tmp;           /* (nparams) a device replica's gradient, on the host */
    pthread_t *rep_th;
    pthread_barrier_t rep_start, rep_done;
    const float *rep_x;
    const int32_t *rep_y;
    int rep_n;                  /* examples this step */
    float *rep_loss;
    int rep_err;
    bool rep_quit;
};

/* Starts each shard's comm thread and, for async with --concurrent-pull,
 * its pull thread on a second connection made with co. Returns 0, -EAGAIN
 * when a thread cannot start, or the client error with err set. */
int wd_comm_start(struct session *s, const ps_rpc_client_opts *co, char *err,
                  size_t errlen);

/* Tells the comm threads to quit and joins them (none started: nothing). */
void wd_comm_stop(struct session *s);

/* Posts a job (push grads_send for step unless pull_only, then pull) to
 * every shard. */
void wd_post_job(struct session *s, uint64_t step, bool pull_only);

/* Waits for the last job on every shard; returns 0 or the first comm error
 * (its text in s->fail_msg, under s->mu). */
int wd_wait_job(struct session *s);

/* Makes the freshly reduced gradient the one to push: swaps grads_send and
 * grads_fill under the push items. The previous push must be done. */
void wd_swap_grads(struct session *s);

/* Makes the values the last pull brought the replicas'. Called while no job
 * runs. Returns 0 or the model's error. */
int wd_take_pulled(struct session *s);

#endif
