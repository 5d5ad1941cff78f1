/*
 * fsutil.h - file-system helpers the daemons share.
 *
 * Threads and lifetime: no state of its own; a directory lock lives as long
 * as the descriptor ps_dir_lock returns (the kernel drops it when the process
 * ends, however it ends, so a kill -9 leaves no stale lock behind).
 */
#ifndef PS_FSUTIL_H
#define PS_FSUTIL_H

/* mkdir -p: creates path and its missing parents (mode 0755). Returns 0,
 * or -errno of the first mkdir that failed (-ENAMETOOLONG for a path of
 * PATH_MAX bytes or more). An existing path is fine, whatever it is. */
int ps_mkdirs(const char *path);

#include <sys/types.h>

/* Takes an exclusive lock on directory dir (made if missing), so that two
 * daemons never serve one directory at once: flock(2) on dir/name, a file
 * holding the owner's pid in decimal. Returns the descriptor to keep open
 * while the directory is in use (close it, or exit, to let go). On failure
 * returns -errno: -EWOULDBLOCK when another process holds the lock, its pid
 * then in *holder (0 if it has not written it yet); *holder is 0 otherwise. */
int ps_dir_lock(const char *dir, const char *name, pid_t *holder);

#include <stddef.h>
#include <stdint.h>

/* Writes all len bytes of buf to fd, again after a short write or EINTR.
 * Returns 0 or -errno of the write that failed. */
int ps_write_all(int fd, const void *buf, size_t len);

/* Field `field` of /proc/PID/stat, numbered from 1 as in proc(5) (10
 * minflt, 12 majflt, 14 utime, 15 stime, 22 starttime), as a number; 0
 * when it cannot be read (the process is gone) or field < 4. */
uint64_t ps_proc_stat_field(pid_t pid, int field);

#endif
