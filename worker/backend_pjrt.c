/*
 * backend_pjrt.c - the PJRT backend (backend.h): a PJRT plugin (XLA's C
 * plugin API; libtpu on TPU hosts, xla_cpu_pjrt here) dlopened at run time,
 * one backend per addressable device, running the training step of a dense
 * model or the CNN as one compiled StableHLO program (worker/hlo_gen.c).
 *
 * The plugin is loaded once per process (ps_pjrt_open): dlopen, GetPjrtApi,
 * the API version check, PJRT_Plugin_Initialize, PJRT_Client_Create, the
 * addressable devices. Each device's backend keeps the model's memory on the
 * host (its memory slots are host copies and its kernels the CPU
 * backend's, for evaluation and the local SGD step) and the parameters the
 * step reads as device buffers, refreshed when the model's values change
 * (step_params). A step uploads the batch, executes, and downloads the
 * gradients and the loss. Executables are compiled once per (widths, batch)
 * as portable programs and shared by every device. Every PJRT_Error's
 * message goes to the log and into the caller's one-line reason.
 *
 * The one file that sees pjrt_c_api.h (common/confine.h); nothing links
 * against PJRT, so this file is always built.
 */
#include "worker/backend.h"

#include "common/clock.h"
#include "common/errors.h"
#include "common/log.h"
#include "third_party/pjrt/pjrt_c_api.h"
#include "worker/compile_options.pb-c.h"
#include "worker/hlo_gen.h"

#include <dlfcn.h>
#include <errno.h>
#include <glob.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAX_TENSORS (2 * PS_HLO_MAX_LAYERS)
#define MAX_EXES 32

/* One compiled step: the model and the batch it was built for. */
struct exe {
    struct ps_step_net net;
    int batch;
    PJRT_LoadedExecutable *exe;
};

/* One addressable device, and the backend table that computes on it. */
struct device {
    struct plugin *p;
    int index;
    PJRT_Device *dev;
    char name[48];
    struct ps_backend be;
};

/* The plugin, loaded once per process. */
struct plugin {
    char path[4096];
    void *dl;
    const PJRT_Api *api;
    PJRT_Client *client;
    struct device *devs;
    int ndevs;
    pthread_mutex_t mu;        /* guards exes and compile_s */
    struct exe exes[MAX_EXES];
    int nexes;
    double compile_s;
};

/* A model's step on one device: its tensors' shapes and device buffers. */
struct step {
    struct device *d;
    struct ps_step_net net;
    int nt;
    int64_t dims[MAX_TENSORS][4];
    int ndims[MAX_TENSORS];
    int64_t xdims[4];           /* one example's, after the batch */
    int xndims;
    size_t offset[MAX_TENSORS], count[MAX_TENSORS];
    PJRT_Buffer *params[MAX_TENSORS];
};

static pthread_mutex_t load_mu = PTHREAD_MUTEX_INITIALIZER;
static struct plugin *loaded;
static char load_err[512];

/* ---- Errors ------------------------------------------------------------ */

/* Logs e's whole message, puts "what: message" (its first line) into err,
 * frees e. The log line is at debug level when err carries the message on
 * to the caller (who reports it: workerd's one line), else a warning.
 * Returns 0 for no error, else PS_ENODEV. */
static int pjrt_fail(const PJRT_Api *api, PJRT_Error *e, const char *what,
                     char *err, size_t errlen)
{
    if (e == NULL)
        return 0;
    PJRT_Error_Message_Args m = {.struct_size = PJRT_Error_Message_Args_STRUCT_SIZE,
                                 .error = e};
    api->PJRT_Error_Message(&m);
    int n = (int)m.message_size;
    const char *nl = memchr(m.message, '\n', m.message_size);
    int first = nl != NULL ? (int)(nl - m.message) : n;
    PS_LOG(err != NULL ? PS_LOG_DEBUG : PS_LOG_WARN, "pjrt: %s: %.*s", what, n,
                 m.message);
    if (err != NULL && errlen > 0)
        snprintf(err, errlen, "%s: %.*s", what, first, m.message);
    PJRT_Error_Destroy_Args d = {.struct_size = PJRT_Error_Destroy_Args_STRUCT_SIZE,
                                 .error = e};
    api->PJRT_Error_Destroy(&d);
    return PS_ENODEV;
}

