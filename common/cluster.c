#include "common/cluster.h"

#include "common/errors.h"

#include <ctype.h>
#include <errno.h>
#include "common/jsonutil.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define VALID_ROLES "chief, worker, ps, evaluator"

static const char *const role_names[PS_ROLE_COUNT] = {
    [PS_ROLE_CHIEF] = "chief",
    [PS_ROLE_WORKER] = "worker",
    [PS_ROLE_PS] = "ps",
    [PS_ROLE_EVALUATOR] = "evaluator",
};

/* For "the cluster has 2 workers"; "ps" reads the same either way. */
static const char *const role_plurals[PS_ROLE_COUNT] = {
    [PS_ROLE_CHIEF] = "chiefs",
    [PS_ROLE_WORKER] = "workers",
    [PS_ROLE_PS] = "ps",
    [PS_ROLE_EVALUATOR] = "evaluators",
};

const char *ps_role_name(enum ps_role role)
{
    if ((unsigned)role >= PS_ROLE_COUNT)
        return "unknown";
    return role_names[role];
}

int ps_role_parse(const char *s, enum ps_role *out)
{
    for (int r = 0; r < PS_ROLE_COUNT; r++) {
        if (strcmp(s, role_names[r]) == 0) {
            *out = (enum ps_role)r;
            return 0;
        }
    }
    return PS_EINVAL_ARG;
}

/* Characters a host may hold: a DNS name or IPv4 address without brackets,
 * an IPv6 address (with an optional %zone) within them. */
static bool host_chars_ok(const char *h, size_t len, bool bracketed)
{
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)h[i];
        if (isalnum(c) || c == '.' || c == '-')
            continue;
        if (!bracketed && c == '_')
            continue;
        if (bracketed && (c == ':' || c == '%'))
            continue;
        return false;
    }
    return true;
}

/* The checks behind ps_addr_split, with the reason for a failure written to
 * why (a clause that follows "worker[0]: "). */
static int addr_split(const char *addr, char *host, size_t hostlen, int *port,
                      char *why, size_t whylen)
{
    const char *h = addr;
    size_t hlen;
    const char *p;
    bool bracketed = addr[0] == '[';
    if (bracketed) {
        const char *close = strchr(addr, ']');
        if (close == NULL)
            return ps_errf(PS_EINVAL_ARG, why, whylen,
                        "address '%s' has an unclosed '['", addr);
        h = addr + 1;
        hlen = (size_t)(close - h);
        if (close[1] != ':')
            return ps_errf(PS_EINVAL_ARG, why, whylen,
                        "address '%s' has no port (expected [v6addr]:port)",
                        addr);
        p = close + 2;
    } else {
        const char *colon = strrchr(addr, ':');
        if (colon == NULL)
            return ps_errf(PS_EINVAL_ARG, why, whylen,
                        "address '%s' has no port (expected host:port)", addr);
        hlen = (size_t)(colon - addr);
        if (memchr(addr, ':', hlen) != NULL)
            return ps_errf(PS_EINVAL_ARG, why, whylen,
                        "address '%s' looks like IPv6 without brackets "
                        "(write [v6addr]:port)", addr);
        p = colon + 1;
    }
    if (hlen == 0)
        return ps_errf(PS_EINVAL_ARG, why, whylen, "address '%s' has no host",
                    addr);
    if (!host_chars_ok(h, hlen, bracketed))
        return ps_errf(PS_EINVAL_ARG, why, whylen,
                    "address '%s' has a character not allowed in a host",
                    addr);
    if (*p == '\0')
        return ps_errf(PS_EINVAL_ARG, why, whylen,
                    "address '%s' has no port (expected host:port)", addr);
    size_t plen = strlen(p);
    for (size_t i = 0; i < plen; i++) {
        if (!isdigit((unsigned char)p[i]))
            return ps_errf(PS_EINVAL_ARG, why, whylen,
                        "port '%s' in '%s' is not a number", p, addr);
    }
    long v = plen > 6 ? 999999 : strtol(p, NULL, 10);
    if (v < 1 || v > 65535)
        return ps_errf(PS_EINVAL_ARG, why, whylen,
                    "port %s in '%s' is out of range 1..65535", p, addr);
    if (hlen >= hostlen)
        return ps_errf(PS_EINVAL_ARG, why, whylen,
                    "host in '%s' is longer than %zu bytes", addr,
                    hostlen > 0 ? hostlen - 1 : 0);
    memcpy(host, h, hlen);
    host[hlen] = '\0';
    *port = (int)v;
    return 0;
}

