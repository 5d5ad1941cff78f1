/*
 * proc.c - the daemons' command-line prologue and epilogue and their
 * control loop (proc.h).
 *
 * Why a libuv loop on the main thread: the daemons' main threads used to
 * sit in sigwait(); a loop gives the same wait plus timers, so periodic
 * process-level work does not need a thread of its own. Only the main
 * thread ever takes the three signals (they are blocked everywhere else
 * and outside ps_proc_loop_run), as with sigwait: no other thread sees a
 * system call interrupted by them.
 */
#include "common/proc.h"

#include "common/errors.h"
#include "common/fsutil.h"
#include "common/log.h"
#include "common/notify.h"
#include "common/tls.h"
#include "ps_config.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <uv.h>

const char *const ps_proc_log_levels[] = {"error", "warn", "info", "debug",
                                           NULL};
const char *const ps_proc_log_formats[] = {"text", "json", NULL};

int ps_proc_prologue(const ps_proc_cmd *cmd, int argc, char **argv)
{
    char err[1024];
    int first = argc;
    int rc = ps_conf_load_env(cmd->opts, cmd->conf, argc, argv, cmd->env_prefix,
                              &first, err, sizeof err);
    if (rc == PS_CONF_HELP) {
        ps_conf_usage_env(cmd->opts, cmd->name, cmd->usage, cmd->env_prefix, stdout);
        printf("\nExit status: 0 done; 1 a runtime failure; 2 a bad option, "
               "environment variable\nor config file (one line on stderr).\n");
        ps_conf_free(cmd->opts, cmd->conf);
        return 0;
    }
    if (rc == PS_CONF_VERSION) {
        printf("%s %s\n", cmd->name, PS_VERSION);
        ps_conf_free(cmd->opts, cmd->conf);
        return 0;
    }
    if (rc != 0)
        return ps_proc_quit(cmd, 2, "%s", err);
    if (first < argc)
        return ps_proc_quit(cmd, 2, "unexpected argument '%s'", argv[first]);
    if (cmd->log_format != NULL)
        ps_log_set_format((enum ps_log_format)*cmd->log_format);
    if (cmd->log_level != NULL)
        ps_log_init(argv[0], (enum ps_log_level)*cmd->log_level);
    return PS_PROC_RUN;
}