/* Waits for ev and frees it. */
static int await_event(const PJRT_Api *api, PJRT_Event *ev, const char *what,
                       char *err, size_t errlen)
{
    if (ev == NULL)
        return 0;
    PJRT_Event_Await_Args a = {.struct_size = PJRT_Event_Await_Args_STRUCT_SIZE,
                               .event = ev};
    int rc = pjrt_fail(api, api->PJRT_Event_Await(&a), what, err, errlen);
    PJRT_Event_Destroy_Args d = {.struct_size = PJRT_Event_Destroy_Args_STRUCT_SIZE,
                                 .event = ev};
    int rc2 = pjrt_fail(api, api->PJRT_Event_Destroy(&d), what, err, errlen);
    return rc != 0 ? rc : rc2;
}

static void buffer_destroy(const PJRT_Api *api, PJRT_Buffer *b)
{
    if (b == NULL)
        return;
    PJRT_Buffer_Destroy_Args a = {.struct_size = PJRT_Buffer_Destroy_Args_STRUCT_SIZE,
                                  .buffer = b};
    pjrt_fail(api, api->PJRT_Buffer_Destroy(&a), "PJRT_Buffer_Destroy", NULL, 0);
}

/* ---- Loading ----------------------------------------------------------- */

/* The last entry of PJRT_Api this file calls: a plugin whose table ends
 * before it is too old. */
#define LAST_USED PJRT_LoadedExecutable_Execute

static int check_api(const char *path, const PJRT_Api *api, char *err,
                     size_t errlen)
{
    int major = api->pjrt_api_version.major_version;
    int minor = api->pjrt_api_version.minor_version;
    if (major != PJRT_API_MAJOR)
        return ps_errf(PS_ENODEV, err, errlen,
                       "plugin %s speaks PJRT C API %d.%d; workerd needs major "
                       "version %d (it was built with %d.%d)", path, major, minor,
                       PJRT_API_MAJOR, PJRT_API_MAJOR, PJRT_API_MINOR);
    if (api->struct_size < offsetof(PJRT_Api, LAST_USED) + sizeof(void *))
        return ps_errf(PS_ENODEV, err, errlen,
                       "plugin %s (PJRT C API %d.%d) lacks functions workerd calls "
                       "(its table has %zu bytes, %zu needed)", path, major, minor,
                       api->struct_size, offsetof(PJRT_Api, LAST_USED) + sizeof(void *));
    return 0;
}

/* dlopen, GetPjrtApi, the version check. */
static int load_api(struct plugin *p, const char *path, char *err, size_t errlen)
{
    if (access(path, R_OK) != 0)
        return ps_errf(PS_ENODEV, err, errlen, "PJRT plugin %s: %s", path,
                       strerror(errno));
    p->dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (p->dl == NULL) {
        const char *why = dlerror();
        return ps_errf(PS_ENODEV, err, errlen, "%s is not a loadable PJRT plugin: %s",
                       path, why != NULL ? why : "dlopen failed");
    }
    const PJRT_Api *(*get)(void);
    *(void **)&get = dlsym(p->dl, "GetPjrtApi");
    if (get == NULL)
        return ps_errf(PS_ENODEV, err, errlen,
                       "%s is not a PJRT plugin: it exports no GetPjrtApi", path);
    p->api = get();
    if (p->api == NULL)
        return ps_errf(PS_ENODEV, err, errlen, "plugin %s: GetPjrtApi returned NULL",
                       path);
    return check_api(path, p->api, err, errlen);
}

