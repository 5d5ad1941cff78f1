#!/usr/bin/env bash
# make demo: a local cluster on loopback (pscoord, two psd shards, two
# workerd, one evaluator) trains the MLP on Fashion-MNIST with a live
# progress line and a closing summary; no process is left behind, also on
# Ctrl-C (deploy/demo.py runs every task in its own process group and stops
# them all). The chief and the evaluator write TensorBoard event files; the
# demo prints the `tensorboard --logdir` command for its run.
set -euo pipefail
BUILD=${1:-build}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
exec /usr/bin/python3 "$ROOT/deploy/demo.py" "$ROOT/$BUILD" "${@:2}"
