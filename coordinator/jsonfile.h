/*
 * jsonfile.h - JSON files that are never seen half-written: the
 * coordinator's state.json, summary.json and job checkpoint manifests.
 *
 * A write goes to "<path>.tmp", is fsync'd, renamed over <path>, and the
 * directory is fsync'd, so after a crash the file holds either the old or the
 * new text, whole.
 *
 * Threads and lifetime: no shared state; two threads must not write the same
 * path at once (the coordinator writes under its lock).
 */
#ifndef COORD_JSONFILE_H
#define COORD_JSONFILE_H

#include <jansson.h>
#include <stddef.h>

/* Writes root (indented) to path atomically, the file with the given mode
 * (0600 for one that holds secrets). Returns 0, or -errno / -ENOMEM with
 * one line in err naming the file and the problem. */
int coord_json_write(const char *path, const json_t *root, int mode,
                     char *err, size_t errlen);

/* Reads a JSON object from path into *out (the caller json_decref's it).
 * Returns 0; -ENOENT when the file does not exist (err says so); PS_EPARSE
 * when it is not a JSON object (err gives the line and column); other
 * -errno. */
int coord_json_read(const char *path, json_t **out, char *err, size_t errlen);

/* mkdir -p with mode 0755. Returns 0 or -errno. */
int coord_mkdirs(const char *path);

#endif