/* PJRT_Plugin_Initialize, PJRT_Client_Create, the addressable devices. */
static int open_client(struct plugin *p, char *err, size_t errlen)
{
    const PJRT_Api *api = p->api;
    if (api->PJRT_Plugin_Initialize != NULL) {
        PJRT_Plugin_Initialize_Args a = {
            .struct_size = PJRT_Plugin_Initialize_Args_STRUCT_SIZE};
        if (pjrt_fail(api, api->PJRT_Plugin_Initialize(&a), "PJRT_Plugin_Initialize",
                      err, errlen) != 0)
            return PS_ENODEV;
    }
    PJRT_Client_Create_Args c = {.struct_size = PJRT_Client_Create_Args_STRUCT_SIZE};
    if (pjrt_fail(api, api->PJRT_Client_Create(&c), "PJRT_Client_Create", err,
                  errlen) != 0)
        return PS_ENODEV;
    p->client = c.client;
    PJRT_Client_PlatformName_Args pn = {
        .struct_size = PJRT_Client_PlatformName_Args_STRUCT_SIZE, .client = p->client};
    char platform[32] = "pjrt";
    if (pjrt_fail(api, api->PJRT_Client_PlatformName(&pn), "PJRT_Client_PlatformName",
                  NULL, 0) == 0)
        snprintf(platform, sizeof platform, "%.*s", (int)pn.platform_name_size,
                 pn.platform_name);
    PJRT_Client_AddressableDevices_Args d = {
        .struct_size = PJRT_Client_AddressableDevices_Args_STRUCT_SIZE,
        .client = p->client};
    if (pjrt_fail(api, api->PJRT_Client_AddressableDevices(&d),
                  "PJRT_Client_AddressableDevices", err, errlen) != 0)
        return PS_ENODEV;
    if (d.num_addressable_devices == 0)
        return ps_errf(PS_ENODEV, err, errlen,
                       "PJRT plugin %s (platform %s) has no addressable device",
                       p->path, platform);
    p->ndevs = d.num_addressable_devices > 64 ? 64 : (int)d.num_addressable_devices;
    p->devs = calloc((size_t)p->ndevs, sizeof *p->devs);
    if (p->devs == NULL)
        return ps_errf(-ENOMEM, err, errlen, "PJRT plugin %s: out of memory", p->path);
    for (int i = 0; i < p->ndevs; i++) {
        p->devs[i].p = p;
        p->devs[i].index = i;
        p->devs[i].dev = d.addressable_devices[i];
        snprintf(p->devs[i].name, sizeof p->devs[i].name, "pjrt-%s:%d", platform, i);
    }
    ps_log_info("pjrt: %s: PJRT C API %d.%d (workerd %d.%d), platform %s, "
                 "%d addressable device(s)", p->path, api->pjrt_api_version.major_version,
                 api->pjrt_api_version.minor_version, PJRT_API_MAJOR, PJRT_API_MINOR,
                 platform, p->ndevs);
    return 0;
}

int ps_pjrt_open(const char *path, char *err, size_t errlen)
{
    pthread_mutex_lock(&load_mu);
    int rc;
    if (loaded != NULL) {
        rc = strcmp(loaded->path, path) == 0
                 ? loaded->ndevs
                 : ps_errf(PS_ENODEV, err, errlen, "PJRT plugin %s is loaded; "
                           "one plugin per process (asked for %s)", loaded->path, path);
    } else if (load_err[0] != '\0') {
        rc = ps_errf(PS_ENODEV, err, errlen, "%s", load_err);
    } else {
        struct plugin *p = calloc(1, sizeof *p);
        if (p == NULL) {
            pthread_mutex_unlock(&load_mu);
            return ps_errf(-ENOMEM, err, errlen, "PJRT plugin: out of memory");
        }
        snprintf(p->path, sizeof p->path, "%s", path);
        pthread_mutex_init(&p->mu, NULL);
        rc = load_api(p, path, load_err, sizeof load_err);
        if (rc == 0)
            rc = open_client(p, load_err, sizeof load_err);
        if (rc == 0) {
            loaded = p;
            load_err[0] = '\0';
            rc = p->ndevs;
        } else {
            /* The plugin stays mapped: a half-initialized runtime may have
             * threads running in it. */
            ps_errf(rc, err, errlen, "%s", load_err);
            free(p->devs);
            free(p);
        }
    }
    pthread_mutex_unlock(&load_mu);
    return rc;
}

