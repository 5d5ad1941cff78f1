#include "common/conf.h"

#include "common/errors.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include "common/jsonutil.h"

#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static void *field(const ps_opt *o, void *cfg)
{
    return (char *)cfg + o->offset;
}

static bool same_name(const char *a, const char *name, size_t len)
{
    return a != NULL && strlen(a) == len && strncmp(a, name, len) == 0;
}

/* The option named name[0..len), by its name or its old one (*old then
 * set, when old is not NULL). */
static const ps_opt *find_opt_old(const ps_opt *opts, const char *name,
                                  size_t len, bool *old)
{
    if (old != NULL)
        *old = false;
    for (const ps_opt *o = opts; o->name != NULL; o++) {
        if (same_name(o->name, name, len))
            return o;
    }
    for (const ps_opt *o = opts; o->name != NULL; o++) {
        if (same_name(o->alias, name, len)) {
            if (old != NULL)
                *old = true;
            return o;
        }
    }
    return NULL;
}

static const ps_opt *find_opt(const ps_opt *opts, const char *name,
                              size_t len)
{
    return find_opt_old(opts, name, len, NULL);
}

/* The old names warned about so far in this process: a program that loads
 * two tables (psctl's own options, then its command's, which share
 * --timeout) still warns once per name. Loads happen at start-up, on one
 * thread. */
static const char *warned_names[16];
static size_t nwarned_names;

/* Once per old name: "PROG: warning: --old is an old name for --name; it
 * still works". warned has a slot per option of the table. */
static void warn_old(const ps_opt *opts, const ps_opt *o, bool *warned,
                     const char *how)
{
    size_t i = (size_t)(o - opts);
    if (warned[i])
        return;
    warned[i] = true;
    for (size_t k = 0; k < nwarned_names; k++)
        if (strcmp(warned_names[k], o->alias) == 0)
            return;
    if (nwarned_names < sizeof warned_names / sizeof warned_names[0])
        warned_names[nwarned_names++] = o->alias;
    fprintf(stderr, "%s: warning: %s%s is an old name for %s%s; it still works\n",
            program_invocation_short_name, how, o->alias, how, o->name);
}

/* A range bound as a person would write it: 1048576, not 1.04858e+06. */
static void fmt_num(double v, char *buf, size_t len)
{
    if (v == floor(v) && fabs(v) < 9e15)
        snprintf(buf, len, "%.0f", v);
    else
        snprintf(buf, len, "%g", v);
}

static bool has_range(const ps_opt *o)
{
    return o->min < o->max;
}

/* One option being set: the field it fills, and what a refusal names: the
 * start of the message (where: "--port", "f.json: key 'port'") and the
 * value as text cut to fit in it (shown). */
struct setting {
    const ps_opt *o;
    void *cfg;
    const char *where;
    const char *shown;
    char *err;
    size_t errlen;
};

static void *slot(const struct setting *t)
{
    return field(t->o, t->cfg);
}