int ps_addr_split(const char *addr, char *host, size_t hostlen, int *port)
{
    if (addr == NULL)
        return PS_EINVAL_ARG;
    return addr_split(addr, host, hostlen, port, NULL, 0);
}

void ps_cluster_close(ps_cluster *c)
{
    if (c == NULL)
        return;
    for (int r = 0; r < PS_ROLE_COUNT; r++) {
        for (int i = 0; i < c->n[r]; i++)
            free(c->addrs[r][i]);
        free(c->addrs[r]);
    }
    free(c->job_id);
    memset(c, 0, sizeof *c);
}

/* One address seen so far, for the duplicate check: where it is and its
 * host (lower-cased, so that "H" and "h" collide) and port. */
struct seen {
    enum ps_role role;
    int index;
    int port;
    char host[256];
};

/* Reads one role's list into c, checking each address against all those seen
 * before it (in the order of the JSON text). */
static int parse_role(enum ps_role role, const json_t *list, ps_cluster *c,
                      struct seen *seen, size_t *nseen, char *err,
                      size_t errlen)
{
    const char *rname = role_names[role];
    if (!json_is_array(list))
        return ps_errf(PS_EINVAL_ARG, err, errlen,
                    "cluster.%s must be a list of \"host:port\" strings, "
                    "got %s", rname, ps_json_type_name(list));
    size_t n = json_array_size(list);
    if (n > 1000000)
        return ps_errf(PS_EINVAL_ARG, err, errlen,
                    "cluster.%s lists %zu tasks; that is too many", rname, n);
    c->addrs[role] = calloc(n > 0 ? n : 1, sizeof(char *));
    if (c->addrs[role] == NULL)
        return -ENOMEM;

    for (size_t i = 0; i < n; i++) {
        const json_t *v = json_array_get(list, i);
        if (!json_is_string(v))
            return ps_errf(PS_EINVAL_ARG, err, errlen,
                        "%s[%zu] must be a \"host:port\" string, got %s",
                        rname, i, ps_json_type_name(v));
        const char *addr = json_string_value(v);
        struct seen *s = &seen[*nseen];
        char why[384];
        if (addr_split(addr, s->host, sizeof s->host, &s->port, why,
                       sizeof why) != 0)
            return ps_errf(PS_EINVAL_ARG, err, errlen, "%s[%zu]: %s", rname, i,
                        why);
        for (char *h = s->host; *h != '\0'; h++)
            *h = (char)tolower((unsigned char)*h);
        s->role = role;
        s->index = (int)i;
        for (size_t j = 0; j < *nseen; j++) {
            if (seen[j].port == s->port &&
                strcmp(seen[j].host, s->host) == 0)
                return ps_errf(PS_EINVAL_ARG, err, errlen,
                            "%s[%d] and %s[%zu] both use '%s'",
                            role_names[seen[j].role], seen[j].index, rname, i,
                            addr);
        }
        (*nseen)++;
        c->addrs[role][i] = strdup(addr);
        if (c->addrs[role][i] == NULL)
            return -ENOMEM;
        c->n[role] = (int)i + 1;
    }
    return 0;
}

static int parse_cluster(const json_t *cl, ps_cluster *c, char *err,
                         size_t errlen)
{
    if (cl == NULL)
        return ps_errf(PS_EINVAL_ARG, err, errlen,
                    "key 'cluster' is missing; expected {\"cluster\": "
                    "{\"worker\": [\"host:port\", ...], ...}}");
    if (!json_is_object(cl))
        return ps_errf(PS_EINVAL_ARG, err, errlen,
                    "'cluster' must be an object mapping roles to address "
                    "lists, got %s", ps_json_type_name(cl));

    /* Check every role name before reading any list, so that a typo in a
     * role is reported as such rather than as a later problem. */
    size_t total = 0;
    const char *key;
    json_t *val;
    json_object_foreach((json_t *)cl, key, val) {
        enum ps_role role;
        if (ps_role_parse(key, &role) != 0)
            return ps_errf(PS_EINVAL_ARG, err, errlen,
                        "cluster has unknown role '%s'; valid roles are "
                        VALID_ROLES, key);
        if (json_is_array(val))
            total += json_array_size(val);
    }
    struct seen *seen = calloc(total > 0 ? total : 1, sizeof *seen);
    if (seen == NULL)
        return -ENOMEM;
    size_t nseen = 0;
    int rc = 0;
    json_object_foreach((json_t *)cl, key, val) {
        enum ps_role role = PS_ROLE_COUNT;
        ps_role_parse(key, &role); /* checked in the loop above */
        rc = parse_role(role, val, c, seen, &nseen, err, errlen);
        if (rc != 0)
            break;
    }
    free(seen);
    if (rc != 0)
        return rc;

    if (total == 0)
        return ps_errf(PS_EINVAL_ARG, err, errlen, "cluster lists no tasks");
    if (c->n[PS_ROLE_CHIEF] > 1)
        return ps_errf(PS_EINVAL_ARG, err, errlen,
                    "cluster has %d chiefs; at most one is allowed",
                    c->n[PS_ROLE_CHIEF]);
    return 0;
}

