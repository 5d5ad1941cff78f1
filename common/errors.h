/*
 * errors.h - the project's error codes and their text.
 *
 * Every fallible function in the project returns an int: 0 on success, a
 * negative value on failure. A failure is either a negated errno value
 * (-ENOENT, -ENOMEM, ...) or one of the project codes below, which live in a
 * reserved band far below any errno so that the two never collide (the same
 * trick as LMDB's MDB_KEYEXIST band).
 *
 * Functions that can say more than a code take a caller's buffer (char
 * *err, size_t errlen) for one line of explanation; ps_errf fills it.
 *
 * Threads and lifetime: everything here is reentrant; ps_strerror returns
 * static strings that live forever.
 */
#ifndef PS_ERRORS_H
#define PS_ERRORS_H

#include <stdarg.h>
#include <stddef.h>

/* X(name, value, text). Keep the values stable: they appear in logs. */
#define PS_ERRNO_MAP(X)                                                   \
    X(PS_EINVAL_ARG,   -30600, "invalid argument")                        \
    X(PS_EPARSE,       -30601, "malformed input")                         \
    X(PS_ENOTFOUND,    -30602, "not found")                               \
    X(PS_EEXIST,       -30603, "already exists with a different definition") \
    X(PS_ESHAPE,       -30604, "shape mismatch")                          \
    X(PS_EDTYPE,       -30605, "unsupported or mismatched dtype")         \
    X(PS_ENONFINITE,   -30606, "NaN or Inf in input")                     \
    X(PS_ESTALE,       -30607, "stale step")                              \
    X(PS_ETIMEDOUT,    -30608, "deadline exceeded")                       \
    X(PS_EUNAVAIL,     -30609, "service unavailable")                     \
    X(PS_ERPC,         -30610, "remote call failed")                      \
    X(PS_ESTORE,       -30611, "storage error")                           \
    X(PS_EFULL,        -30612, "storage full")                            \
    X(PS_ECORRUPT,     -30613, "corrupt data")                            \
    X(PS_ECUDA,        -30614, "CUDA error")                              \
    X(PS_ENODEV,       -30615, "no usable device")                        \
    X(PS_ESHUTDOWN,    -30616, "shutting down")                           \
    X(PS_ECONFLICT,    -30617, "conflicting request")

enum ps_errno {
#define PS_ERRNO_ENUM(name, value, text) name = (value),
    PS_ERRNO_MAP(PS_ERRNO_ENUM)
#undef PS_ERRNO_ENUM
};

/* Text for any code this project returns: a project code, a negated errno
 * value, or 0 ("success"). Unknown codes give "unknown error". Never NULL. */
const char *ps_strerror(int err);

/* The code's symbolic name ("PS_ENOTFOUND", "ENOENT"), for logs and tests.
 * Never NULL. */
const char *ps_errname(int err);

/* Writes the message into err (truncated to errlen; nothing when err is
 * NULL or errlen 0) and returns rc, so that a failure is one statement:
 * `return ps_errf(PS_EPARSE, err, errlen, "line %d: ...", n);`. */
int ps_errf(int rc, char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
int ps_verrf(int rc, char *err, size_t errlen, const char *fmt, va_list ap)
    __attribute__((format(printf, 4, 0)));

#endif