/* Refuses the value: PS_EINVAL_ARG with t->err "WHERE: <fmt...>". */
__attribute__((format(printf, 2, 3)))
static int refuse(const struct setting *t, const char *fmt, ...)
{
    char what[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return ps_errf(PS_EINVAL_ARG, t->err, t->errlen, "%s: %s", t->where, what);
}

static int check_range(const struct setting *t, double v)
{
    const ps_opt *o = t->o;
    if (!has_range(o) || (v >= o->min && v <= o->max))
        return 0;
    char lo[32], hi[32];
    fmt_num(o->min, lo, sizeof lo);
    fmt_num(o->max, hi, sizeof hi);
    return refuse(t, "%s is out of range [%s, %s]", t->shown, lo, hi);
}

/* Reads an unsigned decimal prefix of s into *v and points *end past it.
 * Returns false when s does not start with a digit; sets *overflow when the
 * number does not fit in 64 bits. */
static bool read_u64(const char *s, uint64_t *v, const char **end,
                     bool *overflow)
{
    if (!isdigit((unsigned char)*s))
        return false;
    uint64_t n = 0;
    *overflow = false;
    for (; isdigit((unsigned char)*s); s++) {
        unsigned d = (unsigned)(*s - '0');
        if (n > (UINT64_MAX - d) / 10)
            *overflow = true;
        else
            n = n * 10 + d;
    }
    *v = n;
    *end = s;
    return true;
}

struct unit {
    const char *name;
    uint64_t mult;
};

static const struct unit size_units[] = {
    {"", 1},           {"b", 1},
    {"k", 1ull << 10}, {"kb", 1ull << 10}, {"kib", 1ull << 10},
    {"m", 1ull << 20}, {"mb", 1ull << 20}, {"mib", 1ull << 20},
    {"g", 1ull << 30}, {"gb", 1ull << 30}, {"gib", 1ull << 30},
    {"t", 1ull << 40}, {"tb", 1ull << 40}, {"tib", 1ull << 40},
    {NULL, 0},
};

static const struct unit duration_units[] = {
    {"", 1}, {"ms", 1}, {"s", 1000}, {"m", 60000}, {"min", 60000},
    {"h", 3600000}, {NULL, 0},
};

/* Parses "<digits>[ ]<unit>" with a unit from the table (case-insensitive).
 * Returns 0, 1 for a malformed text, 2 for one too large for 64 bits. */
static int parse_with_unit(const char *s, const struct unit *units,
                           uint64_t *out)
{
    uint64_t n;
    const char *end;
    bool overflow;
    if (!read_u64(s, &n, &end, &overflow))
        return 1;
    while (*end == ' ')
        end++;
    for (const struct unit *u = units; u->name != NULL; u++) {
        if (strcasecmp(end, u->name) == 0) {
            if (overflow || n > UINT64_MAX / u->mult)
                return 2;
            *out = n * u->mult;
            return 0;
        }
    }
    return 1;
}

static int parse_bool(const char *s, bool *out)
{
    static const char *const yes[] = {"true", "yes", "on", "1"};
    static const char *const no[] = {"false", "no", "off", "0"};
    for (size_t i = 0; i < 4; i++) {
        if (strcasecmp(s, yes[i]) == 0) {
            *out = true;
            return 0;
        }
        if (strcasecmp(s, no[i]) == 0) {
            *out = false;
            return 0;
        }
    }
    return PS_EINVAL_ARG;
}

static int set_string(const ps_opt *o, void *cfg, const char *s)
{
    char **slot = field(o, cfg);
    char *copy = NULL;
    if (s != NULL) {
        copy = strdup(s);
        if (copy == NULL)
            return -ENOMEM;
    }
    free(*slot);
    *slot = copy;
    return 0;
}

static int set_int64(const struct setting *t, int64_t v)
{
    int rc = check_range(t, (double)v);
    if (rc != 0)
        return rc;
    if (v < INT_MIN || v > INT_MAX)
        return refuse(t, "%s is out of range [%d, %d]", t->shown, INT_MIN, INT_MAX);
    *(int *)slot(t) = (int)v;
    return 0;
}

static int set_uint64(const struct setting *t, uint64_t v)
{
    int rc = check_range(t, (double)v);
    if (rc != 0)
        return rc;
    *(uint64_t *)slot(t) = v;
    return 0;
}

static int set_double(const struct setting *t, double v)
{
    if (!isfinite(v))
        return refuse(t, "%s is not a finite number", t->shown);
    int rc = check_range(t, v);
    if (rc != 0)
        return rc;
    *(double *)slot(t) = v;
    return 0;
}

static int set_duration(const struct setting *t, uint64_t ms)
{
    if (ms > INT64_MAX)
        return refuse(t, "'%s' is too long", t->shown);
    int rc = check_range(t, (double)ms);
    if (rc != 0)
        return rc;
    *(int64_t *)slot(t) = (int64_t)ms;
    return 0;
}

/* The parsers of set_text, one per type, of the text s. Each returns 0 or
 * PS_EINVAL_ARG with t->err set. */

/* Whether strtoll or strtod, stopping at end, read all of s and s did not
 * start with a space (which both would skip). */
static bool whole_text(const char *s, const char *end)
{
    return end != s && *end == '\0' && !isspace((unsigned char)*s);
}

static int text_int(const struct setting *t, const char *s)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (!whole_text(s, end))
        return refuse(t, "'%s' is not an integer", t->shown);
    /* On overflow v is clamped to LLONG_MIN or LLONG_MAX, which both
     * range checks of set_int64 refuse. */
    return set_int64(t, v);
}

