#!/usr/bin/env bash
# make demo: a local psd on loopback, trained against by asynchronous
# workers on Fashion-MNIST, with progress, a summary, a checkpoint, and no
# process left behind (also on Ctrl-C).
set -euo pipefail
BUILD=${1:-build}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PSD=$ROOT/$BUILD/server/psd
PSCTL=$ROOT/$BUILD/tools/psctl
DATA=$(mktemp -d /tmp/psd-demo.XXXXXX)
PSD_PID=
cleanup() {
    [ -n "$PSD_PID" ] && kill "$PSD_PID" 2>/dev/null && wait "$PSD_PID" 2>/dev/null
    rm -rf "$DATA"
}
trap cleanup EXIT
trap 'echo "demo: interrupted"; exit 130' INT TERM

coproc PSDP { exec "$PSD" --data-dir "$DATA/ps0" --listen 127.0.0.1:0 --log-level warn; }
PSD_PID=$PSDP_PID
read -r -t 20 word PORT <&"${PSDP[0]}" || { echo "demo: psd did not start" >&2; exit 1; }
ADDR=127.0.0.1:$PORT
echo "demo: psd serving on $ADDR, data in $DATA/ps0"
/usr/bin/python3 "$ROOT/deploy/demo_train.py" "$ADDR" --epochs "${DEMO_EPOCHS:-3}" --workers 2
"$PSCTL" --server "$ADDR" checkpoint
"$PSCTL" --server "$ADDR" stats
echo "demo: stopping psd"