int ps_pjrt_plugin_path(const char *device, char *path, size_t pathlen,
                        char *err, size_t errlen)
{
    if (strncmp(device, "pjrt:", 5) == 0 && device[5] != '\0') {
        snprintf(path, pathlen, "%s", device + 5);
        return 0;
    }
    if (strcmp(device, "tpu") != 0)
        return ps_errf(PS_EINVAL_ARG, err, errlen,
                       "--device: '%s' is not cpu, cuda:N, tpu or pjrt:PATH", device);
    const char *env = getenv("TPU_LIBRARY_PATH");
    if (env != NULL && env[0] != '\0') {
        snprintf(path, pathlen, "%s", env);
        return 0;
    }
    /* Where pip puts the libtpu package: a virtualenv, the user's site,
     * the system's. PS_LIBTPU_SYSTEM_ONLY=1 (the systemd units set it)
     * skips the first two: a daemon loads code only from an explicit path
     * or from what root installed, never from a file its user could write. */
    char pats[4][512];
    const char *sys_only = getenv("PS_LIBTPU_SYSTEM_ONLY");
    bool system_only = sys_only != NULL && strcmp(sys_only, "1") == 0;
    const char *venv = system_only ? NULL : getenv("VIRTUAL_ENV");
    const char *home = system_only ? NULL : getenv("HOME");
    int n = 0;
    if (venv != NULL)
        snprintf(pats[n++], sizeof pats[0], "%s/lib/python3*/site-packages/libtpu/libtpu.so",
                 venv);
    if (home != NULL)
        snprintf(pats[n++], sizeof pats[0],
                 "%s/.local/lib/python3*/site-packages/libtpu/libtpu.so", home);
    snprintf(pats[n++], sizeof pats[0], "/usr/local/lib/python3*/dist-packages/libtpu/libtpu.so");
    snprintf(pats[n++], sizeof pats[0], "/usr/lib/python3*/*-packages/libtpu/libtpu.so");
    for (int i = 0; i < n; i++) {
        glob_t g;
        if (glob(pats[i], 0, NULL, &g) == 0 && g.gl_pathc > 0) {
            snprintf(path, pathlen, "%s", g.gl_pathv[g.gl_pathc - 1]);
            globfree(&g);
            return 0;
        }
        globfree(&g);
    }
    return ps_errf(PS_ENODEV, err, errlen,
                   system_only ? "no libtpu.so in the system's site-packages "
                                 "(PS_LIBTPU_SYSTEM_ONLY=1: not a virtualenv's or "
                                 "~/.local's; set TPU_LIBRARY_PATH)"
                               : "no libtpu.so (pip install libtpu, or set "
                                 "TPU_LIBRARY_PATH)");
}

/* ---- Compiling --------------------------------------------------------- */

/* xla.CompileOptionsProto: one replica, one partition, portable (so that
 * one executable runs on whichever device the call names). */
static int compile_options(uint8_t **out, size_t *len)
{
    Xla__ExecutableBuildOptionsProto bo = XLA__EXECUTABLE_BUILD_OPTIONS_PROTO__INIT;
    bo.device_ordinal = -1;
    bo.num_replicas = 1;
    bo.num_partitions = 1;
    Xla__CompileOptionsProto co = XLA__COMPILE_OPTIONS_PROTO__INIT;
    co.executable_build_options = &bo;
    co.compile_portable_executable = true;
    *len = xla__compile_options_proto__get_packed_size(&co);
    *out = malloc(*len > 0 ? *len : 1);
    if (*out == NULL)
        return -ENOMEM;
    xla__compile_options_proto__pack(&co, *out);
    return 0;
}

/* The executable for (widths, batch): from the cache, else compiled. Called
 * with p->mu held. */
