/*
 * wire.h - TRANSITIONAL: the old names of the wire code, for server/shard.c
 * until the split of shard.c takes the new ones. The code is in
 * common/wire.h; delete this file and server/pbcur.h once no server file
 * uses a name below.
 *
 * Threads and lifetime: as common/wire.h.
 */
#ifndef PSD_WIRE_H
#define PSD_WIRE_H

#include "../common/wire.h"

#define PSD_MAX_DIMS PS_WIRE_MAX_DIMS
#define PSD_WIRE_MAX_NAME PS_WIRE_MAX_NAME

typedef ps_wire_grad psd_wire_grad;
typedef ps_wire_push psd_push_req;
#define psd_push_decode ps_wire_push_decode
#define psd_push_decode_buf ps_wire_push_decode_buf
#define psd_push_req_free ps_wire_push_free

typedef ps_wire_bytes ps_pbcur;
#define ps_pbcur_init ps_wire_bytes_init
#define ps_pbcur_peek ps_wire_bytes_peek
#define ps_pbcur_take ps_wire_bytes_take
#define ps_pb_varint_len ps_wire_varint_len
#define ps_pb_put_varint ps_wire_put_varint
#define ps_shm_ref_len ps_wire_shm_ref_len
#define ps_shm_ref_put ps_wire_shm_ref_put

#endif
