/*
 * delete.c - DeleteVariable: an operator takes a variable out of the shard
 * for good, in named steps: find it, remove it from the store (committed,
 * so it stays gone after a restart), from the table and the caps' count,
 * take every call that waits on it off the lists, then answer those calls
 * and free it. Checkpoints taken before keep it, and a Restore of one
 * brings it back.
 *
 * Like Restore it takes flush_mu, then table_lock for writing (the lock
 * order is in shard_internal.h): no handler runs then, so every waiting
 * call is listed and armed, and no durable push is being answered with the
 * variable's value.
 */
#include "server/shard_internal.h"

#include "common/errors.h"
#include "common/log.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The calls that waited on the deleted variable, off their lists. */
struct gone {
    pull_waiter *pulls;    /* for a version of it */
    pending_push *steps;   /* for its sync step */
    pending_push *durable; /* for the commit of an update to it */
};

static bool waiter_has(const pull_waiter *w, const psd_var *v)
{
    for (size_t i = 0; i < w->nitems; i++)
        if (w->vars[i] == v)
            return true;
    return false;
}

static bool push_has(const pending_push *p, const psd_var *v)
{
    for (size_t i = 0; i < p->nitems; i++)
        if (p->vars[i] == v)
            return true;
    return false;
}

/* Moves the pushes of *list that name v onto *out. */
static void take_pushes(pending_push **list, const psd_var *v, pending_push **out)
{
    for (pending_push **pp = list; *pp != NULL;) {
        pending_push *p = *pp;
        if (push_has(p, v)) {
            *pp = p->next;
            p->next = *out;
            *out = p;
        } else {
            pp = &p->next;
        }
    }
}

/* Takes every call that waits on v off the lists into g. Called with
 * table_lock held for writing. */
static void take_waits(psd_shard *s, const psd_var *v, struct gone *g)
{
    *g = (struct gone){NULL, NULL, NULL};
    pthread_mutex_lock(&s->wait_mu);
    for (pull_waiter **pw = &s->waiters; *pw != NULL;) {
        pull_waiter *w = *pw;
        if (waiter_has(w, v)) {
            *pw = w->next;
            s->nwaiters--;
            w->next = g->pulls;
            g->pulls = w;
        } else {
            pw = &w->next;
        }
    }
    take_pushes(&s->pending, v, &g->steps);
    take_pushes(&s->durable, v, &g->durable);
    pthread_mutex_unlock(&s->wait_mu);
}

/* Fails the pushes of list l (a sync step's, or durable ones waiting for
 * their commit), naming the variable, and frees them. */
static void fail_pushes(pending_push *l, const char *name, bool durable)
{
    for (pending_push *p = l, *next; p != NULL; p = next) {
        next = p->next;
        if (durable)
            ps_rpc_fail(p->call, PS_RPC_ABORTED, "Push: variable '%s' was deleted "
                        "before this push's update was committed", name);
        else
            ps_rpc_fail(p->call, PS_RPC_ABORTED, "Push: variable '%s' was deleted "
                        "while this push waited for step %" PRIu64 " to complete",
                        name, p->step);
        shard_pending_free(p);
    }
}

/* Fails the calls of g, each naming the variable; none of them reads a
 * variable. */
static void fail_waits(struct gone *g, const char *name)
{
    while (g->pulls != NULL) {
        pull_waiter *w = g->pulls;
        g->pulls = w->next;
        ps_rpc_fail(w->call, PS_RPC_NOT_FOUND, "Pull: variable '%s' was deleted "
                    "while this pull waited for a version of it", name);
        shard_waiter_free(w);
    }
    fail_pushes(g->steps, name, false);
    fail_pushes(g->durable, name, true);
    g->steps = g->durable = NULL;
}

static void table_remove(psd_shard *s, size_t pos)
{
    shard_var_detach(s, s->vars[pos]);
    memmove(&s->vars[pos], &s->vars[pos + 1],
            (s->nvars - pos - 1) * sizeof *s->vars);
    s->nvars--;
}

/* Removes variable `name` from the store and the table and takes the calls
 * waiting on it into g. Returns it (the caller frees it), or NULL with call
 * failed and nothing changed. */
static psd_var *delete_take(psd_shard *s, ps_rpc_call *call, const char *name,
                            struct gone *g)
{
    /* (A Restore sets s->restoring only with flush_mu held: never here.) */
    pthread_mutex_lock(&s->flush_mu);
    pthread_rwlock_wrlock(&s->table_lock);
    size_t pos;
    psd_var *v = shard_find_var(s, name, strlen(name), &pos);
    int rc = v == NULL ? PS_ENOTFOUND : shard_store_del(s, name);
    if (rc == 0) {
        table_remove(s, pos);
        shard_caps_release(s, shard_var_bytes(v));
        take_waits(s, v, g);
    }
    pthread_rwlock_unlock(&s->table_lock);
    pthread_mutex_unlock(&s->flush_mu);
    if (v == NULL)
        ps_rpc_fail(call, PS_RPC_NOT_FOUND, "DeleteVariable: variable '%s' "
                    "does not exist", name);
    else if (rc != 0)
        ps_rpc_fail(call, ps_rpc_code_from_err(rc), "DeleteVariable: variable "
                    "'%s': removing it from the store failed: %s (it is "
                    "unchanged)", name, ps_strerror(rc));
    return rc == 0 ? v : NULL;
}

void shard_delete_variable(ps_rpc_call *call, const uint8_t *req, size_t len,
                           void *ctx)
{
    psd_shard *s = ctx;
    Ps__V1__DeleteVariableRequest *r = shard_unpack(
        s, call, "DeleteVariable", &ps__v1__delete_variable_request__descriptor, req, len);
    if (r == NULL)
        return;
    const char *np = shard_name_problem(r->name, strlen(r->name));
    if (np != NULL) {
        shard_count_bad(s);
        ps_rpc_fail(call, PS_RPC_INVALID_ARGUMENT, "DeleteVariable: variable name %s", np);
        goto out;
    }
    struct gone g;
    psd_var *v = delete_take(s, call, r->name, &g);
    if (v == NULL)
        goto out;
    /* Nothing reaches v now: off the table and off every list, and the
     * handlers that found it before ended before table_lock was taken. */
    fail_waits(&g, v->name);
    atomic_fetch_add(&s->commits, 1);
    Ps__V1__DeleteVariableResponse resp = PS__V1__DELETE_VARIABLE_RESPONSE__INIT;
    resp.version = v->version;
    resp.bytes = shard_var_bytes(v);
    ps_rpc_reply_pb(call, &resp);
    ps_log_info("deleted variable '%s' at version %" PRIu64 " (%" PRIu64
                " bytes freed)", v->name, resp.version, resp.bytes);
    shard_var_free(v);
out:
    ps__v1__delete_variable_request__free_unpacked(r, NULL);
}
