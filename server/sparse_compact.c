/*
 * sparse_compact.c - compaction of the tier's segment files
 * (sparse_internal.h). The applier, between its applies and with
 * apply_run_mu held (it is the one appender), picks a sealed segment about
 * a third dead by the live bytes counted (as the indexes change), and runs
 * a few steps of psd_segs_compact_step a tick: each copies the live
 * records (those the tables' indexes of rows point at) of a small batch to
 * the newest segment and syncs them, and only then are the indexes (and
 * the catalog, through its queue) pointed at the copies, where they still
 * point at the old records (sparse_relocate; a newer write wins); while a
 * step runs, the sweeps leave the segment's rows alone (sp->compact_seg:
 * a copy lies in the span the next open replays). When
 * every record went through, a transaction moves the committed end past
 * the segment, the applier is asked to write the catalog, and the file is
 * removed at a later tick, once "cat_upto" is past the copies (no
 * compaction starts meanwhile). A kill anywhere leaves every row
 * readable: the catalog names the old records until a write names synced
 * copies (or a replay at open does), and the file goes only after that.
 */
#include "server/sparse_internal.h"

#include "common/clock.h"
#include "common/errors.h"
#include "common/log.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#define TICK_MS 5          /* a tick's steps stop once it ran this long */
#define IDLE_MS 1000       /* no segment to compact: look again after */
#define RETRY_MS 10000     /* after a failure */
#define WAIT_MS 100        /* for the catalog to reach a segment's copies */

struct sp_compact {
    psd_segs_compact *c;
    uint32_t seg;
    int64_t next_ms;       /* no step before (the bucket's wait, or idle) */
    int64_t logged_ms;
    psd_store_rtxn *rt;    /* the step's look at the catalog, where no
                              index can say */
    struct sp_move *mv;    /* the step's live records, in order */
    size_t n, cap;
    bool wait_cat;         /* every record went through: the file goes once
                              "cat_upto" reaches need */
    psd_seg_loc need;
};

/* The sealed segment with the most dead bytes among those at least
 * PSD_SEG_DEAD_FRAC dead, by the catalog's live bytes. */
static int pick(psd_sparse *sp, uint32_t *out)
{
    pthread_mutex_lock(&sp->seg_mu);
    int rc = psd_segs_pick_by(sp->segs, 0, sp->seg_live, sp->seg_cap, out);
    pthread_mutex_unlock(&sp->seg_mu);
    return rc;
}

static void rt_end(struct sp_compact *k)
{
    if (k->rt != NULL)
        psd_store_rend(k->rt);
    k->rt = NULL;
}

/* A record is live when the table's index of rows points at it (the
 * catalog, when no ready table's index can say). The read transaction is
 * ended before the index's locks are taken: a thread holding one must
 * not wait (psd_store_grow). */
static int live(void *arg, uint32_t var_id, int64_t id, uint64_t version, psd_seg_loc loc)
{
    psd_sparse *sp = arg;
    struct sp_compact *k = sp->compact;
    (void)version;
    rt_end(k);
    int held = sparse_index_holds(sp, var_id, id, loc);
    if (held < 0) {
        const void *d;
        size_t len;
        struct sp_cat c;
        int rc = psd_store_rbegin(sp->store, &k->rt);
        if (rc == 0)
            rc = psd_store_row_get(k->rt, var_id, id, &d, &len);
        if (rc != 0 && rc != PS_ENOTFOUND)
            return rc;
        held = rc == 0 && sparse_cat_decode(d, len, &c) && c.loc.seg == loc.seg &&
               c.loc.off == loc.off;
    }
    if (!held)
        return 0;
    struct sp_move *mv = ps_grow(k->mv, &k->cap, k->n, sizeof *mv, 512);
    if (mv == NULL)
        return -ENOMEM;
    k->mv = mv;
    k->mv[k->n++] = (struct sp_move){.var_id = var_id, .id = id, .old_loc = loc};
    return 1;
}

/* The copies are synced: the catalog moves to them in one transaction. */
static int moved(void *arg, psd_seg_move *mv, size_t n)
{
    psd_sparse *sp = arg;
    struct sp_compact *k = sp->compact;
    rt_end(k);
    if (n != k->n)
        return PS_ECORRUPT; /* one move per live record, in order */
    for (size_t i = 0; i < n; i++)
        k->mv[i].new_loc = mv[i].to;
    if (sp->compact_copied != NULL)
        sp->compact_copied(sp);
    size_t done;
    return sparse_relocate(sp, k->mv, n, &done);
}

