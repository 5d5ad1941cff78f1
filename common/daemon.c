/*
 * daemon.c - the token files of psd and pscoord (daemon.h).
 */
#include "common/daemon.h"

int ps_daemon_load_tokens(const ps_proc_cmd *cmd, const ps_daemon_conf *dc,
                          const char *listen, ps_auth **auth, char *token,
                          size_t tokenlen)
{
    char err[600];
    token[0] = '\0';
    if (ps_auth_server_setup(dc->tokens, listen, auth, err, sizeof err) != 0)
        return ps_proc_quit(cmd, 2, "--tokens: %s", err);
    if (dc->token_file != NULL && dc->token_file[0] != '\0' &&
        ps_auth_read_token(dc->token_file, token, tokenlen, err, sizeof err) != 0) {
        ps_auth_destroy(*auth);
        *auth = NULL;
        return ps_proc_quit(cmd, 2, "--token-file: %s", err);
    }
    return PS_PROC_RUN;
}
