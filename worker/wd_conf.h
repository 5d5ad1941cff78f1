/*
 * wd_conf.h - workerd's options: the struct its command line and JSON
 * config fill (common/conf.h) and the table that describes them, kept
 * apart from workerd.c's steps so that each stays a readable size.
 *
 * Threads and lifetime: plain data; the table and the choice lists are
 * static and read-only.
 */
#ifndef WD_CONF_H
#define WD_CONF_H

#include "common/auth.h"
#include "common/conf.h"
#include "common/tls.h"

#include <stdbool.h>
#include <stdint.h>

struct wd_conf {
    char *ps;
    char *coordinator;
    char *job_id;
    bool local;
    char *role;
    char *model;
    char *data;
    char *train_images, *train_labels, *test_images, *test_labels;
    int limit;
    int classes;
    int batch;
    int replicas;
    char *device;
    int threads;
    int epochs;
    int steps;
    double lr;
    int optimizer;
    double momentum;
    int consistency;
    int staleness, local_steps;    /* relaxed.h; PS_OPT_INT fills an int */
    int64_t step_delay_ms;         /* PS_OPT_DURATION_MS */
    int num_workers;
    int task_index;
    uint64_t seed;
    uint64_t init_seed;
    int64_t rpc_timeout_ms;
    int64_t retry_budget_ms;
    int64_t progress_ms;
    int64_t eval_interval_ms;
    int eval_count;
    bool evaluate;
    bool concurrent_pull;
    int self_update;            /* 0 auto, 1 on, 2 off */
    int shm;                    /* 0 auto, 1 on, 2 off */
    int wire_dtype;             /* 0 f32, 1 bf16, 2 fp16 (wire_choices) */
    int sparse_row_dtype;       /* widedeep's tables: the same choices */
    int sparse_slot_dtype;      /* and their optimizer slots: the same choices */
    bool error_feedback;
    uint64_t pieces;            /* bytes; 0: whole tensors */
    bool json;
    char *metrics_listen;
    ps_tls_conf tls;
    int log_level;
    char *logdir;
    int summary_steps;
    int log_format;
    char *token_file;
    char token[PS_AUTH_TOKEN_MAX + 1]; /* what token_file holds, or "" */
    int strategy;               /* enum wd_strategy (worker/strategy.h) */
    char *allreduce_host;
    bool insecure_collective;   /* --insecure-collective */
    int64_t allreduce_timeout_ms;
    int64_t rendezvous_timeout_ms;
    int allreduce_algorithm;
    int allreduce_engine;       /* 0 auto, 1 gloo, 2 nccl */
    int checksum_every;
};

/* The options table, terminated by {0}. */
extern const ps_opt wd_opts[];

/* The names of the enum options' values, indexed as the fields hold them. */
extern const char *const opt_choices[];   /* --optimizer */
extern const char *const cons_choices[];  /* --consistency */

#endif