int ps_proc_quit(const ps_proc_cmd *cmd, int status, const char *fmt, ...)
{
    char line[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fprintf(stderr, "%s: %s\n", cmd->name, line);
    ps_conf_free(cmd->opts, cmd->conf);
    return status;
}

int ps_proc_lock_dir(const ps_proc_cmd *cmd, const char *flag, const char *dir)
{
    pid_t holder = 0;
    int fd = ps_dir_lock(dir, "LOCK", &holder);
    if (fd >= 0)
        return PS_PROC_RUN; /* held until exit: the descriptor stays open */
    if (fd == -EWOULDBLOCK && holder > 0)
        return ps_proc_quit(cmd, 1, "%s %s is in use by pid %ld (it holds %s/LOCK)",
                            flag, dir, (long)holder, dir);
    if (fd == -EWOULDBLOCK)
        return ps_proc_quit(cmd, 1, "%s %s is in use by another process (it holds "
                            "%s/LOCK)", flag, dir, dir);
    return ps_proc_quit(cmd, 1, "%s %s: cannot lock %s/LOCK: %s", flag, dir, dir,
                        ps_strerror(fd));
}

void ps_proc_announce(int port)
{
    printf("PORT %d\n", port);
    fflush(stdout);
}

int ps_proc_epilogue(const ps_proc_cmd *cmd, ps_proc_loop *loop, int status)
{
    ps_proc_loop_destroy(loop);
    ps_conf_free(cmd->opts, cmd->conf);
    return status;
}

/* ---- the control loop -------------------------------------------------- */

static const int loop_signals[] = {SIGINT, SIGTERM, SIGHUP};
#define NSIGNALS (sizeof loop_signals / sizeof loop_signals[0])

struct timer {
    uv_timer_t handle; /* first: the close callback frees the struct */
    struct timer *next;
    void (*fn)(void *ctx);
    void *ctx;
};

struct ps_proc_loop {
    uv_loop_t loop;
    uv_signal_t sig[NSIGNALS];
    int nsig;        /* handles initialized, to close */
    int closing;     /* close callbacks still to come */
    int got;         /* the signal that stopped the loop */
    struct timer *timers;
    void (*on_hup)(void *ctx); /* SIGHUP runs this instead of stopping */
    void *hup_ctx;
};

static void mask_signals(int how)
{
    sigset_t set;
    sigemptyset(&set);
    for (size_t i = 0; i < NSIGNALS; i++)
        sigaddset(&set, loop_signals[i]);
    pthread_sigmask(how, &set, NULL);
}

/* The only thing a signal does: stop the loop (STYLE.md, Daemons), or for
 * SIGHUP have the TLS certificates re-read at the next handshake (tls.h)
 * and, with a reload set, run it (the token file, say). libuv calls this
 * from the loop, not from the signal handler, so the reload may do anything
 * the loop may. */
static void on_signal(uv_signal_t *h, int signum)
{
    ps_proc_loop *l = h->data;
    if (signum == SIGHUP) {
        ps_tls_reload();
        ps_log_info("SIGHUP: TLS certificates are read again at the next "
                    "handshake");
        if (l->on_hup != NULL)
            l->on_hup(l->hup_ctx);
        return;
    }
    l->got = signum;
    uv_stop(&l->loop);
}

void ps_proc_loop_on_hup(ps_proc_loop *l, void (*fn)(void *ctx), void *ctx)
{
    l->on_hup = fn;
    l->hup_ctx = ctx;
}

static void on_timer(uv_timer_t *h)
{
    struct timer *t = (struct timer *)h;
    t->fn(t->ctx);
}

int ps_proc_loop_create(ps_proc_loop **out)
{
    mask_signals(SIG_BLOCK);
    signal(SIGPIPE, SIG_IGN);
    /* A write past RLIMIT_FSIZE fails with EFBIG, which the store and the
     * segment files answer as a full disk, instead of killing the daemon. */
    signal(SIGXFSZ, SIG_IGN);
    ps_proc_loop *l = calloc(1, sizeof *l);
    if (l == NULL)
        return -ENOMEM;
    int rc = uv_loop_init(&l->loop);
    if (rc != 0) {
        free(l);
        return rc;
    }
    l->loop.data = l;
    for (size_t i = 0; i < NSIGNALS && rc == 0; i++) {
        rc = uv_signal_init(&l->loop, &l->sig[i]);
        if (rc != 0)
            break;
        l->nsig++;
        l->sig[i].data = l;
        rc = uv_signal_start(&l->sig[i], on_signal, loop_signals[i]);
    }
    if (rc != 0) {
        ps_proc_loop_destroy(l);
        return rc;
    }
    *out = l;
    return 0;
}

int ps_proc_loop_every(ps_proc_loop *l, int64_t period_ms,
                       void (*fn)(void *ctx), void *ctx)
{
    if (period_ms < 1)
        return PS_EINVAL_ARG;
    struct timer *t = calloc(1, sizeof *t);
    if (t == NULL)
        return -ENOMEM;
    uv_timer_init(&l->loop, &t->handle);
    t->fn = fn;
    t->ctx = ctx;
    t->next = l->timers;
    l->timers = t;
    uv_timer_start(&t->handle, on_timer, (uint64_t)period_ms,
                   (uint64_t)period_ms);
    return 0;
}

static void send_keepalive(void *ctx)
{
    (void)ctx;
    ps_notify_watchdog();
}

int ps_proc_loop_keepalive(ps_proc_loop *l)
{
    int64_t period = ps_notify_keepalive_ms();
    if (period == 0)
        return 0;
    return ps_proc_loop_every(l, period, send_keepalive, NULL);
}

int ps_proc_loop_run(ps_proc_loop *l)
{
    l->got = 0;
    /* The timers count from now, not from when they were added. */
    uv_update_time(&l->loop);
    for (struct timer *t = l->timers; t != NULL; t = t->next)
        uv_timer_again(&t->handle);
    mask_signals(SIG_UNBLOCK);
    while (l->got == 0)
        uv_run(&l->loop, UV_RUN_DEFAULT);
    mask_signals(SIG_BLOCK);
    ps_notify_stopping("shutting down (signal %d)", l->got);
    return l->got;
}

static void on_timer_closed(uv_handle_t *h)
{
    struct timer *t = (struct timer *)h;
    ps_proc_loop *l = h->loop->data;
    l->closing--;
    free(t);
}

static void on_signal_closed(uv_handle_t *h)
{
    ps_proc_loop *l = h->loop->data;
    l->closing--;
}

void ps_proc_loop_destroy(ps_proc_loop *l)
{
    if (l == NULL)
        return;
    for (struct timer *t = l->timers, *next; t != NULL; t = next) {
        next = t->next;
        l->closing++;
        uv_close((uv_handle_t *)&t->handle, on_timer_closed);
    }
    l->timers = NULL;
    for (int i = 0; i < l->nsig; i++) {
        l->closing++;
        uv_close((uv_handle_t *)&l->sig[i], on_signal_closed);
    }
    while (l->closing > 0)
        uv_run(&l->loop, UV_RUN_ONCE);
    if (uv_loop_close(&l->loop) != 0)
        ps_log_warn("proc: the control loop still had handles at close");
    free(l);
}
