/*
 * daemon.h - the options psd and pscoord both serve with: the /metrics
 * endpoint, TLS, the token table checked on every call, the token the
 * daemon sends when it calls another, and logging. One struct embedded in
 * each daemon's config and one run of option rows spliced into each table,
 * so that the two daemons take these flags alike.
 *
 * Threads and lifetime: plain data, filled by ps_conf_load in main at
 * start-up and freed with the rest of the daemon's config.
 */
#ifndef PS_DAEMON_H
#define PS_DAEMON_H

#include "common/auth.h"
#include "common/conf.h"
#include "common/metrics_http.h"
#include "common/proc.h"
#include "common/tls.h"

#include <stddef.h>

typedef struct ps_daemon_conf {
    char *metrics_listen;
    ps_metrics_http_conf metrics_http;
    ps_tls_conf tls;
    char *tokens;
    char *token_file;
    int log_level;
    int log_format;
} ps_daemon_conf;

/* The rows of a ps_daemon_conf MEMBER of the config TYPE. /metrics: plain
 * HTTP without auth by default, as Prometheus scrapes. TLS: none by
 * default, so the daemon serves loopback only (ps_tls_check_listen).
 * TOKEN_FILE_HELP says whom --token-file's token is sent to. */
#define PS_DAEMON_OPTS(TYPE, MEMBER, TOKEN_FILE_HELP)                                   \
    PS_METRICS_LISTEN_OPT(TYPE, MEMBER.metrics_listen),                                 \
    PS_METRICS_HTTP_OPTS(TYPE, MEMBER.metrics_http),                                    \
    PS_TLS_SERVER_OPTS(TYPE, MEMBER.tls),                                               \
    PS_TOKENS_OPT(TYPE, MEMBER.tokens),                                                 \
    {"token-file", PS_OPT_STRING, offsetof(TYPE, MEMBER.token_file), NULL,              \
     TOKEN_FILE_HELP, 0, 0, NULL},                                                      \
    {"log-level", PS_OPT_ENUM, offsetof(TYPE, MEMBER.log_level), PS_PROC_LOG_DEFAULT,   \
     "error, warn, info or debug", 0, 0, ps_proc_log_levels},                           \
    {"log-format", PS_OPT_ENUM, offsetof(TYPE, MEMBER.log_format), "text",              \
     PS_PROC_LOG_FORMAT_HELP, 0, 0, ps_proc_log_formats}

/* The command line of a daemon whose config conf (filled from opts)
 * embeds dc: its logging starts at dc's --log-level and --log-format. */
static inline ps_proc_cmd ps_daemon_cmd(const char *name, const char *usage,
                                        const ps_opt *opts, void *conf,
                                        const ps_daemon_conf *dc,
                                        const char *env_prefix)
{
    return (ps_proc_cmd){.name = name, .usage = usage, .opts = opts, .conf = conf,
                         .log_level = &dc->log_level, .log_format = &dc->log_format,
                         .env_prefix = env_prefix};
}

/* --tokens (the table every call is checked against, for a server on
 * listen) into *auth, and --token-file (what the daemon sends) into token
 * ("" without one). Called once in main before serving. Returns
 * PS_PROC_RUN; or 2 after one line "--tokens: ..." or "--token-file: ..."
 * naming the file (and line), with the configuration freed (ps_proc_quit)
 * and *auth NULL. */
int ps_daemon_load_tokens(const ps_proc_cmd *cmd, const ps_daemon_conf *dc,
                          const char *listen, ps_auth **auth, char *token,
                          size_t tokenlen);

#endif
