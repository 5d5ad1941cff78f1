/*
 * cmd_top.c - psctl top: a live view of a job from its coordinator.
 *
 * Each frame is one GetCluster: a header line (job, generation, live and total
 * workers, global step), the job's last checkpoint, then one row per task:
 * its state, step, steps/s, lag behind the global step, examples/s, loss and
 * (for the evaluator) test accuracy, and the age of its last heartbeat.
 *
 * The step rate is the difference between two frames' steps over the time
 * between the heartbeats that carried them: the coordinator says how old
 * each task's last heartbeat is, so a frame that lands just before or just
 * after a heartbeat does not make the figure jump. The first frame has no
 * rate ("-"), nor has a task whose incarnation changed.
 *
 * --once prints one frame as plain text and exits. Otherwise a frame every
 * --interval: on a terminal each is drawn over the last (cursor home, every
 * line cleared to its end, the rest of the screen cleared), elsewhere the
 * frames follow each other, a blank line between two. Ctrl-C (or q, when
 * stdin and stdout are a terminal) ends it with status 0. A coordinator that
 * cannot be reached at the start is one line on stderr and status 1; one
 * lost later is a status line under the last frame, and each tick tries
 * again with a fresh connection (so gRPC's reconnect backoff does not keep
 * the view dark after the coordinator is back).
 */
#include "tools/psctl.h"

#include "common/clock.h"

#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

struct top_cfg {
    char *coordinator;
    int64_t timeout_ms;
    bool once;
    int64_t interval_ms;
    int output;
};

static const ps_opt top_opts[] = {
    COORD_OPTS(struct top_cfg, "deadline of each call (default: 10s; a live frame waits "
                               "at most 3s)"),
    {"once", PS_OPT_BOOL, offsetof(struct top_cfg, once), "false",
     "print one frame as plain text and exit", 0, 0, NULL},
    /* 1 s: the coordinator hears from each task twice a second by default,
     * so every frame shows new figures without flooding a terminal. */
    {"interval", PS_OPT_DURATION_MS, offsetof(struct top_cfg, interval_ms), "1s",
     "time between frames", 100, 3600000, NULL},
    OUTPUT_OPT(struct top_cfg),
    {0},
};

/* What the last frame saw of a task, for its step rate. */
struct seen {
    Ps__V1__Role role;
    uint32_t index;
    uint64_t incarnation;
    uint64_t step;
    double step_at; /* when the heartbeat that carried step arrived (s) */
    double rate;    /* steps/s; < 0 when there is none yet */
};

struct top {
    const struct command *cmd;
    const struct top_cfg *cfg;
    struct session s;
    bool tty;             /* stdout is a terminal: draw over the last frame */
    bool keys;            /* stdin too: q quits */
    struct termios saved; /* stdin's settings while keys */
    struct seen *seen;    /* the last frame's tasks */
    size_t nseen;
    int frames;           /* drawn so far */
    char *last;           /* the last frame drawn (for the lost status) */
    double lost_since;    /* >= 0 while the coordinator does not answer */
};

static volatile sig_atomic_t top_stop;

static void on_stop_signal(int sig)
{
    (void)sig;
    top_stop = 1;
}

static double now_s(void)
{
    return (double)ps_now_ms() / 1000.0;
}

/* ---- one frame --------------------------------------------------------- */

/* "0.4s", "12s", "3m07s", "2h05m", "3d04h"; "-" for a negative age. */
static const char *short_age(double s, char *buf, size_t len)
{
    uint64_t n = s >= 0 ? (uint64_t)s : 0;
    if (s < 0)
        snprintf(buf, len, "-");
    else if (s < 10)
        snprintf(buf, len, "%.1fs", s);
    else if (n < 60)
        snprintf(buf, len, "%" PRIu64 "s", n);
    else if (n < 3600)
        snprintf(buf, len, "%" PRIu64 "m%02" PRIu64 "s", n / 60, n % 60);
    else if (n < 86400)
        snprintf(buf, len, "%" PRIu64 "h%02" PRIu64 "m", n / 3600,
                 n / 60 % 60);
    else
        snprintf(buf, len, "%" PRIu64 "d%02" PRIu64 "h", n / 86400,
                 n / 3600 % 24);
    return buf;
}

/* "alive", "missed:N" (alive, but N heartbeats overdue by its age), "dead",
 * "unseen" (never registered), "unknown" (registered before the
 * coordinator restarted, not heard from since). One word, for scripts. */
