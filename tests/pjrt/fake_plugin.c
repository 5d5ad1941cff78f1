/*
 * fake_plugin.c - a stand-in PJRT plugin for workerd's refusals: GetPjrtApi
 * returns a table whose API version is PS_FAKE_PJRT_MAJOR.MINOR (default
 * 0.81, the vendored header's), whose client has no addressable device, and
 * whose PJRT_Client_Create fails with a message when PS_FAKE_PJRT_FAIL is
 * set. Built as a shared module for tests/pjrt only.
 */
#include "third_party/pjrt/pjrt_c_api.h"

#include <stdlib.h>
#include <string.h>

struct PJRT_Error {
    const char *msg;
};
struct PJRT_Client {
    int unused;
};

static struct PJRT_Error create_failed = {"fake plugin: no TPU chips found"};
static struct PJRT_Client the_client;

static void error_message(PJRT_Error_Message_Args *a)
{
    a->message = a->error->msg;
    a->message_size = strlen(a->error->msg);
}

static void error_destroy(PJRT_Error_Destroy_Args *a)
{
    (void)a;
}

static PJRT_Error *plugin_initialize(PJRT_Plugin_Initialize_Args *a)
{
    (void)a;
    return NULL;
}

static PJRT_Error *client_create(PJRT_Client_Create_Args *a)
{
    if (getenv("PS_FAKE_PJRT_FAIL") != NULL)
        return &create_failed;
    a->client = &the_client;
    return NULL;
}

static PJRT_Error *platform_name(PJRT_Client_PlatformName_Args *a)
{
    a->platform_name = "fake";
    a->platform_name_size = 4;
    return NULL;
}

static PJRT_Error *addressable_devices(PJRT_Client_AddressableDevices_Args *a)
{
    a->addressable_devices = NULL;
    a->num_addressable_devices = 0;
    return NULL;
}

static PJRT_Api api;

const PJRT_Api *GetPjrtApi(void);

const PJRT_Api *GetPjrtApi(void)
{
    const char *v = getenv("PS_FAKE_PJRT_VERSION");
    api.struct_size = PJRT_Api_STRUCT_SIZE;
    api.pjrt_api_version.struct_size = PJRT_Api_Version_STRUCT_SIZE;
    api.pjrt_api_version.major_version = v != NULL ? atoi(v) : PJRT_API_MAJOR;
    api.pjrt_api_version.minor_version =
        v != NULL && strchr(v, '.') != NULL ? atoi(strchr(v, '.') + 1) : PJRT_API_MINOR;
    api.PJRT_Error_Message = error_message;
    api.PJRT_Error_Destroy = error_destroy;
    api.PJRT_Plugin_Initialize = plugin_initialize;
    api.PJRT_Client_Create = client_create;
    api.PJRT_Client_PlatformName = platform_name;
    api.PJRT_Client_AddressableDevices = addressable_devices;
    return &api;
}
