/*
 * sha256.h - SHA-256 (FIPS 180-4), for the token table of common/auth.c: a
 * token file may hold a token's hash instead of the token, and presented
 * tokens are compared by their hashes, whose length is fixed. The digest is
 * OpenSSL's (libcrypto, which gRPC links already for TLS).
 *
 * Threads and lifetime: pure functions; no state.
 */
#ifndef PS_SHA256_H
#define PS_SHA256_H

#include <stddef.h>
#include <stdint.h>

#define PS_SHA256_LEN 32

/* out = SHA-256 of data[0..len). */
void ps_sha256(const void *data, size_t len, uint8_t out[PS_SHA256_LEN]);

#endif