static int text_uint64(const struct setting *t, const char *s)
{
    uint64_t v;
    const char *end;
    bool overflow;
    if (!read_u64(s, &v, &end, &overflow) || *end != '\0')
        return refuse(t, "'%s' is not a non-negative integer", t->shown);
    if (overflow)
        return refuse(t, "%s is too large for 64 bits", t->shown);
    return set_uint64(t, v);
}

static int text_double(const struct setting *t, const char *s)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (!whole_text(s, end))
        return refuse(t, "'%s' is not a number", t->shown);
    if (errno == ERANGE && fabs(v) > 1.0)
        return refuse(t, "%s is not a finite number", t->shown);
    return set_double(t, v);
}

static int text_bool(const struct setting *t, const char *s)
{
    bool b;
    if (parse_bool(s, &b) != 0)
        return refuse(t, "'%s' is not a boolean (true or false)", t->shown);
    *(bool *)slot(t) = b;
    return 0;
}

/* PS_OPT_SIZE and PS_OPT_DURATION_MS: a number with a unit. */
static int text_with_unit(const struct setting *t, const char *s)
{
    bool size = t->o->type == PS_OPT_SIZE;
    uint64_t v;
    int bad = parse_with_unit(s, size ? size_units : duration_units, &v);
    if (bad == 1)
        return refuse(t, "'%s' is not %s", t->shown,
                      size ? "a size (bytes, or a number with K, M, G or T)"
                           : "a duration (a number with ms, s, m or h; "
                             "plain numbers are ms)");
    if (bad == 2)
        return refuse(t, "'%s' is too %s", t->shown, size ? "large" : "long");
    if (size)
        return set_uint64(t, v);
    return set_duration(t, v);
}

/* Stores the index of s in the option's choices, or refuses it with the
 * list. */
static int text_enum(const struct setting *t, const char *s)
{
    const char *const *choices = t->o->choices;
    char list[256] = "";
    size_t used = 0;
    for (int i = 0; choices != NULL && choices[i] != NULL; i++) {
        if (strcmp(s, choices[i]) == 0) {
            *(int *)slot(t) = i;
            return 0;
        }
        if (used < sizeof list) {
            int k = snprintf(list + used, sizeof list - used, "%s%s",
                             i > 0 ? ", " : "", choices[i]);
            used += k > 0 ? (size_t)k : 0;
        }
    }
    return refuse(t, "'%s' is not one of %s", t->shown, list);
}

/* Sets one option from text: a default, a command-line value, or a JSON
 * string. `where` starts the error message ("--port", "f.json: key 'port'"). */
static int set_text(const ps_opt *o, void *cfg, const char *s,
                    const char *where, char *err, size_t errlen)
{
    char shown[128];
    snprintf(shown, sizeof shown, "%s", s);
    const struct setting t = {o, cfg, where, shown, err, errlen};
    switch (o->type) {
    case PS_OPT_STRING:
        if (set_string(o, cfg, s) != 0)
            return ps_errf(-ENOMEM, err, errlen, "%s: out of memory", where);
        return 0;
    case PS_OPT_INT:
        return text_int(&t, s);
    case PS_OPT_UINT64:
        return text_uint64(&t, s);
    case PS_OPT_DOUBLE:
        return text_double(&t, s);
    case PS_OPT_BOOL:
        return text_bool(&t, s);
    case PS_OPT_SIZE:
    case PS_OPT_DURATION_MS:
        return text_with_unit(&t, s);
    case PS_OPT_ENUM:
        return text_enum(&t, s);
    }
    return refuse(&t, "option has an unknown type");
}

