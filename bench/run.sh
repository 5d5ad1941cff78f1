#!/usr/bin/env bash
# Runs every benchmark under bench/ against the build in $1 (what `make bench`
# runs). Each benchmark is one section: a function below, named in SECTIONS.
# A section starts the daemons it measures and stops them itself; the trap
# stops whatever a section leaves behind when this script is interrupted.
#
#   bash bench/run.sh BUILD_DIR [SECTION...]    (default: every section)
#
# Extra arguments for pushpull can be passed as PUSHPULL_ARGS="--json".
set -euo pipefail

if [ $# -lt 1 ]; then
    echo "usage: $0 BUILD_DIR [SECTION...]" >&2
    exit 2
fi
BUILD=$(cd "$1" && pwd)
shift

# The benchmark running now, so that the trap can stop it (it takes its psd
# down with it: psd dies with its parent).
child=
cleanup() {
    if [ -n "$child" ] && kill -0 "$child" 2>/dev/null; then
        kill -TERM "$child" 2>/dev/null || true
        wait "$child" 2>/dev/null || true
    fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Runs one benchmark in the background and waits for it, so that a signal
# reaches the trap at once instead of after the benchmark ends.
run() {
    "$@" &
    child=$!
    local rc=0
    wait "$child" || rc=$?
    child=
    return "$rc"
}

# push/pull throughput and latency against one psd, with the loopback-TCP and
# memcpy ceilings of this run; the full matrix (4K..64M x 1,2,4 streams).
section_pushpull() {
    # shellcheck disable=SC2086  # PUSHPULL_ARGS is a list of words
    run "$BUILD/bench/pushpull" --psd "$BUILD/server/psd" ${PUSHPULL_ARGS:-}
}

# the same through shared memory (ShmRef: how workerd moves tensors with a
# psd on its host); the ratios are still to raw TCP, memcpy is the bound.
section_pushpull_shm() {
    # shellcheck disable=SC2086
    run "$BUILD/bench/pushpull" --psd "$BUILD/server/psd" --shm \
        --sizes 1M,4M,64M --streams 1,2 ${PUSHPULL_ARGS:-}
}

# 4 MiB push+pull across a veth link shaped to 10 and 25 Gbit/s (two network
# namespaces, tc tbf with a 256 KB burst) beside raw TCP over the same link;
# without root each prints one line and the section passes as skipped.
section_pushpull_link() {
    local rate rc
    for rate in 10gbit 25gbit; do
        rc=0
        # shellcheck disable=SC2086
        run "$BUILD/bench/pushpull" --psd "$BUILD/server/psd" --link "$rate" \
            ${PUSHPULL_ARGS:-} || rc=$?
        [ "$rc" -eq 0 ] || [ "$rc" -eq 77 ] || return "$rc"
    done
}

# training throughput and accuracy: workerd against psd beside PyTorch at one
# thread, batch 64 and 256, and (f) the strategies with 2 workers
# (TRAIN_ARGS="--json" or "--quick" pass through).
section_train() {
    # shellcheck disable=SC2086  # TRAIN_ARGS is a list of words
    run /usr/bin/python3 "$(dirname "$0")/train.py" "$BUILD" --strategies ${TRAIN_ARGS:-}
}

# Gloo all-reduce on 2 and 4 processes over loopback beside raw TCP, through
# a real pscoord (ALLREDUCE_ARGS="--quick" passes through).
section_allreduce() {
    # shellcheck disable=SC2086
    run "$BUILD/bench/allreduce" --pscoord "$BUILD/coordinator/pscoord" ${ALLREDUCE_ARGS:-}
}

ALL_SECTIONS=(pushpull pushpull_shm pushpull_link allreduce train)

SECTIONS=("${ALL_SECTIONS[@]}")
if [ $# -gt 0 ]; then
    SECTIONS=("$@")
fi

failed=()
for s in "${SECTIONS[@]}"; do
    if ! declare -F "section_$s" >/dev/null; then
        echo "run.sh: no section '$s' (have: ${ALL_SECTIONS[*]})" >&2
        exit 2
    fi
    echo "=== bench: $s ==="
    start=$SECONDS
    if "section_$s"; then
        echo "=== $s: done in $((SECONDS - start)) s ==="
    else
        echo "=== $s: FAILED ===" >&2
        failed+=("$s")
    fi
    echo
done

if [ ${#failed[@]} -gt 0 ]; then
    echo "run.sh: failed sections: ${failed[*]}" >&2
    exit 1
fi
