/*
 * pemcheck.h - whether a PEM certificate and a PEM private key belong
 * together, checked with OpenSSL's libcrypto (which gRPC links already for
 * TLS). gRPC takes a mismatched pair without a word and fails every
 * handshake later; common/tls.c asks here first, at start and on each
 * SIGHUP reload, so that a wrong key is one line naming both files and the
 * certificates in use stay in use.
 *
 * It also reads a certificate's end of validity, for tls.c's warning about
 * a server certificate that expired or is about to.
 *
 * Threads and lifetime: pure functions; no state.
 */
#ifndef PS_PEMCHECK_H
#define PS_PEMCHECK_H

enum ps_pem_check {
    PS_PEM_OK = 0,
    PS_PEM_BAD_CERT,  /* cert_pem holds no certificate libcrypto can read */
    PS_PEM_BAD_KEY,   /* key_pem holds no private key libcrypto can read */
    PS_PEM_MISMATCH,  /* the key is not the certificate's */
};

/* Parses the first certificate of cert_pem and the key of key_pem (both
 * NUL-terminated PEM text) and compares the key with the certificate's
 * public key. */
enum ps_pem_check ps_pem_check_pair(const char *cert_pem, const char *key_pem);

/* The end of the validity of cert_pem's first certificate (its notAfter),
 * in seconds since 1970, into *out. Returns 0, or -1 when the certificate
 * or its date cannot be read. */
int ps_pem_cert_not_after(const char *cert_pem, long long *out);

#endif