static const char *state_word(const Ps__V1__TaskInfo *t, uint32_t hb_ms,
                              char *buf, size_t len)
{
    if (t->incarnation == 0)
        return "unseen";
    if (!t->alive)
        return t->last_heartbeat_age_seconds < 0 ? "unknown" : "dead";
    /* Half a period of slack: a heartbeat a little late is not missed. */
    double missed = hb_ms > 0
        ? t->last_heartbeat_age_seconds * 1000.0 / hb_ms - 0.5 : 0;
    if (missed < 1)
        return "alive";
    snprintf(buf, len, "missed:%d", (int)missed);
    return buf;
}

/* The task's steps/s from the last frame's sight of it; records this one in
 * *out. now is when this frame's answer arrived. */
static double step_rate(const struct top *t, const Ps__V1__TaskInfo *ti,
                        double now, struct seen *out)
{
    *out = (struct seen){.role = ti->role, .index = ti->index,
                         .incarnation = ti->incarnation, .step = ti->step,
                         .step_at = now - ti->last_heartbeat_age_seconds,
                         .rate = -1};
    if (!ti->alive || ti->last_heartbeat_age_seconds < 0)
        return -1;
    const struct seen *p = NULL;
    for (size_t i = 0; i < t->nseen && p == NULL; i++)
        if (t->seen[i].role == ti->role && t->seen[i].index == ti->index)
            p = &t->seen[i];
    if (p == NULL || p->incarnation != ti->incarnation || ti->step < p->step)
        return -1;
    double dt = out->step_at - p->step_at;
    if (dt < 0.05 && ti->step == p->step) {
        /* The same heartbeat as last frame: keep its time and its rate. */
        out->step_at = p->step_at;
        out->rate = p->rate;
    } else if (dt >= 0.05) {
        out->rate = (double)(ti->step - p->step) / dt;
    }
    return out->rate;
}

/* One task's row. Figures a role does not have are "-": a ps reports no
 * step; an evaluator shows its own last evaluation's loss and accuracy,
 * at the job's latest evaluation step when it is the one that reported
 * last. */
static void print_task(FILE *f, const Ps__V1__ClusterState *c,
                       const Ps__V1__TaskInfo *ti, double rate)
{
    char state[32], step[32] = "-", rs[32] = "-", lag[32] = "-", eps[32] = "-",
         loss[32] = "-", acc[32] = "-", age[32];
    bool heard = ti->incarnation > 0 && ti->last_heartbeat_age_seconds >= 0;
    bool trains = ti->role == PS__V1__ROLE__WORKER ||
                  ti->role == PS__V1__ROLE__CHIEF;
    if (trains && heard) {
        snprintf(step, sizeof step, "%" PRIu64, ti->step);
        if (rate >= 0)
            snprintf(rs, sizeof rs, "%.1f", rate);
        /* Signed: the global step is the workers' lower median, so a worker
         * ahead of it has a negative lag. */
        snprintf(lag, sizeof lag, "%" PRId64, (int64_t)(c->global_step - ti->step));
        snprintf(eps, sizeof eps, "%.0f", ti->examples_per_second);
        snprintf(loss, sizeof loss, "%.4f", ti->loss);
    }
    bool evaluated = c->eval_step > 0 || c->eval_accuracy != 0;
    bool own = ti->accuracy != 0 || ti->loss != 0;
    if (ti->role == PS__V1__ROLE__EVALUATOR && evaluated && own) {
        if (ti->accuracy == c->eval_accuracy && ti->loss == c->eval_loss)
            snprintf(step, sizeof step, "%" PRIu64, c->eval_step);
        snprintf(loss, sizeof loss, "%.4f", ti->loss);
        snprintf(acc, sizeof acc, "%.4f", ti->accuracy);
    }
    fprintf(f, "%-9s %3u %-9s %9s %8s %6s %10s %8s %8s %9s\n",
            role_label(ti->role), ti->index,
            state_word(ti, c->heartbeat_interval_ms, state, sizeof state),
            step, rs, lag, eps, loss, acc,
            heard ? short_age(ti->last_heartbeat_age_seconds, age, sizeof age)
                  : "-");
}

/* The frame of c (malloc'd text, or NULL when out of memory), and the
 * tasks' sightings for the next frame's rates. */