/* Sets an option's zero value: what a NULL default means. */
static void set_zero(const ps_opt *o, void *cfg)
{
    switch (o->type) {
    case PS_OPT_STRING:
        set_string(o, cfg, NULL);
        break;
    case PS_OPT_INT:
    case PS_OPT_ENUM:
        *(int *)field(o, cfg) = 0;
        break;
    case PS_OPT_UINT64:
    case PS_OPT_SIZE:
        *(uint64_t *)field(o, cfg) = 0;
        break;
    case PS_OPT_DOUBLE:
        *(double *)field(o, cfg) = 0.0;
        break;
    case PS_OPT_BOOL:
        *(bool *)field(o, cfg) = false;
        break;
    case PS_OPT_DURATION_MS:
        *(int64_t *)field(o, cfg) = 0;
        break;
    }
}

/* Sets one option from a JSON value of the config file. */
static int set_json(const ps_opt *o, void *cfg, const json_t *v,
                    const char *where, char *err, size_t errlen)
{
    const char *want = NULL;
    char shown[64];
    const struct setting t = {o, cfg, where, shown, err, errlen};
    switch (o->type) {
    case PS_OPT_STRING:
    case PS_OPT_ENUM:
        if (json_is_string(v))
            return set_text(o, cfg, json_string_value(v), where, err, errlen);
        want = "a string";
        break;

    case PS_OPT_INT:
    case PS_OPT_UINT64:
        if (json_is_integer(v)) {
            json_int_t n = json_integer_value(v);
            snprintf(shown, sizeof shown, "%" JSON_INTEGER_FORMAT, n);
            if (o->type == PS_OPT_INT)
                return set_int64(&t, n);
            if (n < 0)
                return refuse(&t, "%s is negative", shown);
            return set_uint64(&t, (uint64_t)n);
        }
        want = "an integer";
        break;

    case PS_OPT_DOUBLE:
        if (json_is_number(v)) {
            double d = json_number_value(v);
            snprintf(shown, sizeof shown, "%g", d);
            return set_double(&t, d);
        }
        want = "a number";
        break;

    case PS_OPT_BOOL:
        if (json_is_boolean(v)) {
            *(bool *)field(o, cfg) = json_is_true(v);
            return 0;
        }
        want = "true or false";
        break;

    case PS_OPT_SIZE:
    case PS_OPT_DURATION_MS:
        if (json_is_string(v))
            return set_text(o, cfg, json_string_value(v), where, err, errlen);
        if (json_is_integer(v)) {
            json_int_t n = json_integer_value(v);
            snprintf(shown, sizeof shown, "%" JSON_INTEGER_FORMAT, n);
            if (n < 0)
                return refuse(&t, "%s is negative", shown);
            if (o->type == PS_OPT_SIZE)
                return set_uint64(&t, (uint64_t)n);
            return set_duration(&t, (uint64_t)n);
        }
        want = o->type == PS_OPT_SIZE ? "a size like \"64M\" or an integer"
                                      : "a duration like \"2s\" or an integer";
        break;
    }
    return refuse(&t, "expected %s, got %s", want != NULL ? want : "a value",
                  ps_json_type_name(v));
}

static int apply_config_file(const ps_opt *opts, void *cfg, const char *path,
                             const char *flag, bool *warned, char *err,
                             size_t errlen)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        int rc = -errno;
        return ps_errf(rc, err, errlen, "%s: cannot open '%s': %s", flag, path,
                       strerror(-rc));
    }
    json_error_t jerr;
    json_t *root = json_loadf(f, JSON_REJECT_DUPLICATES, &jerr);
    fclose(f);
    if (root == NULL)
        return ps_errf(PS_EPARSE, err, errlen,
                       "%s: not valid JSON at line %d, column %d: %s", path,
                       jerr.line, jerr.column, jerr.text);

    int rc = 0;
    if (!json_is_object(root)) {
        rc = ps_errf(PS_EINVAL_ARG, err, errlen,
                     "%s: expected a JSON object of options, got %s", path,
                     ps_json_type_name(root));
        goto decref;
    }
    const char *key;
    json_t *val;
    json_object_foreach(root, key, val) {
        bool old;
        const ps_opt *o = find_opt_old(opts, key, strlen(key), &old);
        if (o == NULL) {
            rc = ps_errf(PS_EINVAL_ARG, err, errlen, "%s: unknown key '%s'",
                         path, key);
            goto decref;
        }
        if (old)
            warn_old(opts, o, warned, "");
        char where[512];
        snprintf(where, sizeof where, "%s: key '%s'", path, key);
        rc = set_json(o, cfg, val, where, err, errlen);
        if (rc != 0)
            goto decref;
    }

