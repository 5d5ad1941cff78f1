/*
 * cluster.h - the cluster spec, in TensorFlow's TF_CONFIG shape.
 *
 *   {"cluster": {"chief": ["h0:2222"], "worker": ["h1:2222", "h2:2222"],
 *                "ps": ["h3:2222"], "evaluator": ["h4:2222"]},
 *    "task": {"type": "worker", "index": 0},
 *    "job_id": "mnist-42"}
 *
 * "cluster" is required and lists, per role, the task addresses as
 * "host:port" or "[v6addr]:port" strings; a role may be left out. "task"
 * (which of these tasks this process is) and "job_id" (a non-empty string)
 * are optional; a task without "index" is index 0. A task names one of the
 * cluster's, except an evaluator when the cluster lists none: TensorFlow
 * keeps the evaluator out of the training cluster (Kubeflow's TFJob sets
 * its TF_CONFIG so), and then task_index is any index >= 0 and
 * ps_cluster_task_address gives NULL for it. TensorFlow's "rpc_layer"
 * and "environment" keys are accepted and ignored; any other key is refused,
 * so that a typo ("tsak") is not silently dropped.
 *
 * Every check fails with one line that names the problem and where it is,
 * e.g. "ps[1] and worker[0] both use 'h:2222'". Parse errors (not JSON)
 * return PS_EPARSE; everything else PS_EINVAL_ARG.
 *
 * Threads and lifetime: a parsed ps_cluster is immutable and may be read from
 * any thread. Strings returned by it are valid until ps_cluster_close.
 */
#ifndef PS_CLUSTER_H
#define PS_CLUSTER_H

#include <stdbool.h>
#include <stddef.h>

enum ps_role {
    PS_ROLE_CHIEF,
    PS_ROLE_WORKER,
    PS_ROLE_PS,
    PS_ROLE_EVALUATOR,
    PS_ROLE_COUNT
};

typedef struct ps_cluster {
    char **addrs[PS_ROLE_COUNT]; /* per role, n[role] "host:port" strings */
    int n[PS_ROLE_COUNT];
    bool has_task;               /* "task" was given */
    enum ps_role task_role;
    int task_index;              /* 0 <= task_index < n[task_role], but for
                                  * an evaluator outside the cluster */
    char *job_id;                /* NULL when not given */
} ps_cluster;

/* "chief", "worker", "ps", "evaluator"; "unknown" for any other value. */
const char *ps_role_name(enum ps_role role);

/* Parses a role name (exact, lower case). Returns 0, or PS_EINVAL_ARG. */
int ps_role_parse(const char *s, enum ps_role *out);

/* Parses and checks a spec from a NUL-terminated JSON text. Returns 0;
 * PS_EPARSE when it is not JSON (err gives jansson's line and column);
 * PS_EINVAL_ARG for a spec that breaks a rule above; -ENOMEM. On failure err
 * holds one line and *out is zeroed, so ps_cluster_close on it is harmless. */
int ps_cluster_parse(const char *json, ps_cluster *out, char *err,
                     size_t errlen);

/* ps_cluster_parse on a file's contents. Messages start with "PATH: ".
 * Returns what ps_cluster_parse does, or -errno when the file cannot be
 * read. */
int ps_cluster_load_file(const char *path, ps_cluster *out, char *err,
                         size_t errlen);

/* ps_cluster_parse on the TF_CONFIG environment variable. Messages start with
 * "TF_CONFIG: ". Returns PS_ENOTFOUND (with a message) when TF_CONFIG is unset
 * or empty, else what ps_cluster_parse does. */
int ps_cluster_from_env(ps_cluster *out, char *err, size_t errlen);

/* Frees what a successful parse allocated and zeroes *c. */
void ps_cluster_close(ps_cluster *c);

/* The address of task role[index], or NULL when there is no such task.
 * Valid until ps_cluster_close. */
const char *ps_cluster_task_address(const ps_cluster *c, enum ps_role role,
                                    int index);

/* Splits "host:port" or "[v6addr]:port" into host (without brackets) and
 * port. Returns 0, or PS_EINVAL_ARG when there is no port, the port is not a
 * number in 1..65535, the host is empty, an IPv6 host lacks its brackets, or
 * the host does not fit in hostlen bytes. */
int ps_addr_split(const char *addr, char *host, size_t hostlen, int *port);

#endif
