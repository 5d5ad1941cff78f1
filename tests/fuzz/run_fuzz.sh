#!/bin/bash
# run_fuzz.sh FUZZER SEEDER KIND ARTIFACTS [libFuzzer options...]
#
# One short, bounded fuzz campaign, as a meson test: the corpus starts from
# the seeds SEEDER writes for KIND (fuzz_seeds) in a temporary directory, so
# the repository is never written; a crashing input is kept under ARTIFACTS
# (crash-*, leak-*, timeout-*, oom-*), and libFuzzer's exit status is the
# test's.
set -euo pipefail

fuzzer=$1 seeder=$2 kind=$3 artifacts=$4
shift 4

work=$(mktemp -d "${TMPDIR:-/tmp}/psd-fuzz-corpus.XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir -p "$artifacts"
"$seeder" "$kind" "$work"

rc=0
# libFuzzer exits 77 on a crash by default, which meson reads as SKIP: a
# crash must fail the test.
"$fuzzer" -artifact_prefix="$artifacts/" -print_final_stats=1 -error_exitcode=1 \
    -timeout_exitcode=1 "$@" "$work" || rc=$?
if [ "$rc" -ne 0 ]; then
    echo "run_fuzz.sh: $(basename "$fuzzer") failed (exit $rc); inputs kept in $artifacts:" >&2
    ls -l "$artifacts" >&2 || true
fi
exit "$rc"
