/*
 * diskrate.h - the disk's ceiling for psd's cold reads, as bench/segments
 * and bench/sparse measure it in their runs: random O_DIRECT reads of a
 * record's aligned span in psd's segment files, as many in flight as
 * server/segment.c's ring keeps, through io_uring. The one bench file that
 * sees liburing (-DPS_OWNS_URING, common/confine.h).
 */
#ifndef BENCH_DISKRATE_H
#define BENCH_DISKRATE_H

#include <stdint.h>

#define BENCH_DISK_DEPTH 256 /* segment.c's ring */

/* Reads/s of span bytes at random align-aligned offsets of the files
 * dir/seg-00000001.psg .. seg-<nseg>.psg, BENCH_DISK_DEPTH in flight, for
 * secs; 0 when a file cannot be opened with O_DIRECT, io_uring is not
 * available or a read fails (said on stderr). */
double bench_disk_rate(const char *dir, uint32_t nseg, uint32_t span, uint32_t align,
                       double secs);

#endif
