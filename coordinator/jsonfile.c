#include "coordinator/jsonfile.h"

#include "common/errors.h"
#include "common/fsutil.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int fsync_dir_of(const char *path)
{
    char *copy = strdup(path);
    if (copy == NULL)
        return -ENOMEM;
    int fd = open(dirname(copy), O_RDONLY | O_DIRECTORY);
    free(copy);
    if (fd < 0)
        return -errno;
    int rc = fsync(fd) == 0 ? 0 : -errno;
    close(fd);
    return rc;
}

int coord_json_write(const char *path, const json_t *root, int mode,
                     char *err, size_t errlen)
{
    char *text = json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    if (text == NULL) {
        snprintf(err, errlen, "%s: out of memory formatting JSON", path);
        return -ENOMEM;
    }
    char tmp[4096];
    int rc = 0;
    if ((size_t)snprintf(tmp, sizeof tmp, "%s.tmp", path) >= sizeof tmp) {
        snprintf(err, errlen, "%s: path too long", path);
        free(text);
        return -ENAMETOOLONG;
    }
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC,
                  (mode_t)mode);
    if (fd < 0) {
        rc = -errno;
        snprintf(err, errlen, "%s: cannot create: %s", tmp, strerror(errno));
        goto out;
    }
    /* A .tmp left by a crash keeps its old mode through O_TRUNC. */
    if (fchmod(fd, (mode_t)mode) != 0) {
        rc = -errno;
        snprintf(err, errlen, "%s: cannot chmod: %s", tmp, strerror(errno));
        goto close;
    }
    if ((rc = ps_write_all(fd, text, strlen(text))) != 0) {
        snprintf(err, errlen, "%s: write failed: %s", tmp, strerror(-rc));
        goto close;
    }
    if (write(fd, "\n", 1) != 1 || fsync(fd) != 0) {
        rc = errno != 0 ? -errno : -EIO;
        snprintf(err, errlen, "%s: write or fsync failed: %s", tmp,
                 strerror(-rc));
        goto close;
    }
close:
    if (close(fd) != 0 && rc == 0) {
        rc = -errno;
        snprintf(err, errlen, "%s: close failed: %s", tmp, strerror(errno));
    }
    if (rc == 0 && rename(tmp, path) != 0) {
        rc = -errno;
        snprintf(err, errlen, "%s: rename into place failed: %s", path,
                 strerror(errno));
    }
    if (rc != 0)
        unlink(tmp);
    else if ((rc = fsync_dir_of(path)) != 0)
        snprintf(err, errlen, "%s: fsync of its directory failed: %s", path,
                 strerror(-rc));
out:
    free(text);
    return rc;
}

int coord_json_read(const char *path, json_t **out, char *err, size_t errlen)
{
    *out = NULL;
    FILE *f = fopen(path, "re");
    if (f == NULL) {
        int e = errno;
        snprintf(err, errlen, "%s: %s", path, strerror(e));
        return -e;
    }
    json_error_t je;
    json_t *root = json_loadf(f, 0, &je);
    fclose(f);
    if (root == NULL) {
        snprintf(err, errlen, "%s:%d:%d: %s", path, je.line, je.column,
                 je.text);
        return PS_EPARSE;
    }
    if (!json_is_object(root)) {
        snprintf(err, errlen, "%s: not a JSON object", path);
        json_decref(root);
        return PS_EPARSE;
    }
    *out = root;
    return 0;
}

int coord_mkdirs(const char *path)
{
    int rc = ps_mkdirs(path);
    if (rc != 0)
        return rc;
    struct stat st;
    if (stat(path, &st) != 0)
        return -errno;
    return S_ISDIR(st.st_mode) ? 0 : -ENOTDIR;
}
