/*
 * pbjson.c - psctl's -o json: a protobuf-c message as a jansson object,
 * walked by its descriptor, so that every field a server sends (the sparse
 * figures of Stats and ListVariables among them) is in the output under its
 * name in proto/ps.proto, without a list here to keep in step. See psctl.h.
 *
 * Mapping: integers as JSON integers (64-bit unsigned values above
 * 2^63 - 1, which no counter reaches, are clamped); floats with the 7
 * digits a float holds and doubles with 15; bools as true/false; strings
 * as strings; enums by their value's name in the .proto ("DTYPE_FLOAT32");
 * bytes as lowercase hex; a message field as an object, or null when
 * unset; a repeated field as a list; of a oneof only the member that is
 * set.
 */
#include "tools/psctl.h"

#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static json_t *scalar(const ProtobufCFieldDescriptor *f, const void *p)
{
    switch (f->type) {
    case PROTOBUF_C_TYPE_INT32:
    case PROTOBUF_C_TYPE_SINT32:
    case PROTOBUF_C_TYPE_SFIXED32:
        return json_integer(*(const int32_t *)p);
    case PROTOBUF_C_TYPE_UINT32:
    case PROTOBUF_C_TYPE_FIXED32:
        return json_integer(*(const uint32_t *)p);
    case PROTOBUF_C_TYPE_INT64:
    case PROTOBUF_C_TYPE_SINT64:
    case PROTOBUF_C_TYPE_SFIXED64:
        return json_integer(*(const int64_t *)p);
    case PROTOBUF_C_TYPE_UINT64:
    case PROTOBUF_C_TYPE_FIXED64: {
        uint64_t v = *(const uint64_t *)p;
        return json_integer(v > INT64_MAX ? INT64_MAX : (json_int_t)v);
    }
    case PROTOBUF_C_TYPE_FLOAT: {
        /* As written: a learning rate of 0.01, not 0.0099999997764825821. */
        char text[32];
        snprintf(text, sizeof text, "%.7g", *(const float *)p);
        return json_real(strtod(text, NULL));
    }
    case PROTOBUF_C_TYPE_DOUBLE:
        return json_real(*(const double *)p);
    case PROTOBUF_C_TYPE_BOOL:
        return json_boolean(*(const protobuf_c_boolean *)p);
    case PROTOBUF_C_TYPE_ENUM: {
        int v = *(const int *)p;
        const ProtobufCEnumValue *ev =
            protobuf_c_enum_descriptor_get_value(f->descriptor, v);
        return ev != NULL ? json_string(ev->name) : json_integer(v);
    }
    case PROTOBUF_C_TYPE_STRING: {
        const char *s = *(char *const *)p;
        return json_string(s != NULL ? s : "");
    }
    case PROTOBUF_C_TYPE_BYTES: {
        const ProtobufCBinaryData *b = p;
        char *hex = malloc(b->len * 2 + 1);
        if (hex == NULL)
            return NULL;
        for (size_t i = 0; i < b->len; i++)
            snprintf(hex + 2 * i, 3, "%02x", b->data[i]);
        hex[b->len * 2] = '\0';
        json_t *j = json_string(hex);
        free(hex);
        return j;
    }
    case PROTOBUF_C_TYPE_MESSAGE: {
        const ProtobufCMessage *m = *(const ProtobufCMessage *const *)p;
        return m != NULL ? pbjson_message(m) : json_null();
    }
    }
    return json_null();
}

static size_t scalar_size(const ProtobufCFieldDescriptor *f)
{
    switch (f->type) {
    case PROTOBUF_C_TYPE_INT32:
    case PROTOBUF_C_TYPE_SINT32:
    case PROTOBUF_C_TYPE_SFIXED32:
    case PROTOBUF_C_TYPE_UINT32:
    case PROTOBUF_C_TYPE_FIXED32:
    case PROTOBUF_C_TYPE_ENUM:
        return 4;
    case PROTOBUF_C_TYPE_INT64:
    case PROTOBUF_C_TYPE_SINT64:
    case PROTOBUF_C_TYPE_SFIXED64:
    case PROTOBUF_C_TYPE_UINT64:
    case PROTOBUF_C_TYPE_FIXED64:
        return 8;
    case PROTOBUF_C_TYPE_FLOAT:
        return sizeof(float);
    case PROTOBUF_C_TYPE_DOUBLE:
        return sizeof(double);
    case PROTOBUF_C_TYPE_BOOL:
        return sizeof(protobuf_c_boolean);
    case PROTOBUF_C_TYPE_STRING:
    case PROTOBUF_C_TYPE_MESSAGE:
        return sizeof(void *);
    case PROTOBUF_C_TYPE_BYTES:
        return sizeof(ProtobufCBinaryData);
    }
    return 0;
}

