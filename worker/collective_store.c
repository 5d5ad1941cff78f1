/*
 * collective_store.c - collective.h's store backed by pscoord's KvSet and
 * KvGet (common/coordclient.h), for workerd's multi_worker_mirrored and
 * bench/allreduce.
 */
#include "worker/collective.h"

#include "common/coordclient.h"

#include <stdio.h>

static int kv_set(void *ctx, const char *key, const void *val, size_t len, char *err,
                  size_t errlen)
{
    ps_rpc_status st;
    int rc = ps_coord_kv_set(ctx, key, val, len, &st);
    if (rc != 0)
        snprintf(err, errlen, "KvSet %s: %s: %s", key, ps_rpc_code_name(st.code),
                 st.message);
    return rc;
}

static int kv_get(void *ctx, const char *key, int timeout_ms, void **val, size_t *len,
                  char *err, size_t errlen)
{
    ps_rpc_status st;
    int rc = ps_coord_kv_get(ctx, key, timeout_ms, val, len, NULL, &st);
    if (rc != 0)
        snprintf(err, errlen, "KvGet %s: %s: %s", key, ps_rpc_code_name(st.code),
                 st.message);
    return rc;
}

struct wd_coll_store wd_coll_coord_store(struct ps_coord *pc)
{
    return (struct wd_coll_store){.ctx = pc, .set = kv_set, .get = kv_get};
}
