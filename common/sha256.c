/*
 * sha256.c - SHA-256 through OpenSSL's libcrypto, the one file that sees
 * it (common/confine.h). gRPC already links libcrypto for TLS, so this adds
 * no library to the processes; a hash written by hand would be code to
 * keep correct that a well-kept library already has.
 */
#include "common/sha256.h"

#include <openssl/evp.h>

void ps_sha256(const void *data, size_t len, uint8_t out[PS_SHA256_LEN])
{
    unsigned int n = PS_SHA256_LEN;
    /* EVP_Digest fails only when out of memory for its context; the hash
     * is then all zeros, which matches no token's (a real token's hash is
     * never all zeros). */
    if (EVP_Digest(data, len, out, &n, EVP_sha256(), NULL) != 1)
        for (size_t i = 0; i < PS_SHA256_LEN; i++)
            out[i] = 0;
}
