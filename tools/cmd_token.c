/*
 * cmd_token.c - psctl token: a fresh token for a --tokens file and the
 * --token-file of a client (see common/auth.h and doc/security.md, "Tokens
 * and roles").
 */
#include "tools/psctl.h"

#include "common/auth.h"
#include "common/sha256.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>

/* 32 random bytes: 256 bits, as base64url without padding (43 characters,
 * none that a shell or an HTTP header would mangle). */
static int make_token(char out[44])
{
    static const char b64[] =
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    unsigned char raw[33] = {0};
    if (getrandom(raw, 32, 0) != 32)
        return -errno;
    int k = 0;
    for (int i = 0; i < 33; i += 3) {
        unsigned v = (unsigned)raw[i] << 16 | (unsigned)raw[i + 1] << 8 | raw[i + 2];
        for (int j = 0; j < 4 && k < 43; j++)
            out[k++] = b64[(v >> (18 - 6 * j)) & 63];
    }
    out[43] = '\0';
    explicit_bzero(raw, sizeof raw);
    return 0;
}

struct token_cfg {
    bool hash;
};

static const ps_opt token_opts[] = {
    {"hash", PS_OPT_BOOL, offsetof(struct token_cfg, hash), "false",
     "also print the line 'ROLE sha256:HEX' on stderr, for a server's "
     "--tokens file that should not hold the token itself", 0, 0, NULL},
    {0},
};

int cmd_token(const struct command *self, int argc, char **argv)
{
    struct token_cfg cfg = {0};
    char *pos[1];
    int npos;
    int rc = parse_command(self, token_opts, &cfg, argc, argv, "ROLE", 1, 1,
                           pos, &npos);
    if (rc >= 0)
        return rc;
    if (strcmp(pos[0], "reader") != 0 && strcmp(pos[0], "worker") != 0 &&
        strcmp(pos[0], "operator") != 0) {
        fprintf(stderr, "psctl: token: role '%s' is not reader, worker or "
                "operator\n", pos[0]);
        return EXIT_USAGE;
    }
    char tok[44];
    if ((rc = make_token(tok)) != 0) {
        fprintf(stderr, "psctl: token: no random bytes: %s\n", strerror(-rc));
        return EXIT_FAIL;
    }
    printf("%s %s\n", pos[0], tok);
    if (cfg.hash) {
        uint8_t h[PS_SHA256_LEN];
        ps_sha256(tok, strlen(tok), h);
        fprintf(stderr, "%s sha256:", pos[0]);
        for (int i = 0; i < PS_SHA256_LEN; i++)
            fprintf(stderr, "%02x", h[i]);
        fprintf(stderr, "\n");
    }
    explicit_bzero(tok, sizeof tok);
    return EXIT_OK;
}
