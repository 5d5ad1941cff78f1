/* hlo_gen: the dense training step's StableHLO text, checked without a
 * plugin: its signature, every name defined before it is read, the ops of
 * each layer, and the refusals. tests/pjrt compiles and runs it. */
#include "worker/hlo_gen.h"

#include "tests/unit/pscheck.h"

#include <check.h>
#include <ctype.h>
#include <stdlib.h>
#include <string.h>

static int count(const char *s, const char *what)
{
    int n = 0;
    for (const char *p = strstr(s, what); p != NULL; p = strstr(p + 1, what))
        n++;
    return n;
}

/* The length of the name after the '%' at p. */
static int name_len(const char *p)
{
    int k = 0;
    while (isalnum((unsigned char)p[1 + k]) || p[1 + k] == '_')
        k++;
    return k;
}

/* Every %name read on a line was an argument or defined on an earlier line;
 * none is defined twice. Returns the first offender or NULL (static). */
static const char *undefined_name(const char *text)
{
    static char bad[64];
    char defined[512][24];
    int nd = 0;
    const char *body = strstr(text, ") {\n") + 2;
    /* Arguments: "%w0: tensor..." in the signature. */
    for (const char *p = text; p < body; p++) {
        if (*p == '%')
            snprintf(defined[nd++], 24, "%.*s", name_len(p), p + 1);
    }
    for (const char *line = body + 2; *line != '\0';) {
        const char *end = strchr(line, '\n');
        if (end == NULL)
            break;
        const char *bb = strstr(line, "^bb0(");
        if (bb != NULL && bb < end) { /* a region's arguments */
            for (const char *p = bb; p < end; p++)
                if (*p == '%')
                    snprintf(defined[nd++], 24, "%.*s", name_len(p), p + 1);
            line = end + 1;
            continue;
        }
        const char *eq = strstr(line, " = ");
        const char *rhs = eq != NULL && eq < end ? eq + 3 : line;
        for (const char *p = rhs; p < end; p++) {
            if (*p != '%')
                continue;
            int k = name_len(p);
            bool found = false;
            for (int i = 0; i < nd && !found; i++)
                found = (int)strlen(defined[i]) == k && strncmp(defined[i], p + 1, k) == 0;
            if (!found) {
                snprintf(bad, sizeof bad, "%.*s", k, p + 1);
                return bad;
            }
        }
        if (eq != NULL && eq < end) {
            const char *name = strchr(line, '%');
            int k = (int)(eq - name - 1);
            for (int i = 0; i < nd; i++)
                if ((int)strlen(defined[i]) == k && strncmp(defined[i], name + 1, k) == 0) {
                    snprintf(bad, sizeof bad, "%.*s (twice)", k, name + 1);
                    return bad;
                }
            snprintf(defined[nd++], 24, "%.*s", k, name + 1);
        }
        line = end + 1;
    }
    return NULL;
}

/* Checks that every name t reads is defined before (undefined_name), and
 * frees t. */
static void expect_names_defined(char *t)
{
    const char *bad = undefined_name(t);
    ck_assert_msg(bad == NULL, "%%%s is read before it is defined", bad);
    free(t);
}

START_TEST(test_softmax_signature)
{
    char err[128];
    char *t = ps_hlo_dense_step((int[]){784, 10}, 2, 5, err, sizeof err);
    ck_assert_ptr_nonnull(t);
    ck_assert_ptr_nonnull(strstr(t, "func.func public @main(%w0: tensor<784x10xf32>, "
                                    "%b0: tensor<10xf32>, %x: tensor<5x784xf32>, "
                                    "%y: tensor<5xi32>) -> (tensor<784x10xf32>, "
                                    "tensor<10xf32>, tensor<f32>)"));
    ck_assert_ptr_nonnull(strstr(t, "return %gw0, %gb0, %loss : tensor<784x10xf32>, "
                                    "tensor<10xf32>, tensor<f32>"));
    /* The mean: 1 / batch. */
    ck_assert_ptr_nonnull(strstr(t, "dense<2.000000030e-01> : tensor<f32>"));
    /* No hidden layer: no ReLU. */
    ck_assert_int_eq(count(t, "compare GT"), 0);
    expect_names_defined(t);
}
END_TEST