decref:
    json_decref(root);
    return rc;
}

/* Edit distance, for "did you mean" on unknown options; short names only. */
static size_t distance(const char *a, size_t la, const char *b)
{
    size_t lb = strlen(b);
    if (la > 63 || lb > 63)
        return SIZE_MAX;
    size_t row[64];
    for (size_t j = 0; j <= lb; j++)
        row[j] = j;
    for (size_t i = 1; i <= la; i++) {
        size_t diag = row[0];
        row[0] = i;
        for (size_t j = 1; j <= lb; j++) {
            size_t up = row[j];
            size_t best = diag + (a[i - 1] != b[j - 1]);
            if (up + 1 < best)
                best = up + 1;
            if (row[j - 1] + 1 < best)
                best = row[j - 1] + 1;
            row[j] = best;
            diag = up;
        }
    }
    return row[lb];
}

static int unknown_option(const ps_opt *opts, const char *arg, char *err,
                          size_t errlen)
{
    int n = (int)strcspn(arg, "=");
    if (arg[0] != '-' || arg[1] != '-')
        return ps_errf(PS_EINVAL_ARG, err, errlen, "unknown option '%.*s'", n,
                       arg);
    const char *name = arg + 2;
    size_t len = strcspn(name, "=");
    if (len > 3 && strncmp(name, "no-", 3) == 0) {
        const ps_opt *o = find_opt(opts, name + 3, len - 3);
        if (o != NULL)
            return ps_errf(PS_EINVAL_ARG, err, errlen,
                           "unknown option '%.*s' (--%s is not a boolean)", n,
                           arg, o->name);
    }
    /* Suggest the nearest name when the typo is small against its length:
     * "--prot" gets "--port", "--xy" gets nothing. */
    const ps_opt *best = NULL;
    size_t best_d = SIZE_MAX;
    for (const ps_opt *o = opts; o->name != NULL; o++) {
        size_t d = distance(name, len, o->name);
        if (d < best_d && d <= 2 && d * 2 <= len) {
            best_d = d;
            best = o;
        }
    }
    if (best != NULL)
        return ps_errf(PS_EINVAL_ARG, err, errlen,
                       "unknown option '%.*s' (did you mean --%s?)", n, arg,
                       best->name);
    return ps_errf(PS_EINVAL_ARG, err, errlen, "unknown option '%.*s'", n, arg);
}

enum tok_kind { TOK_END, TOK_OPT, TOK_CONFIG, TOK_HELP, TOK_VERSION };

struct tok {
    enum tok_kind kind;
    const ps_opt *opt;    /* TOK_OPT */
    const char *value;    /* TOK_OPT, TOK_CONFIG: the text; NULL for bools */
    bool negated;         /* TOK_OPT: --no-name */
    bool old;             /* TOK_OPT: given by its old name */
    int next;             /* the argv index after this token; TOK_END: the
                             first positional */
};

/* Reads the option at argv[i]. Pure syntax: which option, and its value as
 * text; values are checked by set_text later. */