static int get_exe(struct plugin *p, const struct step *s, int batch,
                   PJRT_LoadedExecutable **exe, char *err, size_t errlen)
{
    for (int i = 0; i < p->nexes; i++) {
        const struct exe *e = &p->exes[i];
        if (e->batch == batch && memcmp(&e->net, &s->net, sizeof s->net) == 0) {
            *exe = e->exe;
            return 0;
        }
    }
    const struct ps_step_net *n = &s->net;
    char *text = n->cnn ? ps_hlo_cnn_step(n->h, n->w, n->c, n->widths, n->widths[3], batch,
                                          err, errlen)
                        : ps_hlo_dense_step(n->widths, n->nwidths, batch, err, errlen);
    if (text == NULL)
        return PS_EINVAL_ARG;
    uint8_t *opts;
    size_t optlen;
    if (compile_options(&opts, &optlen) != 0) {
        free(text);
        return ps_errf(-ENOMEM, err, errlen, "compile options: out of memory");
    }
    PJRT_Program prog = {.struct_size = PJRT_Program_STRUCT_SIZE, .code = text,
                         .code_size = strlen(text), .format = "mlir", .format_size = 4};
    PJRT_Client_Compile_Args c = {.struct_size = PJRT_Client_Compile_Args_STRUCT_SIZE,
                                  .client = p->client, .program = &prog,
                                  .compile_options = (const char *)opts,
                                  .compile_options_size = optlen};
    double t0 = ps_now_s();
    int rc = pjrt_fail(p->api, p->api->PJRT_Client_Compile(&c), "PJRT_Client_Compile",
                       err, errlen);
    double dt = ps_now_s() - t0;
    free(opts);
    free(text);
    if (rc != 0)
        return rc;
    p->compile_s += dt;
    ps_log_info("pjrt: compiled the %s step for batch %d in %.3f s",
                n->cnn ? "CNN" : "dense", batch, dt);
    if (p->nexes == MAX_EXES) { /* full: drop the oldest */
        PJRT_LoadedExecutable_Destroy_Args d = {
            .struct_size = PJRT_LoadedExecutable_Destroy_Args_STRUCT_SIZE,
            .executable = p->exes[0].exe};
        pjrt_fail(p->api, p->api->PJRT_LoadedExecutable_Destroy(&d),
                  "PJRT_LoadedExecutable_Destroy", NULL, 0);
        memmove(&p->exes[0], &p->exes[1], (MAX_EXES - 1) * sizeof p->exes[0]);
        p->nexes--;
    }
    struct exe *e = &p->exes[p->nexes++];
    e->net = s->net;
    e->batch = batch;
    e->exe = c.executable;
    *exe = e->exe;
    return 0;
}

double ps_pjrt_compile_seconds(void)
{
    pthread_mutex_lock(&load_mu);
    struct plugin *p = loaded;
    pthread_mutex_unlock(&load_mu);
    if (p == NULL)
        return 0.0;
    pthread_mutex_lock(&p->mu);
    double s = p->compile_s;
    pthread_mutex_unlock(&p->mu);
    return s;
}

/* ---- Steps ------------------------------------------------------------- */

/* Host data (dims) -> a new buffer on d. */
static int to_device(struct device *d, const void *data, PJRT_Buffer_Type type,
                     const int64_t *dims, int ndims, PJRT_Buffer **out, char *err,
                     size_t errlen)
{
    const PJRT_Api *api = d->p->api;
    PJRT_Client_BufferFromHostBuffer_Args a = {
        .struct_size = PJRT_Client_BufferFromHostBuffer_Args_STRUCT_SIZE,
        .client = d->p->client, .data = data, .type = type, .dims = dims,
        .num_dims = (size_t)ndims,
        .host_buffer_semantics = PJRT_HostBufferSemantics_kImmutableOnlyDuringCall,
        .device = d->dev};
    int rc = pjrt_fail(api, api->PJRT_Client_BufferFromHostBuffer(&a),
                       "PJRT_Client_BufferFromHostBuffer", err, errlen);
    if (rc != 0)
        return rc;
    *out = a.buffer;
    return await_event(api, a.done_with_host_buffer, "host to device copy", err, errlen);
}

/* A buffer -> bytes of host memory at dst. */
static int to_host(struct device *d, PJRT_Buffer *b, void *dst, size_t bytes,
                   char *err, size_t errlen)
{
    const PJRT_Api *api = d->p->api;
    PJRT_Buffer_ToHostBuffer_Args a = {
        .struct_size = PJRT_Buffer_ToHostBuffer_Args_STRUCT_SIZE, .src = b, .dst = dst,
        .dst_size = bytes};
    int rc = pjrt_fail(api, api->PJRT_Buffer_ToHostBuffer(&a),
                       "PJRT_Buffer_ToHostBuffer", err, errlen);
    if (rc != 0)
        return rc;
    return await_event(api, a.event, "device to host copy", err, errlen);
}