START_TEST(test_mlp_layers)
{
    char err[128];
    char *t = ps_hlo_dense_step((int[]){784, 256, 128, 10}, 4, 64, err, sizeof err);
    ck_assert_ptr_nonnull(t);
    /* Three layers forward (x W) and backward (the kernel gradients and two
     * steps back through the ReLUs). */
    ck_assert_int_eq(count(t, "contracting_dims = [1] x [0]"), 3);
    ck_assert_int_eq(count(t, "contracting_dims = [0] x [0]"), 3);
    ck_assert_int_eq(count(t, "contracting_dims = [1] x [1]"), 2);
    ck_assert_int_eq(count(t, "compare GT"), 2);
    ck_assert_int_eq(count(t, "stablehlo.select"), 2);
    ck_assert_ptr_nonnull(strstr(t, "%gw1 = stablehlo.dot_general %h1, %d1"));
    ck_assert_ptr_nonnull(strstr(t, "-> tensor<256x128xf32>"));
    ck_assert_ptr_nonnull(strstr(t, "return %gw0, %gb0, %gw1, %gb1, %gw2, %gb2, %loss"));
    expect_names_defined(t);
}
END_TEST

START_TEST(test_refusals)
{
    char err[128];
    ck_assert_ptr_null(ps_hlo_dense_step((int[]){784}, 1, 5, err, sizeof err));
    ck_assert_str_eq(err, "a dense step needs 1 to 16 layers, got 0");
    ck_assert_ptr_null(ps_hlo_dense_step((int[]){784, 0}, 2, 5, err, sizeof err));
    ck_assert_str_eq(err, "width 0 is outside [1, 16777216]");
    ck_assert_ptr_null(ps_hlo_dense_step((int[]){784, 10}, 2, 0, err, sizeof err));
    ck_assert_str_eq(err, "batch 0 is outside [1, 16777216]");
    int w[18];
    for (int i = 0; i < 18; i++)
        w[i] = 4;
    ck_assert_ptr_null(ps_hlo_dense_step(w, 18, 5, NULL, 0));
    char *t = ps_hlo_dense_step(w, 17, 1, err, sizeof err);
    ck_assert_ptr_nonnull(t);
    expect_names_defined(t);
}
END_TEST

START_TEST(test_cnn)
{
    char err[128];
    char *t = ps_hlo_cnn_step(28, 28, 1, (int[]){32, 64, 128}, 10, 8, err, sizeof err);
    ck_assert_ptr_nonnull(t);
    ck_assert_ptr_nonnull(strstr(t, "@main(%ck0: tensor<3x3x1x32xf32>, %cb0: tensor<32xf32>, "
                                    "%ck1: tensor<3x3x32x64xf32>, %cb1: tensor<64xf32>, "
                                    "%w0: tensor<3136x128xf32>, %b0: tensor<128xf32>, "
                                    "%w1: tensor<128x10xf32>, %b1: tensor<10xf32>, "
                                    "%x: tensor<8x28x28x1xf32>, %y: tensor<8xi32>)"));
    /* Two convs forward, two kernel gradients, one back to the first pool
     * (the image needs none). */
    ck_assert_int_eq(count(t, "stablehlo.convolution"), 5);
    ck_assert_int_eq(count(t, "reduce_window"), 2);
    ck_assert_int_eq(count(t, "select_and_scatter"), 2);
    ck_assert_ptr_nonnull(strstr(t, "-> tensor<8x7x7x64xf32>"));
    ck_assert_ptr_nonnull(strstr(t, "return %gck0, %gcb0, %gck1, %gcb1, %gw0, %gb0, %gw1, "
                                    "%gb1, %loss"));
    expect_names_defined(t);
    /* Odd sizes pool as VALID: 9 -> 4 -> 2. */
    t = ps_hlo_cnn_step(9, 9, 3, (int[]){4, 5, 6}, 3, 2, err, sizeof err);
    ck_assert_ptr_nonnull(t);
    ck_assert_ptr_nonnull(strstr(t, "%w0: tensor<20x6xf32>"));
    free(t);
    ck_assert_ptr_null(ps_hlo_cnn_step(3, 28, 1, (int[]){4, 5, 6}, 3, 2, err, sizeof err));
    ck_assert_ptr_nonnull(strstr(err, "at least 4x4"));
}
END_TEST

PSCHECK_MAIN("hlo_gen",
    {"ps_hlo_dense_step", {test_softmax_signature, test_mlp_layers, test_refusals}},
    {"ps_hlo_cnn_step", {test_cnn}})