static int scan(const ps_opt *opts, int argc, char **argv, int i,
                struct tok *t, char *err, size_t errlen)
{
    memset(t, 0, sizeof *t);
    t->next = i + 1;
    if (i >= argc) {
        t->kind = TOK_END;
        t->next = argc;
        return 0;
    }
    const char *arg = argv[i];
    if (strcmp(arg, "--") == 0) {
        t->kind = TOK_END;
        return 0;
    }
    if (arg[0] != '-' || arg[1] == '\0') {
        t->kind = TOK_END;
        t->next = i;
        return 0;
    }
    if (strcmp(arg, "-h") == 0 || strcmp(arg, "--help") == 0) {
        t->kind = TOK_HELP;
        return 0;
    }
    if (strcmp(arg, "--version") == 0) {
        t->kind = TOK_VERSION;
        return 0;
    }
    if (arg[1] != '-')
        return unknown_option(opts, arg, err, errlen);

    const char *name = arg + 2;
    const char *eq = strchr(name, '=');
    size_t len = eq != NULL ? (size_t)(eq - name) : strlen(name);
    const char *flag;
    if (len == 6 && strncmp(name, "config", 6) == 0) {
        t->kind = TOK_CONFIG;
        flag = "--config";
    } else {
        t->kind = TOK_OPT;
        t->opt = find_opt_old(opts, name, len, &t->old);
        if (t->opt == NULL && len > 3 && strncmp(name, "no-", 3) == 0) {
            const ps_opt *o = find_opt_old(opts, name + 3, len - 3, &t->old);
            if (o != NULL && o->type == PS_OPT_BOOL) {
                if (eq != NULL)
                    return ps_errf(PS_EINVAL_ARG, err, errlen,
                                   "--%.*s: takes no value", (int)len, name);
                t->opt = o;
                t->negated = true;
                return 0;
            }
        }
        if (t->opt == NULL)
            return unknown_option(opts, arg, err, errlen);
        flag = NULL;
        if (t->opt->type == PS_OPT_BOOL) {
            t->value = eq != NULL ? eq + 1 : NULL;
            return 0;
        }
    }

    if (eq != NULL) {
        t->value = eq + 1;
        return 0;
    }
    /* "--port --threads 4" is a forgotten value, not the port "--threads". */
    if (i + 1 >= argc || strncmp(argv[i + 1], "--", 2) == 0) {
        if (flag != NULL)
            return ps_errf(PS_EINVAL_ARG, err, errlen, "%s: missing value", flag);
        return ps_errf(PS_EINVAL_ARG, err, errlen, "--%s: missing value",
                       t->opt->name);
    }
    t->value = argv[i + 1];
    t->next = i + 2;
    return 0;
}

void ps_conf_free(const ps_opt *opts, void *cfg)
{
    for (const ps_opt *o = opts; o->name != NULL; o++) {
        if (o->type == PS_OPT_STRING) {
            char **slot = field(o, cfg);
            free(*slot);
            *slot = NULL;
        }
    }
}

/* "PSD" and "data-dir" -> "PSD_DATA_DIR". */
static void env_name(const char *prefix, const char *name, char *out, size_t len)
{
    int n = snprintf(out, len, "%s_", prefix);
    for (size_t i = n > 0 ? (size_t)n : 0; *name != '\0' && i + 1 < len; name++, i++) {
        out[i] = *name == '-' ? '_' : (char)toupper((unsigned char)*name);
        out[i + 1] = '\0';
    }
}

/* Layer 3: PREFIX_NAME for every option that has one set. */
static int apply_env(const ps_opt *opts, void *cfg, const char *prefix, char *err,
                     size_t errlen)
{
    for (const ps_opt *o = opts; o->name != NULL; o++) {
        char var[160];
        env_name(prefix, o->name, var, sizeof var);
        const char *v = getenv(var);
        if (v == NULL)
            continue;
        int rc = set_text(o, cfg, v, var, err, errlen);
        if (rc != 0)
            return rc;
    }
    return 0;
}

int ps_conf_load(const ps_opt *opts, void *cfg, int argc, char **argv,
                 int *first_positional, char *err, size_t errlen)
{
    return ps_conf_load_env(opts, cfg, argc, argv, NULL, first_positional, err,
                            errlen);
}

/* The first pass reads the command line's syntax only (so that --help, a
 * typo or a missing value is reported before any file or variable is read)
 * and finds --config; the second applies the defaults, the file, the
 * environment, then the command line's values. */