/* Tensor t of the step: its shape. */
static void add_tensor(struct step *s, int ndims, const int64_t *dims)
{
    int t = s->nt++;
    s->ndims[t] = ndims;
    s->count[t] = 1;
    for (int i = 0; i < ndims; i++) {
        s->dims[t][i] = dims[i];
        s->count[t] *= (size_t)dims[i];
    }
    s->offset[t] = t == 0 ? 0 : s->offset[t - 1] + s->count[t - 1];
}

/* The tensors in model.h's block order: kernel then bias per layer. */
static void plan_tensors(struct step *s)
{
    const struct ps_step_net *n = &s->net;
    int dense0 = 0;
    if (n->cnn) {
        int64_t c[3] = {n->c, n->widths[0], n->widths[1]};
        for (int l = 0; l < 2; l++) {
            add_tensor(s, 4, (int64_t[]){3, 3, c[l], c[l + 1]});
            add_tensor(s, 1, (int64_t[]){c[l + 1]});
        }
        int64_t flat = (int64_t)(n->h / 4) * (n->w / 4) * n->widths[1];
        add_tensor(s, 2, (int64_t[]){flat, n->widths[2]});
        add_tensor(s, 1, (int64_t[]){n->widths[2]});
        dense0 = 2;
        s->xndims = 3;
        memcpy(s->xdims, (int64_t[]){n->h, n->w, n->c}, 3 * sizeof(int64_t));
    } else {
        s->xndims = 1;
        s->xdims[0] = n->widths[0];
    }
    for (int l = dense0; l + 1 < n->nwidths; l++) {
        add_tensor(s, 2, (int64_t[]){n->widths[l], n->widths[l + 1]});
        add_tensor(s, 1, (int64_t[]){n->widths[l + 1]});
    }
}

static void *pjrt_step_open(const struct ps_backend *be, const struct ps_step_net *net,
                            char *err, size_t errlen)
{
    if (net->nwidths < 2 || net->nwidths > PS_HLO_MAX_LAYERS + 1 ||
        (net->cnn && net->nwidths != 4)) {
        ps_errf(PS_EINVAL_ARG, err, errlen, "%s: a %s step of %d widths", be->name,
                net->cnn ? "CNN" : "dense", net->nwidths);
        return NULL;
    }
    struct step *s = calloc(1, sizeof *s);
    if (s == NULL) {
        ps_errf(-ENOMEM, err, errlen, "%s: out of memory", be->name);
        return NULL;
    }
    s->d = be->state;
    s->net = *net;
    plan_tensors(s);
    return s;
}

static void pjrt_step_close(void *h)
{
    struct step *s = h;
    if (s == NULL)
        return;
    for (int t = 0; t < s->nt; t++)
        buffer_destroy(s->d->p->api, s->params[t]);
    free(s);
}

static int pjrt_step_params(void *h, const float *params, char *err, size_t errlen)
{
    struct step *s = h;
    for (int t = 0; t < s->nt; t++) {
        buffer_destroy(s->d->p->api, s->params[t]);
        s->params[t] = NULL;
        int rc = to_device(s->d, params + s->offset[t], PJRT_Buffer_Type_F32,
                           s->dims[t], s->ndims[t], &s->params[t], err, errlen);
        if (rc != 0)
            return rc;
    }
    return 0;
}

/* Executes exe on the step's device with args; outputs into outs. */
static int execute(struct step *s, PJRT_LoadedExecutable *exe, PJRT_Buffer **args,
                   int nargs, PJRT_Buffer **outs, char *err, size_t errlen)
{
    const PJRT_Api *api = s->d->p->api;
    PJRT_ExecuteOptions opts = {.struct_size = PJRT_ExecuteOptions_STRUCT_SIZE};
    PJRT_Buffer *const *arglists[1] = {args};
    PJRT_Buffer **outlists[1] = {outs};
    PJRT_Event *done[1] = {NULL};
    PJRT_LoadedExecutable_Execute_Args a = {
        .struct_size = PJRT_LoadedExecutable_Execute_Args_STRUCT_SIZE,
        .executable = exe, .options = &opts, .argument_lists = arglists,
        .num_devices = 1, .num_args = (size_t)nargs, .output_lists = outlists,
        .device_complete_events = done, .execute_device = s->d->dev};
    int rc = pjrt_fail(api, api->PJRT_LoadedExecutable_Execute(&a),
                       "PJRT_LoadedExecutable_Execute", err, errlen);
    if (rc != 0)
        return rc;
    return await_event(api, done[0], "the step", err, errlen);
}