static char *render(struct top *t, const Ps__V1__ClusterState *c, double now)
{
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    struct seen *seen = calloc(c->n_tasks > 0 ? c->n_tasks : 1, sizeof *seen);
    if (f == NULL || seen == NULL) {
        if (f != NULL)
            fclose(f);
        free(text);
        free(seen);
        return NULL;
    }
    char when[16], age[32];
    time_t wall = time(NULL);
    struct tm tm;
    strftime(when, sizeof when, "%H:%M:%S", localtime_r(&wall, &tm));
    fprintf(f, "job %s  generation %" PRIu64 "  workers %u/%u live  global step "
            "%" PRIu64 "  pscoord %s  %s\n", c->job_id, c->generation,
            c->live_workers, c->num_workers, c->global_step, t->s.target,
            when);
    if (c->last_checkpoint_step == 0)
        fprintf(f, "checkpoint none\n");
    else if (c->last_checkpoint_age_seconds < 0)
        fprintf(f, "checkpoint step %" PRIu64 ", %s\n",
                c->last_checkpoint_step, c->last_checkpoint_path);
    else
        fprintf(f, "checkpoint step %" PRIu64 ", %s ago, %s\n",
                c->last_checkpoint_step,
                short_age(c->last_checkpoint_age_seconds, age, sizeof age),
                c->last_checkpoint_path);
    fprintf(f, "%-9s %3s %-9s %9s %8s %6s %10s %8s %8s %9s\n", "ROLE", "IDX",
            "STATE", "STEP", "STEPS/S", "LAG", "EXAMPLES/S", "LOSS",
            "ACCURACY", "HEARTBEAT");
    for (size_t i = 0; i < c->n_tasks; i++)
        print_task(f, c, c->tasks[i], step_rate(t, c->tasks[i], now, &seen[i]));
    fclose(f);
    free(t->seen);
    t->seen = seen;
    t->nseen = c->n_tasks;
    return text;
}

/* ---- drawing ----------------------------------------------------------- */

/* Shows frame (and status, a line or NULL): over the last frame on a
 * terminal, else after a blank line. */
static void draw(struct top *t, const char *frame, const char *status)
{
    if (!t->tty) {
        printf("%s%s%s%s", t->frames > 0 ? "\n" : "", frame != NULL ? frame
               : "", status != NULL ? status : "", status != NULL ? "\n" : "");
    } else {
        /* Home; each line cleared to its end as it is written; then the
         * rest of the screen: no flicker, nothing left of a longer frame. */
        fputs("\033[H", stdout);
        for (const char *p = frame; p != NULL && *p != '\0';) {
            size_t n = strcspn(p, "\n");
            printf("%.*s\033[K\n", (int)n, p);
            p += n + (p[n] == '\n');
        }
        if (status != NULL)
            printf("%s\033[K\n", status);
        printf("%s\033[J", t->keys ? "q or Ctrl-C quits" : "Ctrl-C quits");
    }
    fflush(stdout);
    t->frames++;
}

/* The coordinator did not answer this tick: a status line (under the last
 * frame on a terminal; once per outage elsewhere), and a fresh client for
 * the next try. */
static void lost(struct top *t, ps_rpc_status *st, double now)
{
    bool first = t->lost_since < 0;
    if (first)
        t->lost_since = now;
    for (char *p = st->message; *p != '\0'; p++)
        if (*p == '\n' || *p == '\r')
            *p = ' ';
    char line[768], age[32];
    snprintf(line, sizeof line, "pscoord at %s: %s: %s; retrying every %gs "
             "(lost %s ago)", t->s.target, ps_rpc_code_name(st->code),
             st->message[0] != '\0' ? st->message : "(no message)",
             (double)t->cfg->interval_ms / 1000.0,
             short_age(now - t->lost_since, age, sizeof age));
    if (t->tty)
        draw(t, t->last, line);
    else if (first)
        draw(t, NULL, line);
    ps_rpc_client *fresh;
    ps_rpc_client_opts o = {.deadline_ms = t->s.timeout_ms,
                            .max_attempts = 1, .token = psctl_global.token};
    if (ps_rpc_client_create(t->s.target, &o, &fresh) == 0) {
        ps_rpc_client_destroy(t->s.client);
        t->s.client = fresh;
    }
}

/* One tick of the live view: a call, then a frame or a status line. */
static void tick(struct top *t)
{
    Ps__V1__GetClusterRequest req = PS__V1__GET_CLUSTER_REQUEST__INIT;
    ps_rpc_status st;
    void *resp;
    if (ps_rpc_invoke_pb(t->s.client, COORD_METHOD("GetCluster"), &req,
                         &ps__v1__cluster_state__descriptor, &resp,
                         probe_ms(&t->s), &st) != 0) {
        lost(t, &st, now_s());
        return;
    }
    t->lost_since = -1;
    char *frame = render(t, resp, now_s());
    protobuf_c_message_free_unpacked(resp, NULL);
    if (frame == NULL)
        return; /* out of memory: the next tick tries again */
    draw(t, frame, NULL);
    free(t->last);
    t->last = frame;
}