int ps_conf_load_env(const ps_opt *opts, void *cfg, int argc, char **argv,
                     const char *env_prefix, int *first_positional, char *err,
                     size_t errlen)
{
    if (err != NULL && errlen > 0)
        err[0] = '\0';
    const char *config = NULL;
    struct tok t;
    int i = 1, rc;
    for (;;) {
        rc = scan(opts, argc, argv, i, &t, err, errlen);
        if (rc != 0)
            return rc;
        if (t.kind == TOK_END)
            break;
        if (t.kind == TOK_HELP)
            return PS_CONF_HELP;
        if (t.kind == TOK_VERSION)
            return PS_CONF_VERSION;
        if (t.kind == TOK_CONFIG) {
            if (config != NULL)
                return ps_errf(PS_EINVAL_ARG, err, errlen,
                               "--config: given more than once");
            if (t.value[0] == '\0')
                return ps_errf(PS_EINVAL_ARG, err, errlen,
                               "--config: empty file name");
            config = t.value;
        }
        i = t.next;
    }
    int positional = t.next;
    if (first_positional == NULL && positional < argc)
        return ps_errf(PS_EINVAL_ARG, err, errlen, "unexpected argument '%s'",
                       argv[positional]);
    char config_var[160] = "";
    if (config == NULL && env_prefix != NULL) {
        env_name(env_prefix, "config", config_var, sizeof config_var);
        config = getenv(config_var);
        if (config != NULL && config[0] == '\0')
            return ps_errf(PS_EINVAL_ARG, err, errlen, "%s: empty file name",
                           config_var);
        if (config == NULL)
            config_var[0] = '\0';
    }
    size_t nopts = 0;
    while (opts[nopts].name != NULL)
        nopts++;
    bool *warned = calloc(nopts + 1, sizeof *warned);
    if (warned == NULL)
        return ps_errf(-ENOMEM, err, errlen, "out of memory");

    for (const ps_opt *o = opts; o->name != NULL; o++) {
        if (o->type == PS_OPT_STRING)
            *(char **)field(o, cfg) = NULL;
    }
    for (const ps_opt *o = opts; o->name != NULL; o++) {
        set_zero(o, cfg);
        if (o->def == NULL)
            continue;
        char where[128];
        snprintf(where, sizeof where, "--%s (default)", o->name);
        rc = set_text(o, cfg, o->def, where, err, errlen);
        if (rc != 0)
            goto free_strings;
    }

    if (config != NULL) {
        rc = apply_config_file(opts, cfg, config,
                               config_var[0] != '\0' ? config_var : "--config", warned,
                               err, errlen);
        if (rc != 0)
            goto free_strings;
    }
    if (env_prefix != NULL) {
        rc = apply_env(opts, cfg, env_prefix, err, errlen);
        if (rc != 0)
            goto free_strings;
    }

    for (i = 1;; i = t.next) {
        scan(opts, argc, argv, i, &t, NULL, 0);
        if (t.kind == TOK_END)
            break;
        if (t.kind != TOK_OPT)
            continue;
        if (t.old)
            warn_old(opts, t.opt, warned, "--");
        char where[128];
        snprintf(where, sizeof where, "--%s", t.old ? t.opt->alias : t.opt->name);
        if (t.opt->type == PS_OPT_BOOL && t.value == NULL) {
            *(bool *)field(t.opt, cfg) = !t.negated;
            continue;
        }
        rc = set_text(t.opt, cfg, t.value, where, err, errlen);
        if (rc != 0)
            goto free_strings;
    }
    if (first_positional != NULL)
        *first_positional = positional;
    free(warned);
    return 0;

free_strings:
    free(warned);
    ps_conf_free(opts, cfg);
    return rc;
}