/* Every record went through: the catalog's end moves past the segment (a
 * transaction of no row when nothing of it was live), and the file goes
 * once the catalog holds the records up to there (the moved rows'
 * copies: from then on no entry points into the segment). The catalog is
 * written lazily: the applier is asked to write it, and the tick looks
 * again. Returns 0 (removed), 1 (waiting for the catalog) or an error. */
static int finish(psd_sparse *sp, struct sp_compact *k)
{
    int rc = 0;
    if (!k->wait_cat) {
        struct sp_catw w;
        rc = sparse_catw_begin(sp, &w, true);
        if (rc == 0)
            rc = sparse_catw_commit(&w);
        if (rc != 0)
            return rc;
        k->need = psd_segs_end(sp->segs);
        k->wait_cat = true;
    }
    if (!sparse_cat_reaches(sp, k->need)) {
        atomic_store(&sp->cat_asap, true);
        return 1;
    }
    psd_seg_loc end = psd_segs_end(sp->segs);
    rc = psd_segs_remove(sp->segs, k->seg, &end);
    if (rc == 0)
        k->wait_cat = false;
    return rc;
}

void sparse_compact_tick(psd_sparse *sp)
{
    if (sp->segs == NULL)
        return;
    if (sp->compact == NULL && (sp->compact = calloc(1, sizeof *sp->compact)) == NULL)
        return;
    struct sp_compact *k = sp->compact;
    int64_t t0 = ps_now_ms();
    if (t0 < k->next_ms)
        return;
    char why[512] = "";
    int rc = 0;
    bool waited = k->wait_cat; /* for the catalog, to remove k->seg */
    if (waited) {
        rc = finish(sp, k);
        if (rc == 1) {
            rc = 0;
            k->next_ms = t0 + WAIT_MS;
        } else if (rc != 0) {
            snprintf(why, sizeof why, "cannot remove segment %u: %s", k->seg,
                     ps_strerror(rc));
        }
    }
    if (rc == 0 && !waited && k->c == NULL) {
        uint32_t seg;
        if (pick(sp, &seg) != 0) {
            k->next_ms = t0 + IDLE_MS;
            return;
        }
        psd_seg_compact_opts o = {.rate = sp->compact_rate, .live = live, .moved = moved,
                                  .arg = sp};
        rc = psd_segs_compact_begin(sp->segs, seg, &o, &k->c, why, sizeof why);
        k->seg = seg;
    }
    while (rc == 0 && !waited) {
        uint64_t wait = 0;
        k->n = 0;
        /* Rows the step copies stay out of the sweeps until the indexes
         * point at the copies (sparse_internal.h): a row deleted after its
         * copy was made would come back at the next open, which replays
         * the copy. */
        atomic_store(&sp->compact_seg, k->seg);
        rc = psd_segs_compact_step(k->c, &wait, why, sizeof why);
        atomic_store(&sp->compact_seg, 0);
        rt_end(k);
        if (rc == 1) {
            psd_segs_compact_end(k->c);
            k->c = NULL;
            rc = finish(sp, k);
            if (rc == 1) {
                rc = 0;
                k->next_ms = ps_now_ms() + WAIT_MS;
            } else if (rc != 0) {
                snprintf(why, sizeof why, "cannot remove segment %u: %s", k->seg,
                         ps_strerror(rc));
            }
            break;
        }
        if (rc == 0 && wait > 0) {
            k->next_ms = ps_now_ms() + (int64_t)(wait / 1000000) + 1;
            break;
        }
        if (rc == 0 && ps_now_ms() - t0 >= TICK_MS)
            break;
    }
    if (rc != 0) {
        int64_t now = ps_now_ms();
        if (now - k->logged_ms > 60000) {
            ps_log_error("sparse: compaction of segment %u failed (tried again in %d s): %s",
                         k->seg, RETRY_MS / 1000, why[0] ? why : ps_strerror(rc));
            k->logged_ms = now;
        }
        psd_segs_compact_end(k->c);
        k->c = NULL;
        k->next_ms = now + RETRY_MS;
    }
    atomic_store(&sp->compacted, psd_segs_copied(sp->segs));
    atomic_store(&sp->segs_removed, psd_segs_removed(sp->segs));
}

void sparse_compact_free(psd_sparse *sp)
{
    struct sp_compact *k = sp->compact;
    if (k == NULL)
        return;
    rt_end(k);
    psd_segs_compact_end(k->c);
    free(k->mv);
    free(k);
    sp->compact = NULL;
}