/* ---- the live loop ----------------------------------------------------- */

/* With stdin and stdout a terminal: keys arrive one by one, unechoed. */
static void keys_on(struct top *t)
{
    t->keys = t->tty && isatty(STDIN_FILENO) &&
              tcgetattr(STDIN_FILENO, &t->saved) == 0;
    if (!t->keys)
        return;
    struct termios raw = t->saved;
    raw.c_lflag &= ~(tcflag_t)(ICANON | ECHO);
    raw.c_cc[VMIN] = 0;
    raw.c_cc[VTIME] = 0;
    if (tcsetattr(STDIN_FILENO, TCSANOW, &raw) != 0)
        t->keys = false;
}

static void keys_off(struct top *t)
{
    if (t->keys)
        tcsetattr(STDIN_FILENO, TCSANOW, &t->saved);
    t->keys = false;
}

/* Waits until the monotonic time `until` (s), in slices so that a signal
 * delivered to another thread is seen within 100 ms. Sets top_stop on q. */
static void wait_until(struct top *t, double until)
{
    for (double now = now_s(); !top_stop && now < until; now = now_s()) {
        int ms = (int)((until - now) * 1000.0) + 1;
        struct pollfd pfd = {.fd = STDIN_FILENO, .events = POLLIN};
        int n = poll(&pfd, t->keys ? 1 : 0, ms < 100 ? ms : 100);
        char ch;
        if (n > 0 && read(STDIN_FILENO, &ch, 1) == 1 &&
            (ch == 'q' || ch == 'Q'))
            top_stop = 1;
    }
}

static int run_live(struct top *t)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop_signal; /* no SA_RESTART: poll returns early */
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    keys_on(t);
    if (t->tty)
        fputs("\033[H\033[2J", stdout);
    double start = now_s(), period = (double)t->cfg->interval_ms / 1000.0;
    for (uint64_t k = 1; !top_stop; k++) {
        tick(t);
        double now = now_s();
        /* A fixed cadence; ticks that a slow call overran are skipped. */
        if (start + (double)k * period < now)
            k = (uint64_t)((now - start) / period) + 1;
        wait_until(t, start + (double)k * period);
    }
    keys_off(t);
    if (t->tty)
        printf("\n");
    fflush(stdout);
    return EXIT_OK;
}

int cmd_top(const struct command *self, int argc, char **argv)
{
    struct top_cfg cfg;
    memset(&cfg, 0, sizeof cfg);
    struct top t;
    memset(&t, 0, sizeof t);
    t.cmd = self;
    t.cfg = &cfg;
    t.lost_since = -1;
    int npos;
    int rc = parse_command(self, top_opts, &cfg, argc, argv, "", 0, 0, NULL,
                           &npos);
    if (rc >= 0)
        goto out;
    if (!cfg.once && cfg.output == OUTPUT_JSON) {
        fprintf(stderr, "psctl: top: -o json needs --once (a live view is for "
                "people)\n");
        rc = EXIT_USAGE;
        goto out;
    }
    rc = session_open_at(
        &t.s, self, "pscoord", "--coordinator",
        coordinator_target(cfg.coordinator),
        (int)(cfg.timeout_ms > 0 ? cfg.timeout_ms : psctl_global.timeout_ms));
    if (rc >= 0)
        goto out;
    if ((rc = session_probe(&t.s)) >= 0)
        goto close;
    t.tty = !cfg.once && isatty(STDOUT_FILENO);
    if (!cfg.once) {
        rc = run_live(&t);
        goto close;
    }
    Ps__V1__GetClusterRequest req = PS__V1__GET_CLUSTER_REQUEST__INIT;
    void *resp;
    rc = session_call(&t.s, COORD_METHOD("GetCluster"), &req,
                      &ps__v1__cluster_state__descriptor, &resp);
    if (rc == 0 && cfg.output == OUTPUT_JSON) {
        rc = pbjson_print(self, cluster_json(resp));
        protobuf_c_message_free_unpacked(resp, NULL);
    } else if (rc == 0) {
        char *frame = render(&t, resp, now_s());
        protobuf_c_message_free_unpacked(resp, NULL);
        if (frame == NULL) {
            fprintf(stderr, "psctl: top: out of memory\n");
            rc = EXIT_FAIL;
        } else {
            fputs(frame, stdout);
            free(frame);
        }
    }
close:
    session_close(&t.s);
    free(t.seen);
    free(t.last);
out:
    ps_conf_free(top_opts, &cfg);
    return rc;
}
