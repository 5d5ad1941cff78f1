/*
 * fsutil.h - file-system helpers the daemons share.
 */
#ifndef PS_FSUTIL_H
#define PS_FSUTIL_H

/* mkdir -p: creates path and its missing parents (mode 0755). Returns 0,
 * or -errno of the first mkdir that failed (-ENAMETOOLONG for a path of
 * PATH_MAX bytes or more). An existing path is fine, whatever it is. */
int ps_mkdirs(const char *path);

#endif
