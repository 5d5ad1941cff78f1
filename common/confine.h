/*
 * confine.h - each outside library is reachable only from its module.
 *
 * STYLE.md gives every dependency one home: only server/store.c talks to
 * LMDB, only the RPC files of common/ to gRPC core, only common/proc.c to
 * libuv, only worker/backend_cpu.c to BLAS, only common/notify.c to
 * libsystemd, NCCL to worker/collective_nccl.cu, and CUDA stays in the .cu
 * files (Gloo, being C++, cannot reach a C file at all: only
 * worker/collective_gloo.cc includes it); only worker/backend_pjrt.c sees
 * the PJRT C API (third_party/pjrt); only server/segment.c sees ISA-L's CRC
 * on psd's side and liburing (and bench/segments.c, for its disk ceiling).
 * Their headers sit in /usr/include, where every compiler finds them, so an
 * include path alone cannot keep them out. The build therefore force-includes
 * this header into every C file of the project (-include, meson.build) and
 * poisons one identifier that each library's header declares: including
 * <lmdb.h> anywhere else fails to compile with "attempt to use poisoned
 * mdb_env_create". The module that owns a library is compiled with
 * -DPS_OWNS_<LIB> (its meson target), which lifts that one poison.
 *
 * Threads and lifetime: none; preprocessor only. GCC and clang both honour
 * the pragma; nvcc compiles the .cu files without this header.
 */
#ifndef PS_CONFINE_H
#define PS_CONFINE_H

#ifndef PS_OWNS_LMDB
#pragma GCC poison mdb_env_create
#endif

#ifndef PS_OWNS_GRPC
#pragma GCC poison grpc_init grpc_byte_buffer_reader_init
#endif

#ifndef PS_OWNS_UV
#pragma GCC poison uv_loop_init
#endif

#ifndef PS_OWNS_SYSTEMD
#pragma GCC poison sd_notify
#endif

#ifndef PS_OWNS_BLAS
#pragma GCC poison cblas_sgemm openblas_set_num_threads
#endif

#ifndef PS_OWNS_ISAL
#pragma GCC poison crc32_iscsi
#endif

#ifndef PS_OWNS_URING
#pragma GCC poison io_uring_queue_init
#endif

#ifndef PS_OWNS_MHD
#pragma GCC poison MHD_start_daemon
#endif

#ifndef PS_OWNS_NCCL
#pragma GCC poison ncclCommInitRank
#endif

#ifndef PS_OWNS_CUDA
#pragma GCC poison cudaMalloc cublasCreate_v2
#endif

#ifndef PS_OWNS_OPENSSL
#pragma GCC poison EVP_Digest
#endif

#ifndef PS_OWNS_PJRT
#pragma GCC poison PJRT_Api_Version
#endif

/* bench/redis_peer.c: bench/sparse's Redis peer (never shipped). */
#ifndef PS_OWNS_HIREDIS
#pragma GCC poison redisConnect
#endif

#endif