json_t *pbjson_message(const ProtobufCMessage *m)
{
    const ProtobufCMessageDescriptor *d = m->descriptor;
    json_t *obj = json_object();
    if (obj == NULL)
        return NULL;
    for (unsigned i = 0; i < d->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &d->fields[i];
        const char *base = (const char *)m;
        const void *p = base + f->offset;
        json_t *v = NULL;
        if (f->label == PROTOBUF_C_LABEL_REPEATED) {
            size_t n = *(const size_t *)(base + f->quantifier_offset);
            const char *arr = *(char *const *)p;
            v = json_array();
            for (size_t k = 0; v != NULL && k < n; k++)
                json_array_append_new(v, scalar(f, arr + k * scalar_size(f)));
        } else {
            if (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) {
                if (*(const uint32_t *)(base + f->quantifier_offset) != f->id)
                    continue;
            } else if (f->label == PROTOBUF_C_LABEL_OPTIONAL &&
                       f->quantifier_offset != 0 &&
                       f->type != PROTOBUF_C_TYPE_MESSAGE &&
                       f->type != PROTOBUF_C_TYPE_STRING &&
                       !*(const protobuf_c_boolean *)(base + f->quantifier_offset)) {
                continue;
            }
            v = scalar(f, p);
        }
        if (v == NULL || json_object_set_new(obj, f->name, v) != 0) {
            json_decref(obj);
            return NULL;
        }
    }
    return obj;
}

int pbjson_print(const struct command *cmd, json_t *j)
{
    if (j == NULL) {
        fprintf(stderr, "psctl: %s: out of memory\n", cmd->words);
        return EXIT_FAIL;
    }
    int rc = json_dumpf(j, stdout, JSON_INDENT(2) | JSON_PRESERVE_ORDER |
                                       JSON_REAL_PRECISION(15));
    json_decref(j);
    printf("\n");
    fflush(stdout);
    return rc == 0 ? EXIT_OK : EXIT_FAIL;
}

static bool named(const char *const *names, const char *key)
{
    for (; names != NULL && *names != NULL; names++)
        if (strcmp(*names, key) == 0)
            return true;
    return false;
}

json_t *pbjson_total(const json_t *objects, const char *const *lowest)
{
    json_t *tot = json_object();
    size_t i;
    const json_t *o;
    json_array_foreach(objects, i, o) {
        const char *key;
        json_t *v;
        json_object_foreach((json_t *)o, key, v) {
            json_t *t = json_object_get(tot, key);
            if (json_is_array(v) || json_is_object(v) || json_is_null(v))
                continue;
            if (t == NULL) {
                json_object_set_new(tot, key, json_deep_copy(v));
                continue;
            }
            bool low = named(lowest, key);
            if (json_is_integer(v) && json_is_integer(t)) {
                json_int_t a = json_integer_value(t), b = json_integer_value(v);
                json_integer_set(t, low ? (b < a ? b : a) : a + b);
            } else if (json_is_number(v) && json_is_number(t)) {
                double a = json_number_value(t), b = json_number_value(v);
                json_object_set_new(tot, key, json_real(low ? (b < a ? b : a) : a + b));
            } else if (json_is_boolean(v) && json_is_boolean(t)) {
                if (json_is_true(v))
                    json_object_set_new(tot, key, json_true());
            } else if (!json_equal(t, v)) {
                json_object_set_new(tot, key, json_string("mixed"));
            }
        }
    }
    return tot;
}