static int parse_task(const json_t *task, ps_cluster *c, char *err,
                      size_t errlen)
{
    if (!json_is_object(task))
        return ps_errf(PS_EINVAL_ARG, err, errlen,
                    "'task' must be an object like {\"type\": \"worker\", "
                    "\"index\": 0}, got %s", ps_json_type_name(task));
    const char *key;
    json_t *val;
    json_object_foreach((json_t *)task, key, val) {
        if (strcmp(key, "type") != 0 && strcmp(key, "index") != 0)
            return ps_errf(PS_EINVAL_ARG, err, errlen,
                        "task has unknown key '%s'; expected type, index",
                        key);
    }

    const json_t *type = json_object_get(task, "type");
    if (type == NULL)
        return ps_errf(PS_EINVAL_ARG, err, errlen, "task.type is missing");
    if (!json_is_string(type))
        return ps_errf(PS_EINVAL_ARG, err, errlen,
                    "task.type must be a role name string, got %s",
                    ps_json_type_name(type));
    enum ps_role role;
    if (ps_role_parse(json_string_value(type), &role) != 0)
        return ps_errf(PS_EINVAL_ARG, err, errlen,
                    "task type '%s' is not a role; valid roles are "
                    VALID_ROLES, json_string_value(type));

    json_int_t index = 0;
    const json_t *idx = json_object_get(task, "index");
    if (idx != NULL) {
        if (!json_is_integer(idx))
            return ps_errf(PS_EINVAL_ARG, err, errlen,
                        "task.index must be an integer, got %s",
                        ps_json_type_name(idx));
        index = json_integer_value(idx);
    }
    if (index < 0)
        return ps_errf(PS_EINVAL_ARG, err, errlen,
                    "task index %" JSON_INTEGER_FORMAT " is negative", index);
    /* An evaluator outside the training cluster, as TensorFlow has it. */
    bool outside = role == PS_ROLE_EVALUATOR && c->n[role] == 0;
    if (index >= c->n[role] && !outside)
        return ps_errf(PS_EINVAL_ARG, err, errlen,
                    "task %s[%" JSON_INTEGER_FORMAT "] but the cluster has "
                    "%d %s", role_names[role], index, c->n[role],
                    c->n[role] == 1 ? role_names[role] : role_plurals[role]);
    c->has_task = true;
    c->task_role = role;
    c->task_index = (int)index;
    return 0;
}

static int parse_spec(const json_t *root, ps_cluster *c, char *err,
                      size_t errlen)
{
    if (!json_is_object(root))
        return ps_errf(PS_EINVAL_ARG, err, errlen,
                    "the spec must be a JSON object, got %s",
                    ps_json_type_name(root));
    const char *key;
    json_t *val;
    json_object_foreach((json_t *)root, key, val) {
        if (strcmp(key, "cluster") != 0 && strcmp(key, "task") != 0 &&
            strcmp(key, "job_id") != 0 && strcmp(key, "rpc_layer") != 0 &&
            strcmp(key, "environment") != 0)
            return ps_errf(PS_EINVAL_ARG, err, errlen,
                        "unknown key '%s'; expected cluster, task, job_id",
                        key);
    }

    int rc = parse_cluster(json_object_get(root, "cluster"), c, err, errlen);
    if (rc != 0)
        return rc;

    const json_t *task = json_object_get(root, "task");
    if (task != NULL) {
        rc = parse_task(task, c, err, errlen);
        if (rc != 0)
            return rc;
    }

    const json_t *job = json_object_get(root, "job_id");
    if (job != NULL) {
        if (!json_is_string(job) || json_string_length(job) == 0)
            return ps_errf(PS_EINVAL_ARG, err, errlen,
                        "job_id must be a non-empty string, got %s",
                        json_is_string(job) ? "\"\"" : ps_json_type_name(job));
        c->job_id = strdup(json_string_value(job));
        if (c->job_id == NULL)
            return -ENOMEM;
    }
    return 0;
}

