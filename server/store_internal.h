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
#include <pthread.h>
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
    /* Growth of the map (psd_store_grow). mdb_env_set_mapsize needs no
     * transaction open in the process: every transaction, read or write,
     * holds gate for reading from begin to end, and a growth takes it for
     * writing. Readers never wait on anything while they hold it (a pull
     * holds only its table's mutex, taken before). */
    pthread_rwlock_t gate;
    uint64_t map_size; /* the map's size now; changed under gate (write) */
    uint64_t map_max;  /* the cap of growth; 0: the file plus the free disk */
    int map_full;      /* atomic: a transaction met MDB_MAP_FULL since the last growth */
    int full_reason;   /* atomic: why the last growth failed: 1 the cap, 2 the disk */
    bool cap_logged;   /* under gate (write): the map at its cap was logged */
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
/* Ends a transaction begun by store_txn_begin (abort; or commit, returning
 * LMDB's code) and lets a growth of the map go. */
void store_txn_end(psd_store *s, MDB_txn *txn);
int store_txn_commit(psd_store *s, MDB_txn *txn);
int store_txn_fail(psd_store_txn *t, int mrc, const char *what, const char *name);
/* Whether the store's file system has less than 1 MiB free (then noted as
 * the reason of PS_EFULL): LMDB reports a write the full disk cut short
 * as EIO. store_grow.c. */
bool store_disk_full(psd_store *s);

#endif
