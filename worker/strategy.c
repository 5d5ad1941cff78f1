/*
 * strategy.c - --strategy onto the finer flags (strategy.h).
 */
#include "worker/strategy.h"

#include "worker/jsonout.h"

#include "common/errors.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

const char *const wd_strategy_names[] = {
    "auto", "one_device", "mirrored", "central_storage", "parameter_server",
    "multi_worker_mirrored", NULL};

static int refuse(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int refuse(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    return PS_EINVAL_ARG;
}

int wd_strategy_settle(int s, struct wd_strategy_flags *f, char *err, size_t errlen)
{
    const char *name = wd_strategy_names[s];
    switch (s) {
    case WD_STRATEGY_ONE_DEVICE:
        if (*f->replicas > 1)
            return refuse(err, errlen, "--strategy one_device: --replicas %d is more "
                          "than one device (use mirrored)", *f->replicas);
        *f->local = true;
        break;
    case WD_STRATEGY_CENTRAL_STORAGE:
        *f->shm = 1; /* and replicated on this host's devices, as mirrored */
        __attribute__((fallthrough));
    case WD_STRATEGY_MIRRORED:
        if (*f->local)
            return refuse(err, errlen, "--strategy %s keeps the variables in a psd on "
                          "this host: not with --local", name);
        if (*f->num_workers > 1)
            return refuse(err, errlen, "--strategy %s is one worker: --workers %d "
                          "(use multi_worker_mirrored)", name, *f->num_workers);
        if (*f->replicas == 1)
            *f->replicas = 2;
        *f->num_workers = 1;
        *f->consistency = 1; /* sync: one update per step */
        break;
    case WD_STRATEGY_PARAMETER_SERVER:
        if (*f->local)
            return refuse(err, errlen, "--strategy parameter_server needs psd: not "
                          "with --local");
        break;
    case WD_STRATEGY_MULTI_WORKER_MIRRORED:
        if (!f->use_coord)
            return refuse(err, errlen, "--strategy multi_worker_mirrored needs "
                          "--coordinator (its rendezvous and generations)");
        if (*f->local || *f->replicas > 1 || strcmp(f->optimizer, "sgd") != 0)
            return refuse(err, errlen, "--strategy multi_worker_mirrored trains one "
                          "replica per worker with SGD applied on the worker: not with "
                          "--local, --replicas %d or --optimizer %s", *f->replicas,
                          f->optimizer);
        if (f->nccl_asked && strncmp(f->device, "cuda:", 5) != 0)
            return refuse(err, errlen, "--allreduce-engine nccl needs --device cuda:N");
        break;
    default:
        break;
    }
    return 0;
}

void wd_strategy_print_mwm(const struct wd_train_result *res, int task_index,
                           const char *model, int batch, bool json)
{
    if (res->left_out) {
        printf("worker %d: the job finished (step %llu) while this worker was out of "
               "its group\n", task_index, (unsigned long long)res->version);
    } else if (json) {
        char fl[40], tl[40], ta[40];
        printf("{\"role\":\"worker\",\"strategy\":\"multi_worker_mirrored\","
               "\"task_index\":%d,\"model\":\"%s\",\"batch\":%d,\"steps\":%lld,"
               "\"examples\":%lld,\"seconds\":%.3f,\"examples_per_second\":%.1f,"
               "\"final_loss\":%s,\"test_loss\":%s,\"test_accuracy\":%s,"
               "\"job_step\":%llu,\"checksum\":\"%016llx\",\"compute_seconds\":%.3f,"
               "\"comm_wait_seconds\":%.3f}\n",
               task_index, model, batch, (long long)res->steps, (long long)res->examples,
               res->seconds, res->examples_per_second,
               wd_json_num(fl, res->steps > 0, res->final_loss, 5),
               wd_json_num(tl, res->evaluated, res->test_loss, 5),
               wd_json_num(ta, res->evaluated, res->test_accuracy, 5),
               (unsigned long long)res->version, (unsigned long long)res->checksum,
               res->compute_seconds, res->wait_seconds);
    } else {
        char ta[40];
        printf("worker %d: done: %lld steps of the job's %llu, %lld examples in %.1f s "
               "(%.0f examples/s), loss %.4f, test accuracy %s, checksum %016llx\n",
               task_index, (long long)res->steps, (unsigned long long)res->version,
               (long long)res->examples, res->seconds, res->examples_per_second,
               res->final_loss,
               res->evaluated ? wd_json_num(ta, true, res->test_accuracy, 4)
                              : "not evaluated",
               (unsigned long long)res->checksum);
    }
    fflush(stdout);
}
