#!/bin/sh
# ps-bundle - one directory of secrets per task, from the output of
# `pscerts --tokens` (the CA, each task's certificate, the role tokens):
#
#   ps-bundle --from DIR --out ROOT NAME=ROLE[,serves]...
#
# ROOT/NAME/ receives what task NAME needs and nothing else:
#   ca.pem    the CA's certificate (never its key)
#   tls.pem   NAME's certificate (DIR/NAME.pem)
#   tls.key   NAME's key (DIR/NAME.key), mode 0600
#   token     "ROLE TOKEN": the token of NAME's own role (reader, worker or
#             operator), for --token-file, mode 0600
#   tokens    only with ",serves" (psd, pscoord): the table for --tokens,
#             every role as "ROLE sha256:HEX", so that a server can check
#             each role's token without holding any other role's secret
# The compose cluster's one-shot "certs" service runs it with each task's
# volume mounted at ROOT/NAME, and the CA's volume, which no task mounts,
# at DIR. Files already in ROOT/NAME are replaced.
# Exit status: 0; 1 when a file of DIR is missing (one line naming it);
# 2 for a bad command line.
set -eu

usage() {
    echo "usage: ps-bundle --from DIR --out ROOT NAME=ROLE[,serves]..." >&2
    exit 2
}
from="" out=""
while [ $# -gt 0 ]; do
    case "$1" in
    --from) [ $# -ge 2 ] || usage; from=$2; shift 2 ;;
    --out) [ $# -ge 2 ] || usage; out=$2; shift 2 ;;
    -h|--help) sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "ps-bundle: unknown option '$1'" >&2; usage ;;
    *) break ;;
    esac
done
[ -n "$from" ] && [ -n "$out" ] && [ $# -gt 0 ] || usage

need() {
    [ -s "$1" ] || { echo "ps-bundle: $1 is missing (run pscerts --tokens first)" >&2; exit 1; }
}
need "$from/ca.pem"
need "$from/tokens/server"
umask 077
for spec in "$@"; do
    name=${spec%%=*}
    rest=${spec#*=}
    role=${rest%%,*}
    case "$name" in
    ''|*[!A-Za-z0-9._-]*|.*) echo "ps-bundle: '$name' is not a task name" >&2; exit 2 ;;
    esac
    case "$role" in
    reader|worker|operator) ;;
    *) echo "ps-bundle: $name: role '$role' is not reader, worker or operator" >&2; exit 2 ;;
    esac
    need "$from/$name.pem"
    need "$from/$name.key"
    need "$from/tokens/$role"
    dir=$out/$name
    mkdir -p "$dir"
    cp "$from/ca.pem" "$dir/ca.pem.new" && mv "$dir/ca.pem.new" "$dir/ca.pem"
    cp "$from/$name.pem" "$dir/tls.pem.new" && mv "$dir/tls.pem.new" "$dir/tls.pem"
    cp "$from/$name.key" "$dir/tls.key.new" && mv "$dir/tls.key.new" "$dir/tls.key"
    cp "$from/tokens/$role" "$dir/token.new" && mv "$dir/token.new" "$dir/token"
    chmod 644 "$dir/ca.pem" "$dir/tls.pem"
    rm -f "$dir/tokens"
    case "$rest" in
    *,serves)
        for r in reader worker operator; do
            need "$from/tokens/$r"
            tok=$(cut -d' ' -f2 "$from/tokens/$r")
            printf '%s sha256:%s\n' "$r" \
                "$(printf '%s' "$tok" | openssl dgst -sha256 -r | cut -d' ' -f1)"
        done >"$dir/tokens.new"
        mv "$dir/tokens.new" "$dir/tokens"
        ;;
    esac
    echo "ps-bundle: $dir: $name's certificate and key, the CA's certificate, the $role token${rest#"$role"}"
done