static int pjrt_step_run(void *h, const float *x, const int32_t *y, int batch,
                         float *grads, float *loss, char *err, size_t errlen)
{
    struct step *s = h;
    struct plugin *p = s->d->p;
    PJRT_LoadedExecutable *exe = NULL;
    pthread_mutex_lock(&p->mu);
    int rc = get_exe(p, s, batch, &exe, err, errlen);
    pthread_mutex_unlock(&p->mu);
    if (rc != 0)
        return rc;
    PJRT_Buffer *args[MAX_TENSORS + 2] = {0}, *outs[MAX_TENSORS + 1] = {0};
    memcpy(args, s->params, (size_t)s->nt * sizeof *args);
    int64_t xd[5] = {batch}, yd[1] = {batch};
    memcpy(xd + 1, s->xdims, (size_t)s->xndims * sizeof *xd);
    rc = to_device(s->d, x, PJRT_Buffer_Type_F32, xd, 1 + s->xndims, &args[s->nt], err,
                   errlen);
    if (rc == 0)
        rc = to_device(s->d, y, PJRT_Buffer_Type_S32, yd, 1, &args[s->nt + 1], err,
                       errlen);
    if (rc == 0)
        rc = execute(s, exe, args, s->nt + 2, outs, err, errlen);
    for (int t = 0; rc == 0 && t < s->nt; t++)
        rc = to_host(s->d, outs[t], grads + s->offset[t], s->count[t] * sizeof *grads,
                     err, errlen);
    float l = 0.0f;
    if (rc == 0)
        rc = to_host(s->d, outs[s->nt], &l, sizeof l, err, errlen);
    if (rc == 0 && loss != NULL)
        *loss = l;
    buffer_destroy(p->api, args[s->nt]);
    buffer_destroy(p->api, args[s->nt + 1]);
    for (int t = 0; t <= s->nt; t++)
        buffer_destroy(p->api, outs[t]);
    return rc;
}

/* ---- Host memory ------------------------------------------------------- */

static void *pjrt_alloc(const struct ps_backend *be, size_t bytes)
{
    (void)be;
    void *p = NULL;
    return posix_memalign(&p, 64, bytes) == 0 ? p : NULL;
}

static void pjrt_free(const struct ps_backend *be, void *p)
{
    (void)be;
    free(p);
}

static void pjrt_copy(const struct ps_backend *be, void *dst, const void *src,
                      size_t bytes)
{
    (void)be;
    memmove(dst, src, bytes);
}

static void pjrt_zero(const struct ps_backend *be, void *p, size_t bytes)
{
    (void)be;
    memset(p, 0, bytes);
}

static int pjrt_sync(const struct ps_backend *be, char *err, size_t errlen)
{
    (void)be;
    if (err != NULL && errlen > 0)
        err[0] = '\0';
    return 0;
}

const struct ps_backend *ps_backend_pjrt(const char *path, int device, char *err,
                                         size_t errlen)
{
    int n = ps_pjrt_open(path, err, errlen);
    if (n < 0)
        return NULL;
    if (device < 0 || device >= n) {
        ps_errf(PS_ENODEV, err, errlen, "PJRT device %d does not exist (%d devices)",
                device, n);
        return NULL;
    }
    struct device *d = &loaded->devs[device];
    pthread_mutex_lock(&load_mu);
    if (d->be.name == NULL) {
        d->be = ps_backend_cpu;
        d->be.name = d->name;
        d->be.host_memory = false;
        d->be.state = d;
        d->be.alloc = pjrt_alloc;
        d->be.free = pjrt_free;
        d->be.upload = pjrt_copy;
        d->be.download = pjrt_copy;
        d->be.zero = pjrt_zero;
        d->be.sync = pjrt_sync;
        d->be.step_open = pjrt_step_open;
        d->be.step_params = pjrt_step_params;
        d->be.step_run = pjrt_step_run;
        d->be.step_close = pjrt_step_close;
    }
    pthread_mutex_unlock(&load_mu);
    return &d->be;
}
