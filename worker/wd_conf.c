/*
 * wd_conf.c - workerd's options table (wd_conf.h).
 */
#include "worker/wd_conf.h"

#include "common/proc.h"
#include "worker/strategy.h"

#include <stddef.h>

const char *const opt_choices[] = {"sgd", "momentum", "adagrad", "adam", "ftrl", NULL};
const char *const cons_choices[] = {"async", "sync", "bounded", NULL};
static const char *const self_choices[] = {"auto", "on", "off", NULL};
static const char *const shm_choices[] = {"auto", "on", "off", NULL};
static const char *const wire_choices[] = {"f32", "bf16", "fp16", NULL};

static const char *const algo_choices[] = {"ring", "halving_doubling", "auto", NULL};
static const char *const engine_choices[] = {"auto", "gloo", "nccl", NULL};

#define FM "/usr/share/datasets/fashion-mnist"

const ps_opt wd_opts[] = {
    {"ps", PS_OPT_STRING, offsetof(struct wd_conf, ps), NULL,
     "psd addresses, comma-separated (variables are placed over them by size); "
     "default: TF_CONFIG's ps tasks, else 127.0.0.1:7070", 0, 0, NULL},
    {"coordinator", PS_OPT_STRING, offsetof(struct wd_conf, coordinator), NULL,
     "pscoord host:port: register there, learn the ps shards and the placement "
     "from it, and report progress (--ps is then ignored); default: TF_CONFIG's "
     "chief when --ps is not given", 0, 0, NULL},
    {"job-id", PS_OPT_STRING, offsetof(struct wd_conf, job_id), "job",
     "the job to join (checked by the coordinator)", 0, 0, NULL},
    {"local", PS_OPT_BOOL, offsetof(struct wd_conf, local), "false",
     "train alone with SGD in-process, no psd (the compute-only baseline)", 0, 0, NULL},
    {"role", PS_OPT_STRING, offsetof(struct wd_conf, role), "worker",
     "worker or evaluator", 0, 0, NULL},
    {"model", PS_OPT_STRING, offsetof(struct wd_conf, model), "mlp:784-256-256-10",
     "softmax, mlp:IN-H1-...-OUT, cnn[:C1-C2-D] or widedeep[:E-H] (sparse tables)", 0, 0, NULL},
    {"data", PS_OPT_STRING, offsetof(struct wd_conf, data), FM,
     "directory with {train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz]", 0, 0, NULL},
    {"train-images", PS_OPT_STRING, offsetof(struct wd_conf, train_images), NULL,
     "IDX file of training images (overrides --data)", 0, 0, NULL},
    {"train-labels", PS_OPT_STRING, offsetof(struct wd_conf, train_labels), NULL,
     "IDX file of training labels (overrides --data)", 0, 0, NULL},
    {"test-images", PS_OPT_STRING, offsetof(struct wd_conf, test_images), NULL,
     "IDX file of test images (overrides --data)", 0, 0, NULL},
    {"test-labels", PS_OPT_STRING, offsetof(struct wd_conf, test_labels), NULL,
     "IDX file of test labels (overrides --data)", 0, 0, NULL},
    {"limit", PS_OPT_INT, offsetof(struct wd_conf, limit), "0",
     "use at most this many training examples (0 = all)", 0, 2147483647.0, NULL},
    {"classes", PS_OPT_INT, offsetof(struct wd_conf, classes), "10",
     "classes the model predicts", 2, 100000, NULL},
    /* 64: the batch the reference numbers use. */
    {"batch", PS_OPT_INT, offsetof(struct wd_conf, batch), "64",
     "examples per replica per step (global batch = batch x replicas)", 1, 65536, NULL},
    {"replicas", PS_OPT_INT, offsetof(struct wd_conf, replicas), "1",
     "local replicas: CPU threads (or GPUs) splitting each batch", 1, 64, NULL},
    {"device", PS_OPT_STRING, offsetof(struct wd_conf, device), "cpu",
     "cpu, cuda:N, tpu (libtpu) or pjrt:PATH (a PJRT plugin; one replica per "
     "device, --replicas N > 1: the first N)", 0, 0, NULL},
    {"blas-threads", PS_OPT_INT, offsetof(struct wd_conf, threads), "1",
     "OpenBLAS threads per replica (the daemons' --threads serve calls)", 1, 256,
     NULL, "threads"},
    {"epochs", PS_OPT_INT, offsetof(struct wd_conf, epochs), "1",
     "passes over this worker's shard (0 = until --steps)", 0, 1000000, NULL},
    {"steps", PS_OPT_INT, offsetof(struct wd_conf, steps), "0",
     "stop after this many steps (0 = no limit)", 0, 2147483647.0, NULL},
    {"lr", PS_OPT_DOUBLE, offsetof(struct wd_conf, lr), "0.1",
     "learning rate (applied on the server)", 1e-12, 1e6, NULL},
    {"optimizer", PS_OPT_ENUM, offsetof(struct wd_conf, optimizer), "sgd",
     "sgd, momentum, adagrad, adam or ftrl (the server's defaults for the "
     "rest)", 0, 0, opt_choices},
    {"momentum", PS_OPT_DOUBLE, offsetof(struct wd_conf, momentum), "0.9",
     "momentum (with --optimizer momentum)", 0, 0.999999, NULL},
    {"consistency", PS_OPT_ENUM, offsetof(struct wd_conf, consistency), "async",
     "async (apply each push), sync (average every worker's step) or bounded "
     "(async, but at most --staleness steps ahead of the slowest worker)", 0, 0,
     cons_choices},
    {"staleness", PS_OPT_INT, offsetof(struct wd_conf, staleness), "0",
     "bounded: steps this worker may run ahead of the slowest live one "
     "(0: lock-step)", 0, 1000000, NULL},
    {"local-steps", PS_OPT_INT, offsetof(struct wd_conf, local_steps), "0",
     "local SGD (PaddlePaddle's GEO mode): train this many steps with SGD on "
     "the worker's own copy, then push the change since the last exchange "
     "for psd to add (0: off; async SGD on one CPU replica)", 0, 1000000, NULL},
    {"step-delay", PS_OPT_DURATION_MS, offsetof(struct wd_conf, step_delay_ms), "0",
     "sleep this long before each step: a deliberately slow worker, for "
     "tests of bounded staleness and of multi_worker_mirrored", 0, 3600000, NULL,
     "step-delay-ms"},
    {"workers", PS_OPT_INT, offsetof(struct wd_conf, num_workers), "0",
     "workers in the job (data sharding, sync aggregation); 0: TF_CONFIG's "
     "worker count, else 1", 0, 65536, NULL, "num-workers"},
    {"task-index", PS_OPT_INT, offsetof(struct wd_conf, task_index), "-1",
     "this worker's index in [0, workers) (-1: 0, or assigned by the "
     "coordinator)", -1, 65535, NULL},
    {"seed", PS_OPT_UINT64, offsetof(struct wd_conf, seed), "1",
     "data shuffle seed", 0, 0, NULL},
    {"init-seed", PS_OPT_UINT64, offsetof(struct wd_conf, init_seed), "1",
     "seed of the variables' initializers on the server", 0, 0, NULL},
    {"rpc-timeout", PS_OPT_DURATION_MS, offsetof(struct wd_conf, rpc_timeout_ms), "10s",
     "deadline of one push or pull", 10, 3600000, NULL},
    /* Long enough to ride out a psd restart (systemd restarts in ~1 s). */
    {"retry-budget", PS_OPT_DURATION_MS, offsetof(struct wd_conf, retry_budget_ms), "60s",
     "how long to keep retrying a psd that is unavailable", 0, 86400000, NULL},
    {"progress", PS_OPT_DURATION_MS, offsetof(struct wd_conf, progress_ms), "2s",
     "progress line period (0 = none)", 0, 3600000, NULL},
    {"eval-interval", PS_OPT_DURATION_MS, offsetof(struct wd_conf, eval_interval_ms), "5s",
     "evaluator: time between evaluations", 10, 86400000, NULL},
    {"eval-count", PS_OPT_INT, offsetof(struct wd_conf, eval_count), "0",
     "evaluator: stop after this many evaluations (0 = until SIGTERM)", 0, 1e9, NULL},
    {"evaluate", PS_OPT_BOOL, offsetof(struct wd_conf, evaluate), "true",
     "worker: evaluate the final parameters on the test set", 0, 0, NULL},
    {"concurrent-pull", PS_OPT_BOOL, offsetof(struct wd_conf, concurrent_pull), "false",
     "async: pull on a second connection at the same time as the push, not "
     "after it: more throughput when communication dominates, one more step "
     "of staleness", 0, 0, NULL},
    {"self-update", PS_OPT_ENUM, offsetof(struct wd_conf, self_update), "auto",
     "async SGD, one CPU replica: apply this worker's own update to its copy "
     "of the parameters while the push is in flight, so that its next step "
     "does not compute without it (one step of staleness less; one pass over "
     "the parameters per step); auto = wherever that copy is exact", 0, 0,
     self_choices},
    {"shm", PS_OPT_ENUM, offsetof(struct wd_conf, shm), "auto",
     "move gradients and values through memory shared with psd, not its "
     "socket: auto = with a psd reached by its unix socket (--ps unix:PATH, "
     "or, with --coordinator, each shard on this host that has one: same host "
     "id, PS_HOST_ID in doc/operating.md; psd takes shared memory over nothing "
     "else), on = with every psd (one "
     "that will not map it says so, and the worker sends inline), off = "
     "never", 0, 0,
     shm_choices},
    /* f32: exact, and what a worker beside its psd uses anyway (shared
     * memory is float32: it costs no bytes on a link). */
    {"wire-dtype", PS_OPT_ENUM, offsetof(struct wd_conf, wire_dtype), "f32",
     "dense gradients and values on the wire to psd: bf16 or fp16 halve the "
     "bytes (psd keeps float32 values and optimizer state), f32 = float32; "
     "shards reached through shared memory stay float32", 0, 0, wire_choices},
    /* true: with half on the wire, rounding alone loses small updates. */
    /* f32: what a table of an older run holds; a table created with
     * another row dtype is refused (ALREADY_EXISTS) rather than mixed. */
    {"sparse-row-dtype", PS_OPT_ENUM, offsetof(struct wd_conf, sparse_row_dtype), "f32",
     "the row dtype of the sparse tables widedeep creates: fp16 or bf16 halve "
     "each row's value in psd's memory, on disk and on the wire (updates stay "
     "float32, slots too unless --sparse-slot-dtype), f32 = float32", 0, 0, wire_choices},
    {"sparse-slot-dtype", PS_OPT_ENUM, offsetof(struct wd_conf, sparse_slot_dtype), "f32",
     "the dtype of those tables' optimizer slots: fp16 or bf16 halve them in "
     "psd's memory and on disk, f32 = float32", 0, 0, wire_choices},
    /* 1M: psclient's default, ~1 ms a piece on a 10 Gbit/s link. */
    {"pieces", PS_OPT_SIZE, offsetof(struct wd_conf, pieces), "1M", "dense tensors "
     "above this go in pieces of it (a push's one behind the other, a pull's 2 at once), "
     "so that encoding, the link and "
     "psd's apply overlap; 0 = whole, else at least 4K", 0, 1073741824.0, NULL},
    {"error-feedback", PS_OPT_BOOL, offsetof(struct wd_conf, error_feedback), "true",
     "with --wire-dtype bf16 or fp16: keep each variable's rounding residual "
     "and add it to its next gradient, so that nothing is lost over time",
     0, 0, NULL},
    {"token-file", PS_OPT_STRING, offsetof(struct wd_conf, token_file), NULL,
     "file holding the token sent to psd and pscoord (a worker's; servers "
     "started with --tokens need one); default: none", 0, 0, NULL},
    {"json", PS_OPT_BOOL, offsetof(struct wd_conf, json), "false",
     "print the summary as one JSON object", 0, 0, NULL},
    /* Loopback, any free port, as psd's: a host runs several workers. */
    {"metrics-listen", PS_OPT_STRING, offsetof(struct wd_conf, metrics_listen),
     "127.0.0.1:0", "HOST:PORT of Prometheus' /metrics endpoint; port 0 picks a free "
     "one (printed as METRICS_PORT <n>); \"\" or off: no endpoint", 0, 0, NULL},
    /* Plaintext unless a CA is given: as psd's loopback default. */
    PS_TLS_CLIENT_OPTS(struct wd_conf, tls),
    {"log-level", PS_OPT_ENUM, offsetof(struct wd_conf, log_level), PS_PROC_LOG_DEFAULT,
     "error, warn, info or debug", 0, 0, ps_proc_log_levels},
    /* The chief is worker task 0: workerd has no chief role of its own (a
     * TF_CONFIG chief is pscoord's), and task 0 exists in every job,
     * whether its index is given, comes from TF_CONFIG or is assigned by
     * the coordinator. */
    {"logdir", PS_OPT_STRING, offsetof(struct wd_conf, logdir), NULL,
     "a directory for TensorBoard event files: the chief (worker task 0) "
     "writes LOGDIR/worker0 (loss, examples/s, learning rate), the evaluator "
     "LOGDIR/eval (test loss and accuracy), each at the job's global step; "
     "other workers write none. One that cannot be written gets one warning "
     "and training goes on (default: none)", 0, 0, NULL},
    /* 10: an event per step would be noise (and ~1000 events/s on a fast
     * model); ten steps still draw a smooth curve of any run. */
    {"summary-steps", PS_OPT_INT, offsetof(struct wd_conf, summary_steps), "10",
     "chief with --logdir: one event per this many steps (their mean loss)",
     1, 1000000, NULL},
    {"log-format", PS_OPT_ENUM, offsetof(struct wd_conf, log_format), "text",
     PS_PROC_LOG_FORMAT_HELP, 0, 0, ps_proc_log_formats},
    {"strategy", PS_OPT_ENUM, offsetof(struct wd_conf, strategy), "auto",
     "TensorFlow's distribution strategy, as settings of the flags above: "
     "one_device (--local, one replica), mirrored (--replicas, default 2, "
     "one worker, sync against a psd on this host), central_storage (mirrored "
     "with --shm on), parameter_server (--ps or --coordinator, --consistency), "
     "multi_worker_mirrored (all-reduce among the workers, no psd; needs "
     "--coordinator); auto = the flags alone", 0, 0, wd_strategy_names},
    {"allreduce-host", PS_OPT_STRING, offsetof(struct wd_conf, allreduce_host),
     "127.0.0.1", "multi_worker_mirrored: the address this worker's all-reduce "
     "listens on (its peers connect to it; a free port is picked)", 0, 0, NULL},
    {"insecure-collective", PS_OPT_BOOL, offsetof(struct wd_conf, insecure_collective),
     "false", "multi_worker_mirrored: let the all-reduce listen on an --allreduce-host "
     "that is not loopback; its gradients then cross the network in plaintext (Gloo "
     "and NCCL encrypt nothing), which is logged and shown by psctl status", 0, 0, NULL},
    /* 5 s: well past a loaded step on 2 cores, and short enough that a dead
     * peer costs little beside the coordinator's heartbeat timeout (3 s). */
    {"allreduce-timeout", PS_OPT_DURATION_MS, offsetof(struct wd_conf, allreduce_timeout_ms),
     "5s", "multi_worker_mirrored: a collective (or a group's rendezvous) that "
     "takes longer fails, and the group re-forms", 100, 3600000, NULL},
    {"rendezvous-timeout", PS_OPT_DURATION_MS,
     offsetof(struct wd_conf, rendezvous_timeout_ms), "120s",
     "multi_worker_mirrored: how long to wait for the first group of "
     "--workers workers, and for any later group", 1000, 86400000, NULL},
    {"allreduce-algorithm", PS_OPT_ENUM, offsetof(struct wd_conf, allreduce_algorithm),
     "auto", "multi_worker_mirrored on Gloo: ring, halving_doubling, or auto = "
     "halving_doubling for gradients under 4 MiB or up to net.core.wmem_max (over "
     "blocking sockets in pieces of at most wmem_max: no hand-off to Gloo's thread), "
     "else ring (faster at 64 MiB)", 0, 0,
     algo_choices},
    {"allreduce-engine", PS_OPT_ENUM, offsetof(struct wd_conf, allreduce_engine),
     "auto", "multi_worker_mirrored: gloo (TCP, CPU), nccl (GPUs), auto = nccl "
     "for --device cuda:N when a device answers, else gloo", 0, 0, engine_choices},
    {"checksum-every", PS_OPT_INT, offsetof(struct wd_conf, checksum_every), "0",
     "multi_worker_mirrored: print the parameters' checksum every N steps "
     "(equal on every worker; 0 = never)", 0, 2147483647.0, NULL},
    {0},
};
