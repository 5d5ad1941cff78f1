/* TensorBoard event files (worker/events.h): CRC32C against published
 * vectors, TFRecord's masked CRC and framing against bytes computed with
 * Debian's python3-crc32c, and a writer's file read back record by record. */
#include "worker/events.h"

#include "proto/tensorboard.pb-c.h"
#include "tests/unit/pscheck.h"

#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

START_TEST(test_crc32c_vectors)
{
    /* The check value of CRC-32C (the CRC catalogue's "123456789") and the
     * iSCSI vectors of RFC 3720, B.4. */
    ck_assert_uint_eq(wd_crc32c("123456789", 9), 0xE3069283u);
    ck_assert_uint_eq(wd_crc32c("", 0), 0);
    uint8_t b[32];
    memset(b, 0, sizeof b);
    ck_assert_uint_eq(wd_crc32c(b, sizeof b), 0x8A9136AAu);
    memset(b, 0xff, sizeof b);
    ck_assert_uint_eq(wd_crc32c(b, sizeof b), 0x62A8AB43u);
    for (int i = 0; i < 32; i++)
        b[i] = (uint8_t)i;
    ck_assert_uint_eq(wd_crc32c(b, sizeof b), 0x46DD794Eu);
    for (int i = 0; i < 32; i++)
        b[i] = (uint8_t)(31 - i);
    ck_assert_uint_eq(wd_crc32c(b, sizeof b), 0x113FDB5Cu);
}
END_TEST

START_TEST(test_crc32c_long)
{
    /* Past ISA-L's fast paths' block sizes, at an odd length. */
    size_t n = (1u << 20) + 3;
    uint8_t *b = malloc(n);
    ck_assert_ptr_nonnull(b);
    for (size_t i = 0; i < n; i++)
        b[i] = (uint8_t)(i * 7 + (i >> 8));
    /* python3 -c 'import crc32c; b=bytes((i*7+(i>>8))&255 for i in
     * range((1<<20)+3)); print(hex(crc32c.crc32c(b)))' */
    ck_assert_uint_eq(wd_crc32c(b, n), 0xBF694AD2u);
    free(b);
}
END_TEST

START_TEST(test_masked)
{
    /* mask(c) = ((c >> 15) | (c << 17)) + 0xa282ead8, from python3-crc32c's
     * CRC of the same bytes. */
    ck_assert_uint_eq(wd_crc32c_masked("123456789", 9), 0xC78AB0E5u);
    ck_assert_uint_eq(wd_crc32c_masked("", 0), 0xa282ead8u);
}
END_TEST

START_TEST(test_frame)
{
    /* A record of "hello": length 5 (le64), masked CRC of those 8 bytes,
     * the data, masked CRC of the data; bytes from python3-crc32c. */
    static const uint8_t want[] = {
        0x05, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0xea, 0xb2, 0x04, 0x3e,
        'h', 'e', 'l', 'l', 'o', 0xbb, 0x1f, 0x1c, 0x19,
    };
    uint8_t out[5 + WD_RECORD_OVERHEAD];
    ck_assert_uint_eq(wd_record_frame(out, "hello", 5), sizeof want);
    ck_assert_mem_eq(out, want, sizeof want);
    uint8_t empty[WD_RECORD_OVERHEAD];
    ck_assert_uint_eq(wd_record_frame(empty, "", 0), WD_RECORD_OVERHEAD);
    ck_assert_uint_eq(empty[12] | empty[13] << 8 | empty[14] << 16 |
                      (uint32_t)empty[15] << 24, 0xa282ead8u);
}
END_TEST

static uint32_t le32(const uint8_t *p)
{
    return p[0] | p[1] << 8 | p[2] << 16 | (uint32_t)p[3] << 24;
}

/* The one file in dir; its path into path. */
static void only_file(const char *dir, char *path, size_t len)
{
    DIR *d = opendir(dir);
    ck_assert_ptr_nonnull(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        ck_assert_msg(strncmp(e->d_name, "events.out.tfevents.", 20) == 0,
                      "unexpected file %s", e->d_name);
        snprintf(path, len, "%s/%s", dir, e->d_name);
        n++;
    }
    closedir(d);
    ck_assert_int_eq(n, 1);
}

/* The events of a file, each record's CRCs checked; *n of them. */
static Tensorflow__Event **read_events(const char *path, size_t *n)
{
    size_t len, off = 0;
    unsigned char *buf = pscheck_read(path, &len);
    Tensorflow__Event **ev = calloc(64, sizeof *ev);
    *n = 0;
    while (off < len) {
        ck_assert_uint_ge(len - off, WD_RECORD_OVERHEAD);
        uint64_t rl = le32(buf + off) | (uint64_t)le32(buf + off + 4) << 32;
        ck_assert_uint_eq(le32(buf + off + 8), wd_crc32c_masked(buf + off, 8));
        ck_assert_uint_le(rl, len - off - WD_RECORD_OVERHEAD);
        const uint8_t *data = buf + off + 12;
        ck_assert_uint_eq(le32(data + rl), wd_crc32c_masked(data, rl));
        ck_assert_uint_lt(*n, 64);
        ev[*n] = tensorflow__event__unpack(NULL, rl, data);
        ck_assert_ptr_nonnull(ev[*n]);
        (*n)++;
        off += rl + WD_RECORD_OVERHEAD;
    }
    free(buf);
    return ev;
}

