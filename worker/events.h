/*
 * events.h - TensorBoard event files: what workerd's chief and evaluator
 * write under --logdir.
 *
 * A writer owns one file, RUNDIR/events.out.tfevents.<unix seconds>.<host>
 * (TensorFlow's name; ".<pid>" is appended when a file of that name
 * exists), in TFRecord framing: each record is
 *
 *   uint64 length | uint32 masked CRC32C of length | data | uint32 masked CRC32C of data
 *
 * all little-endian, mask(c) = ((c >> 15) | (c << 17)) + 0xa282ead8. The
 * data is a tensorflow.Event (proto/tensorboard.proto): the first record
 * says file_version "brain.Event:2", each later one carries a step and a
 * Summary of simple_value scalars. Each event is one write(2), so a live
 * TensorBoard sees it at once; nothing is buffered in user space.
 *
 * Event files never stop training: every failure (a directory that cannot
 * be made or written, a full disk) is logged once as a warning naming the
 * path and the reason, and the writer then writes nothing more.
 *
 * This is the one file that sees ISA-L (CRC32C with run-time CPU dispatch;
 * common/confine.h).
 *
 * Threads and lifetime: a writer is used by one thread at a time. Its path
 * string lives as long as the writer.
 */
#ifndef PS_WORKER_EVENTS_H
#define PS_WORKER_EVENTS_H

#include <stddef.h>
#include <stdint.h>

typedef struct wd_events wd_events;

/* One scalar of an event: TensorBoard's chart name and its value. */
struct wd_scalar {
    const char *tag;
    float value;
};

/* The TFRecord framing's overhead around a record's data: length, its CRC,
 * and the data's CRC. */
#define WD_RECORD_OVERHEAD 16

/* CRC32C (Castagnoli, the iSCSI CRC: reflected, initial and final value
 * 0xffffffff) of buf; 0xE3069283 for "123456789". */
uint32_t wd_crc32c(const void *buf, size_t len);

/* TFRecord's masked CRC32C of buf. */
uint32_t wd_crc32c_masked(const void *buf, size_t len);

/* Frames len bytes of data as one record into out, which holds len +
 * WD_RECORD_OVERHEAD bytes. Returns the record's size. */
size_t wd_record_frame(uint8_t *out, const void *data, size_t len);

/* Creates rundir (and its parents) and a new event file in it, and writes
 * its file_version record. Returns 0 with *out set, or -errno with *out
 * NULL after one warning line naming the path and the reason. */
int wd_events_create(const char *rundir, wd_events **out);

/* Writes one event: step and the n scalars in v, stamped with the wall
 * time now. Returns 0; -errno once, for the write that failed (after one
 * warning line; the writer is then closed and later calls return 0 and
 * write nothing). A NULL writer writes nothing and returns 0. */
int wd_events_write(wd_events *ev, int64_t step, const struct wd_scalar *v, size_t n);

/* The file's path. */
const char *wd_events_path(const wd_events *ev);

/* Closes the file and frees the writer; NULL does nothing. */
void wd_events_destroy(wd_events *ev);

#endif
