/*
 * store_internal.h - the store's state, shared by store.c (variables) and
 * store_rows.c (rows of sparse tables). Both are compiled into
 * psd_store_lib with -DPS_OWNS_LMDB; nothing else includes this header.
 *
 * Threads and lifetime: as store.h.
 */
#ifndef PSD_STORE_INTERNAL_H
#define PSD_STORE_INTERNAL_H

#include "server/store.h"

#include <lmdb.h>
#include <stdbool.h>

#define ID_PREFIX_LEN 4 /* u32 var_id BE: the prefix of a variable's dense and row keys */

struct psd_store {
    MDB_env *env;
    MDB_dbi meta;
    MDB_dbi vars;
    MDB_dbi dense;
    MDB_dbi rows;
    unsigned flags;
    uint64_t commits; /* atomic: read from any thread */
    char *dir;        /* for log lines */
};

struct psd_store_txn {
    psd_store *s;
    MDB_txn *txn;
    int err; /* the failure that spoiled the transaction, or 0 */
};

/* store.c's helpers: LMDB's code as a project code; a transaction begun
 * (adopting a map grown by another process); a write transaction spoiled
 * by a failed call, logged with what and the variable's name. */
int store_map_rc(int mrc, bool errno_ok);
int store_txn_begin(psd_store *s, unsigned flags, MDB_txn **out);
int store_txn_fail(psd_store_txn *t, int mrc, const char *what, const char *name);

#endif