static const char *type_label(const ps_opt *o, char *buf, size_t len)
{
    switch (o->type) {
    case PS_OPT_STRING:
        return "STRING";
    case PS_OPT_INT:
        return "INT";
    case PS_OPT_UINT64:
        return "N";
    case PS_OPT_DOUBLE:
        return "NUM";
    case PS_OPT_BOOL:
        return "";
    case PS_OPT_SIZE:
        return "SIZE";
    case PS_OPT_DURATION_MS:
        return "DURATION";
    case PS_OPT_ENUM: {
        size_t used = 0;
        buf[0] = '\0';
        for (int i = 0; o->choices != NULL && o->choices[i] != NULL; i++) {
            if (used >= len)
                break;
            int k = snprintf(buf + used, len - used, "%s%s", i > 0 ? "|" : "",
                             o->choices[i]);
            used += k > 0 ? (size_t)k : 0;
        }
        return buf;
    }
    }
    return "?";
}

static void usage_line(FILE *out, const char *left, const char *right)
{
    if (strlen(left) <= 28)
        fprintf(out, "  %-28s %s\n", left, right);
    else
        fprintf(out, "  %s\n  %-28s %s\n", left, "", right);
}

void ps_conf_usage(const ps_opt *opts, const char *prog, const char *synopsis,
                   FILE *out)
{
    const char *slash = prog != NULL ? strrchr(prog, '/') : NULL;
    if (slash != NULL)
        prog = slash + 1;
    fprintf(out, "Usage: %s %s\n\nOptions:\n", prog != NULL ? prog : "",
            synopsis != NULL ? synopsis : "[OPTIONS]");
    for (const ps_opt *o = opts; o->name != NULL; o++) {
        char left[256], right[512], label[200];
        const char *type = type_label(o, label, sizeof label);
        if (o->type == PS_OPT_BOOL)
            snprintf(left, sizeof left, "--[no-]%s", o->name);
        else
            snprintf(left, sizeof left, "--%s %s", o->name, type);

        size_t used = (size_t)snprintf(right, sizeof right, "%s",
                                       o->help != NULL ? o->help : "");
        if (has_range(o) && used < sizeof right) {
            char lo[32], hi[32];
            fmt_num(o->min, lo, sizeof lo);
            fmt_num(o->max, hi, sizeof hi);
            used += (size_t)snprintf(right + used, sizeof right - used,
                                     " [%s, %s]", lo, hi);
        }
        if (o->alias != NULL && used < sizeof right)
            used += (size_t)snprintf(right + used, sizeof right - used,
                                     " (old name: --%s)", o->alias);
        if (used < sizeof right) {
            const char *def = o->def;
            if (def == NULL && o->type == PS_OPT_BOOL)
                def = "false";
            if (def == NULL && o->type == PS_OPT_ENUM && o->choices != NULL)
                def = o->choices[0];
            if (def != NULL)
                snprintf(right + used, sizeof right - used, " (default: %s)",
                         def);
        }
        usage_line(out, left, right);
    }
    usage_line(out, "--config FILE",
               "read options from a JSON object first; the command line "
               "overrides it");
    usage_line(out, "-h, --help", "print this help and exit");
    usage_line(out, "--version", "print the version and exit");
    bool units = false;
    for (const ps_opt *o = opts; o->name != NULL; o++)
        units |= o->type == PS_OPT_SIZE || o->type == PS_OPT_DURATION_MS;
    if (units)
        fprintf(out, "\nSIZE takes bytes or K, M, G, T (powers of 1024); "
                 "DURATION takes ms, s, m, h\n(a plain number is ms).\n");
}

void ps_conf_usage_env(const ps_opt *opts, const char *prog, const char *synopsis,
                       const char *env_prefix, FILE *out)
{
    ps_conf_usage(opts, prog, synopsis, out);
    if (env_prefix == NULL)
        return;
    char example[160] = "";
    if (opts[0].name != NULL)
        env_name(env_prefix, opts[0].name, example, sizeof example);
    fprintf(out, "\nEvery option can also come from the environment: %s_NAME, the name in "
            "upper case\nwith '_' for '-' (--%s: %s; $%s_CONFIG names a config "
            "file).\nLater layers win: defaults, then the config file, then the "
            "environment, then\nthe command line.\n", env_prefix,
            opts[0].name != NULL ? opts[0].name : "name", example, env_prefix);
}
