/*
 * jsonutil.h - small helpers shared by the modules that read JSON with
 * jansson (conf.c, cluster.c). Internal to common/.
 */
#ifndef PS_JSONUTIL_H
#define PS_JSONUTIL_H

#include <jansson.h>

/* "an object", "a list", "a string"... for messages naming what was found. */
static inline const char *ps_json_type_name(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT:
        return "an object";
    case JSON_ARRAY:
        return "a list";
    case JSON_STRING:
        return "a string";
    case JSON_INTEGER:
        return "an integer";
    case JSON_REAL:
        return "a number";
    case JSON_TRUE:
    case JSON_FALSE:
        return "a boolean";
    case JSON_NULL:
        return "null";
    }
    return "something else";
}

#endif