static void free_events(Tensorflow__Event **ev, size_t n)
{
    for (size_t i = 0; i < n; i++)
        tensorflow__event__free_unpacked(ev[i], NULL);
    free(ev);
}

START_TEST(test_create_write)
{
    char run[128], path[512];
    snprintf(run, sizeof run, "%s/logs/worker0", tmpdir);
    wd_events *ev;
    ck_assert_int_eq(wd_events_create(run, &ev), 0);
    ck_assert_ptr_nonnull(strstr(wd_events_path(ev), "/events.out.tfevents."));
    struct wd_scalar v[] = {{"loss", 2.5f}, {"accuracy", 0.0f}};
    ck_assert_int_eq(wd_events_write(ev, 7, v, 2), 0);
    ck_assert_int_eq(wd_events_write(ev, 17, v, 1), 0);
    /* Written through to the file before the writer closes: a live
     * TensorBoard sees each event at once. */
    only_file(run, path, sizeof path);
    size_t n;
    Tensorflow__Event **e = read_events(path, &n);
    ck_assert_uint_eq(n, 3);
    ck_assert_int_eq(e[0]->what_case, TENSORFLOW__EVENT__WHAT_FILE_VERSION);
    ck_assert_str_eq(e[0]->file_version, "brain.Event:2");
    ck_assert(e[0]->wall_time > 1.6e9);
    ck_assert_int_eq(e[1]->what_case, TENSORFLOW__EVENT__WHAT_SUMMARY);
    ck_assert_int_eq(e[1]->step, 7);
    ck_assert_uint_eq(e[1]->summary->n_value, 2);
    ck_assert_str_eq(e[1]->summary->value[0]->tag, "loss");
    ck_assert(e[1]->summary->value[0]->simple_value == 2.5f);
    /* A zero is a value, not an absent field (the oneof). */
    ck_assert_int_eq(e[1]->summary->value[1]->value_case,
                     TENSORFLOW__SUMMARY__VALUE__VALUE_SIMPLE_VALUE);
    ck_assert(e[1]->summary->value[1]->simple_value == 0.0f);
    ck_assert_int_eq(e[2]->step, 17);
    ck_assert_uint_eq(e[2]->summary->n_value, 1);
    ck_assert(e[2]->wall_time >= e[1]->wall_time);
    free_events(e, n);
    wd_events_destroy(ev);
}
END_TEST

START_TEST(test_create_twice)
{
    /* A second writer in the same second gets a name of its own. */
    char run[128];
    snprintf(run, sizeof run, "%s/eval", tmpdir);
    wd_events *a, *b;
    ck_assert_int_eq(wd_events_create(run, &a), 0);
    ck_assert_int_eq(wd_events_create(run, &b), 0);
    ck_assert_str_ne(wd_events_path(a), wd_events_path(b));
    wd_events_destroy(a);
    wd_events_destroy(b);
}
END_TEST

START_TEST(test_create_unwritable)
{
    /* Under a regular file: no directory can be made, whoever runs it. */
    char file[128], run[160];
    snprintf(file, sizeof file, "%s/plain", tmpdir);
    pscheck_write_text(file, "x");
    snprintf(run, sizeof run, "%s/worker0", file);
    wd_events *ev = (wd_events *)1;
    ck_assert_int_eq(wd_events_create(run, &ev), -ENOTDIR);
    ck_assert_ptr_null(ev);
    /* Nothing to write to: nothing written, no error. */
    struct wd_scalar v[] = {{"loss", 1.0f}};
    ck_assert_int_eq(wd_events_write(NULL, 1, v, 1), 0);
    wd_events_destroy(NULL);
}
END_TEST

/* In a child whose writes fail past 200 bytes (a full disk): the first
 * failing write returns the error, later ones nothing. */
static int write_until_full(void)
{
    char run[128];
    snprintf(run, sizeof run, "%s/full", tmpdir);
    wd_events *ev;
    if (wd_events_create(run, &ev) != 0 || pscheck_limit_writes(200) != 0)
        return 10;
    struct wd_scalar v[] = {{"examples_per_second", 12345.0f}};
    int first = 0, later = 0;
    for (int i = 0; i < 20; i++) {
        int rc = wd_events_write(ev, i, v, 1);
        if (rc != 0 && first == 0)
            first = rc;
        else if (rc != 0)
            later++;
    }
    wd_events_destroy(ev);
    return first == -EFBIG && later == 0 ? 0 : 11;
}

START_TEST(test_write_full)
{
    ck_assert_int_eq(pscheck_fork(write_until_full), 0);
}
END_TEST

PSCHECK_MAIN("events",
    {"wd_crc32c", {test_crc32c_vectors, test_crc32c_long}},
    {"wd_crc32c_masked", {test_masked}},
    {"wd_record_frame", {test_frame}},
    {"wd_events_create", {test_create_write, test_create_twice, test_create_unwritable},
     &pscheck_tmp},
    {"wd_events_write", {test_write_full}, &pscheck_tmp})