int ps_cluster_parse(const char *json, ps_cluster *out, char *err,
                     size_t errlen)
{
    memset(out, 0, sizeof *out);
    if (json == NULL)
        return ps_errf(PS_EINVAL_ARG, err, errlen, "no spec given");
    json_error_t jerr;
    json_t *root = json_loads(json, JSON_REJECT_DUPLICATES, &jerr);
    if (root == NULL)
        return ps_errf(PS_EPARSE, err, errlen,
                    "not valid JSON at line %d, column %d: %s", jerr.line,
                    jerr.column, jerr.text);
    int rc = parse_spec(root, out, err, errlen);
    json_decref(root);
    if (rc == -ENOMEM)
        ps_errf(rc, err, errlen, "out of memory");
    if (rc != 0)
        ps_cluster_close(out);
    return rc;
}

/* Runs ps_cluster_parse and puts "<prefix>: " before its message. */
static int parse_with_prefix(const char *prefix, const char *json,
                             ps_cluster *out, char *err, size_t errlen)
{
    char msg[512];
    int rc = ps_cluster_parse(json, out, msg, sizeof msg);
    if (rc != 0)
        ps_errf(rc, err, errlen, "%s: %s", prefix, msg);
    return rc;
}

int ps_cluster_load_file(const char *path, ps_cluster *out, char *err,
                         size_t errlen)
{
    memset(out, 0, sizeof *out);
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        int rc = -errno;
        return ps_errf(rc, err, errlen, "%s: %s", path, strerror(-rc));
    }
    /* Specs are small; a multi-megabyte one is a mistake, not a cluster. */
    enum { max_spec = 64 << 20 };
    size_t cap = 4096, len = 0;
    char *buf = malloc(cap);
    int rc = 0;
    if (buf == NULL) {
        rc = ps_errf(-ENOMEM, err, errlen, "%s: out of memory", path);
        goto close_file;
    }
    for (;;) {
        if (len + 1 >= cap) {
            if (cap >= max_spec) {
                rc = ps_errf(PS_EINVAL_ARG, err, errlen,
                          "%s: larger than %d bytes", path, (int)max_spec);
                goto free_buf;
            }
            char *bigger = realloc(buf, cap * 2);
            if (bigger == NULL) {
                rc = ps_errf(-ENOMEM, err, errlen, "%s: out of memory", path);
                goto free_buf;
            }
            buf = bigger;
            cap *= 2;
        }
        size_t got = fread(buf + len, 1, cap - 1 - len, f);
        len += got;
        if (got == 0)
            break;
    }
    if (ferror(f)) {
        rc = ps_errf(-EIO, err, errlen, "%s: read error", path);
        goto free_buf;
    }
    buf[len] = '\0';
    if (memchr(buf, '\0', len) != NULL) {
        rc = ps_errf(PS_EPARSE, err, errlen, "%s: not valid JSON (contains a "
                  "NUL byte)", path);
        goto free_buf;
    }
    rc = parse_with_prefix(path, buf, out, err, errlen);

free_buf:
    free(buf);
close_file:
    fclose(f);
    return rc;
}

int ps_cluster_from_env(ps_cluster *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    const char *tf = getenv("TF_CONFIG");
    if (tf == NULL || tf[0] == '\0')
        return ps_errf(PS_ENOTFOUND, err, errlen, "TF_CONFIG is not set");
    return parse_with_prefix("TF_CONFIG", tf, out, err, errlen);
}

const char *ps_cluster_task_address(const ps_cluster *c, enum ps_role role,
                                    int index)
{
    if (c == NULL || (unsigned)role >= PS_ROLE_COUNT || index < 0 ||
        index >= c->n[role])
        return NULL;
    return c->addrs[role][index];
}
