#!/bin/sh
# ps-healthcheck - the image's HEALTHCHECK: asks grpc.health.v1 at
# $PS_HEALTH_ADDR (default 127.0.0.1:7070) through `psctl health`, with
# the task's own TLS files and token when /etc/psd/tls holds them (the
# layout ps-bundle writes: ca.pem, tls.pem, tls.key, token). Health is
# open to every role, so the task's own token is enough.
# PS_HEALTH_ADDR=none: the task serves no gRPC (workerd); always healthy.
# Exit status: 0 SERVING, 1 otherwise (Docker's unhealthy).
set -eu
addr=${PS_HEALTH_ADDR:-127.0.0.1:7070}
[ "$addr" = none ] && exit 0
dir=${PS_TLS_DIR:-/etc/psd/tls}
set --
if [ -s "$dir/ca.pem" ]; then
    set -- --tls-ca "$dir/ca.pem" --tls-cert "$dir/tls.pem" --tls-key "$dir/tls.key"
fi
if [ -s "$dir/token" ]; then
    set -- "$@" --token-file "$dir/token"
fi
psctl "$@" health --server "$addr" --timeout 3s >/dev/null || exit 1
