/* pemcheck.c - see pemcheck.h. */
#include "common/pemcheck.h"

#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <time.h>

enum ps_pem_check ps_pem_check_pair(const char *cert_pem, const char *key_pem)
{
    enum ps_pem_check rc = PS_PEM_BAD_CERT;
    X509 *cert = NULL;
    EVP_PKEY *key = NULL;
    BIO *b = BIO_new_mem_buf(cert_pem, -1);
    if (b != NULL)
        cert = PEM_read_bio_X509(b, NULL, NULL, NULL);
    BIO_free(b);
    if (cert == NULL)
        goto out;
    rc = PS_PEM_BAD_KEY;
    b = BIO_new_mem_buf(key_pem, -1);
    if (b != NULL)
        key = PEM_read_bio_PrivateKey(b, NULL, NULL, NULL);
    BIO_free(b);
    if (key == NULL)
        goto out;
    rc = X509_check_private_key(cert, key) == 1 ? PS_PEM_OK : PS_PEM_MISMATCH;
out:
    /* Parse failures leave entries on this thread's error queue, which
     * gRPC's own TLS code would otherwise find later. */
    ERR_clear_error();
    EVP_PKEY_free(key);
    X509_free(cert);
    return rc;
}

int ps_pem_cert_not_after(const char *cert_pem, long long *out)
{
    int rc = -1;
    X509 *cert = NULL;
    BIO *b = BIO_new_mem_buf(cert_pem, -1);
    if (b != NULL)
        cert = PEM_read_bio_X509(b, NULL, NULL, NULL);
    BIO_free(b);
    struct tm tm;
    if (cert != NULL && ASN1_TIME_to_tm(X509_get0_notAfter(cert), &tm) == 1) {
        *out = (long long)timegm(&tm);
        rc = 0;
    }
    ERR_clear_error();
    X509_free(cert);
    return rc;
}
