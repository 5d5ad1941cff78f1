#!/bin/bash
# psctl against a real psd: every operator command (create, list, show, pull,
# checkpoint, restore, delete, stats, health) on a fresh server started on
# 127.0.0.1:0 with a temporary data directory, then the failures an operator
# meets (unknown variable, unreachable server, bad flags, unknown command,
# missing argument), each of which must exit with its status and print
# exactly one line on stderr naming the problem. Last, psd must exit 0 on
# SIGTERM.
#
# Usage: test_psctl.sh PSCTL PSD
set -u

psctl=${1:?usage: $0 PSCTL PSD}
psd=${2:?usage: $0 PSCTL PSD}
python=/usr/bin/python3

tmp=$(mktemp -d "${TMPDIR:-/tmp}/psctl-test.XXXXXX")
psd_pid=
cleanup() {
    if [ -n "$psd_pid" ] && kill -0 "$psd_pid" 2>/dev/null; then
        kill -KILL "$psd_pid" 2>/dev/null
        wait "$psd_pid" 2>/dev/null
    fi
    rm -rf "$tmp"
}
trap cleanup EXIT
# meson's timeout and ^C: exit through the EXIT trap, so psd never outlives us.
trap 'exit 143' TERM
trap 'exit 130' INT
unset PSD_ADDR

. "$(dirname "$0")/checks.sh"

# expect_ok NAME KEYWORD CMD...: CMD exits 0, prints nothing on stderr, and
# its stdout contains KEYWORD.
expect_ok() {
    local name=$1 keyword=$2
    shift 2
    run "$@"
    if [ "$rc" -ne 0 ]; then
        fail "$name" "exit status $rc, want 0: $(cat "$tmp/err")"
    elif [ -s "$tmp/err" ]; then
        fail "$name" "wrote to stderr: $(cat "$tmp/err")"
    elif ! grep -qF -- "$keyword" "$tmp/out"; then
        fail "$name" "stdout lacks '$keyword': $(cat "$tmp/out")"
    else
        ok "$name"
    fi
}

# field LABEL: the value after LABEL in psctl show's or stats' last output.
field() {
    sed -n "s/^$1  *//p" "$tmp/out" | head -n 1
}

# ---- start psd ----------------------------------------------------------

mkdir "$tmp/data"
"$psd" --data-dir "$tmp/data" --listen 127.0.0.1:0 --log-level warn \
    >"$tmp/psd.out" 2>"$tmp/psd.err" &
psd_pid=$!
port=
for _ in $(seq 200); do
    port=$(sed -n 's/^PORT \([0-9][0-9]*\)$/\1/p' "$tmp/psd.out")
    [ -n "$port" ] && break
    kill -0 "$psd_pid" 2>/dev/null || break
    sleep 0.1
done
if [ -z "$port" ]; then
    echo "FAIL start: psd did not print its port within 20 s: $(cat "$tmp/psd.err")"
    echo "psctl: 0 passed, 1 failed"
    exit 1
fi
addr=127.0.0.1:$port
# Every command below names the server explicitly, except the $PSD_ADDR check.
ctl=("$psctl" --server "$addr")

# ---- every command --------------------------------------------------------

expect_ok health SERVING "${ctl[@]}" health
expect_ok health-env SERVING env PSD_ADDR="$addr" "$psctl" health
expect_ok health-server-after SERVING "$psctl" health --server "$addr"

expect_ok create-new 'created w' "${ctl[@]}" create w --shape 3,4 --init constant:2.0
expect_ok create-identical 'w exists (identical spec), version 0' \
    "${ctl[@]}" create w --shape 3,4 --init constant:2.0
expect_err create-different 1 \
    "psctl: create: ALREADY_EXISTS: variable 'w' already exists with a different spec" \
    "${ctl[@]}" create w --shape 3,5 --init constant:2.0
expect_ok create-adam 'created emb' "${ctl[@]}" create emb --shape 64,32 \
    --init glorot_uniform --init-seed 7 --optimizer adam --lr 0.001 --beta2 0.99
expect_ok create-sync 'created m' "${ctl[@]}" create m --shape 10 \
    --optimizer nesterov --momentum 0.5 --consistency sync --workers 2 \
    --init normal:0,0.05

run "${ctl[@]}" list
if [ "$rc" -ne 0 ]; then
    fail list "exit status $rc: $(cat "$tmp/err")"
elif ! grep -qE '^NAME +SHAPE +DTYPE +OPTIMIZER +CONSISTENCY +VERSION +BYTES$' "$tmp/out"; then
    fail list "no header: $(cat "$tmp/out")"
elif ! grep -qE '^w +\(3, 4\) +float32 +sgd +async +0 +48 B$' "$tmp/out"; then
    fail list "no line for w: $(cat "$tmp/out")"
elif ! grep -qE '^emb +\(64, 32\) +float32 +adam +async +0 +24\.0 KiB$' "$tmp/out"; then
    fail list "no line for emb: $(cat "$tmp/out")"
elif ! grep -qE '^m +\(10,\) +float32 +nesterov +sync\(2\) +0 +80 B$' "$tmp/out"; then
    fail list "no line for m: $(cat "$tmp/out")"
elif [ "$(wc -l <"$tmp/out")" -ne 4 ]; then
    fail list "want a header and 3 lines: $(cat "$tmp/out")"
else
    ok list
fi
# Aligned: each left-aligned column starts where its header word does, and
# each right-aligned one (VERSION, BYTES) ends where its header word ends.
if [ "$(wc -l <"$tmp/out")" -ge 2 ] && awk 'NR == 1 {
            n = split("NAME SHAPE DTYPE OPTIMIZER CONSISTENCY VERSION BYTES", h, " ")
            for (i = 1; i <= n; i++) { s[i] = index($0, h[i]); e[i] = s[i] + length(h[i]) - 1 }
            next
        }
        {
            for (i = 2; i <= 5; i++)
                if (substr($0, s[i] - 1, 1) != " " || substr($0, s[i], 1) == " ") bad = 1
            if (substr($0, e[6], 1) == " " || substr($0, e[6] + 1, 1) != " ") bad = 1
            if (length($0) != e[7]) bad = 1
        }
        END { exit bad }' "$tmp/out"; then
    ok list-aligned
else
    fail list-aligned "columns do not line up: $(cat "$tmp/out")"
fi

run "${ctl[@]}" show w
norm=$(field 'l2 norm')
if [ "$rc" -ne 0 ]; then
    fail show "exit status $rc: $(cat "$tmp/err")"
elif [ "$(field shape)" != "(3, 4)" ]; then
    fail show "shape is '$(field shape)', want '(3, 4)': $(cat "$tmp/out")"
elif [ "$(awk -v n="$norm" 'BEGIN { printf "%.4f", n }')" != 6.9282 ]; then
    fail show "l2 norm is '$norm', want 2*sqrt(12) = 6.9282: $(cat "$tmp/out")"
elif [ "$(field min)" != 2 ] || [ "$(field max)" != 2 ] || [ "$(field mean)" != 2 ]; then
    fail show "min/max/mean want 2: $(cat "$tmp/out")"
elif [ "$(field dtype)" != float32 ] || [ "$(field version)" != 0 ]; then
    fail show "dtype/version: $(cat "$tmp/out")"
elif [ "$(field optimizer)" != "sgd (learning_rate 0.01)" ]; then
    fail show "optimizer is '$(field optimizer)': $(cat "$tmp/out")"
elif [ "$(field initializer)" != "constant (value 2)" ]; then
    fail show "initializer is '$(field initializer)': $(cat "$tmp/out")"
elif [ "$(field 'value bytes')" != "48 B" ] || [ "$(field 'slot bytes')" != "0 B" ]; then
    fail show "value/slot bytes: $(cat "$tmp/out")"
else
    ok show
fi

run "${ctl[@]}" show emb
emb_norm=$(field 'l2 norm')
if [ "$rc" -ne 0 ]; then
    fail show-adam "exit status $rc: $(cat "$tmp/err")"
elif [ "$(field optimizer)" != "adam (learning_rate 0.001, beta1 0.9, beta2 0.99, epsilon 1e-07)" ]; then
    fail show-adam "optimizer is '$(field optimizer)'"
elif [ "$(field initializer)" != "glorot_uniform (seed 7)" ]; then
    fail show-adam "initializer is '$(field initializer)'"
elif [ "$(field 'slot bytes')" != "16.0 KiB (16384 bytes)" ]; then
    fail show-adam "slot bytes are '$(field 'slot bytes')'"
else
    ok show-adam
fi
expect_ok show-sync 'sync (2 workers per step)' "${ctl[@]}" show m
expect_ok show-nesterov 'nesterov (learning_rate 0.01, momentum 0.5)' "${ctl[@]}" show m
# FTRL's flags reach the spec (then it goes, so the counts below hold).
expect_ok create-ftrl 'created wide' "${ctl[@]}" create wide --shape 100 \
    --optimizer ftrl --lr 0.05 --l1 0.01 --l2-shrinkage 0.5 --beta 1
expect_ok show-ftrl 'ftrl (learning_rate 0.05, initial_accumulator 0.1, learning_rate_power -0.5, l1 0.01, l2 0, l2_shrinkage 0.5, beta 1)' \
    "${ctl[@]}" show wide
expect_err ftrl-flag-on-adam 2 '--l1, --l2, --l2-shrinkage or --beta applies to --optimizer ftrl only, not adam' \
    "${ctl[@]}" create x --shape 1 --optimizer adam --l1 0.1
expect_ok delete-ftrl 'deleted wide' "${ctl[@]}" delete wide
expect_ok create-bounded 'created b' "${ctl[@]}" create b --shape 3 \
    --consistency bounded --staleness 4
expect_ok show-bounded 'bounded(4)' "${ctl[@]}" show b
expect_err staleness-on-sync 2 '--staleness applies to --consistency bounded only' \
    "${ctl[@]}" create x --shape 1 --consistency sync --staleness 2
expect_ok delete-bounded 'deleted b' "${ctl[@]}" delete b

expect_ok pull "wrote $tmp/w.npy (shape (3, 4), version 0)" \
    "${ctl[@]}" pull w -o "$tmp/w.npy"
if timeout 60 "$python" -c '
import sys
import numpy as np
a = np.load(sys.argv[1])
assert a.shape == (3, 4), a.shape
assert a.dtype == np.float32, a.dtype
assert (a == 2.0).all(), a
' "$tmp/w.npy" 2>"$tmp/py.err"; then
    ok pull-numpy
else
    fail pull-numpy "numpy does not load the right array: $(cat "$tmp/py.err")"
fi
# show's norm is the norm numpy computes of the same pulled value.
expect_ok pull-output-flag "wrote $tmp/emb.npy (shape (64, 32), version 0)" \
    "${ctl[@]}" pull --output "$tmp/emb.npy" emb
if timeout 60 "$python" -c '
import sys
import numpy as np
a = np.load(sys.argv[1])
assert a.shape == (64, 32), a.shape
n = float(np.linalg.norm(a.astype(np.float64)))
assert abs(n - float(sys.argv[2])) <= 1e-4 * max(1.0, n), (n, sys.argv[2])
assert 0 < np.abs(a).max() <= (6 / 96) ** 0.5, np.abs(a).max()
' "$tmp/emb.npy" "$emb_norm" 2>"$tmp/py.err"; then
    ok pull-norm-matches-show
else
    fail pull-norm-matches-show "$(cat "$tmp/py.err")"
fi

expect_ok checkpoint "checkpoint step 7: $tmp/data/checkpoints/7 (" \
    "${ctl[@]}" checkpoint --step 7
if [ -d "$tmp/data/checkpoints/7" ]; then
    ok checkpoint-dir
else
    fail checkpoint-dir "$tmp/data/checkpoints/7 does not exist"
fi
expect_ok create-after-checkpoint 'created later' "${ctl[@]}" create later --shape 2
expect_ok restore 'restored step 7: 3 variables' "${ctl[@]}" restore
run "${ctl[@]}" list
if [ "$rc" -eq 0 ] && ! grep -q '^later ' "$tmp/out" && grep -q '^w ' "$tmp/out"; then
    ok restore-list
else
    fail restore-list "after restore, want w and no 'later': $(cat "$tmp/out" "$tmp/err")"
fi
expect_ok restore-step 'restored step 7: 3 variables' "${ctl[@]}" restore --step 7

# delete: gone from the list, its bytes named; a second delete is NOT_FOUND.
expect_ok create-doomed 'created doomed' "${ctl[@]}" create doomed --shape 5 \
    --optimizer adam
expect_ok delete 'deleted doomed (version 0, 60 B freed)' "${ctl[@]}" delete doomed
run "${ctl[@]}" list
if [ "$rc" -eq 0 ] && ! grep -q '^doomed ' "$tmp/out" && grep -q '^w ' "$tmp/out"; then
    ok delete-list
else
    fail delete-list "after delete, want w and no 'doomed': $(cat "$tmp/out" "$tmp/err")"
fi
expect_err delete-again 1 \
    "psctl: delete: NOT_FOUND: DeleteVariable: variable 'doomed' does not exist" \
    "${ctl[@]}" delete doomed
expect_err delete-missing-name 2 'psctl: delete: missing NAME' "${ctl[@]}" delete

run "${ctl[@]}" stats
if [ "$rc" -ne 0 ]; then
    fail stats "exit status $rc: $(cat "$tmp/err")"
elif [ "$(field variables)" != 3 ]; then
    fail stats "variables is '$(field variables)', want 3: $(cat "$tmp/out")"
elif [ "$(field 'last checkpoint step')" != 7 ]; then
    fail stats "last checkpoint step: $(cat "$tmp/out")"
elif ! grep -qE '^memory ratio +-?[0-9]+\.[0-9]+ ' "$tmp/out"; then
    fail stats "no memory ratio: $(cat "$tmp/out")"
elif ! grep -qE '^resident +[0-9.]+ (KiB|MiB|GiB)$' "$tmp/out"; then
    fail stats "resident not in KiB/MiB: $(cat "$tmp/out")"
else
    missing=
    for label in 'value bytes' 'slot bytes' pushes pulls 'bytes received' \
        'bytes sent' 'stale pushes refused' 'nonfinite refused' \
        'bad requests' commits 'fixed overhead' uptime; do
        grep -q "^$label  " "$tmp/out" || missing="$missing '$label'"
    done
    if [ -n "$missing" ]; then
        fail stats "lacks$missing: $(cat "$tmp/out")"
    else
        ok stats
    fi
fi

expect_ok help-show '--rpc-timeout' "${ctl[@]}" show --help
expect_ok help-create '--consistency' "${ctl[@]}" create --help
expect_ok help-top 'checkpoint' "$psctl" --help

# ---- failures -----------------------------------------------------------

expect_err show-unknown 1 \
    "psctl: show: NOT_FOUND: Pull: variable 'nope' does not exist" \
    "${ctl[@]}" show nope
expect_err pull-unknown 1 "psctl: pull: NOT_FOUND:" \
    "${ctl[@]}" pull nope -o "$tmp/nope.npy"
expect_err unreachable 1 'psctl: cannot reach psd at 127.0.0.1:1: UNAVAILABLE' \
    "$psctl" --server 127.0.0.1:1 list
expect_err unreachable-health 1 'psctl: cannot reach psd at 127.0.0.1:1: UNAVAILABLE' \
    "$psctl" health --server 127.0.0.1:1
expect_err bad-server 2 "--server: 'nohost' is not HOST:PORT" \
    "$psctl" --server nohost stats
expect_err bad-shape-zero 2 '--shape: dimension 0 is 0' \
    "${ctl[@]}" create x --shape 0,3
expect_err bad-shape-text 2 "--shape: '3,a' is not a list of dimensions" \
    "${ctl[@]}" create x --shape 3,a
expect_err bad-optimizer 2 "--optimizer: 'foo' is not one of" \
    "${ctl[@]}" create x --shape 3 --optimizer foo
expect_err bad-lr 2 "--lr: 'abc' is not a number" \
    "${ctl[@]}" create x --shape 3 --lr abc
expect_err bad-init 2 "--init: unknown initializer 'gaussian'" \
    "${ctl[@]}" create x --shape 3 --init gaussian
expect_err bad-init-params 2 '--init: uniform takes MIN,MAX' \
    "${ctl[@]}" create x --shape 3 --init uniform:1
expect_err flag-not-applicable 2 '--beta1 applies to --optimizer adam only' \
    "${ctl[@]}" create x --shape 3 --beta1 0.5
expect_err server-refuses-lr 1 \
    "psctl: create: INVALID_ARGUMENT: variable 'x': optimizer: learning_rate" \
    "${ctl[@]}" create x --shape 3 --lr -1
expect_err bad-timeout 2 '--rpc-timeout:' "${ctl[@]}" list --rpc-timeout soon
expect_err unknown-option 2 "unknown option '--bogus'" "${ctl[@]}" list --bogus
expect_err unknown-command 2 "unknown command 'frobnicate'" "${ctl[@]}" frobnicate
expect_err missing-name 2 'psctl: show: missing NAME' "${ctl[@]}" show
expect_err missing-output 2 'psctl: pull: -o FILE is required' "${ctl[@]}" pull w
expect_err missing-shape 2 'psctl: create: --shape is required' "${ctl[@]}" create x
expect_err extra-argument 2 "psctl: show: unexpected argument 'v'" "${ctl[@]}" show w v
expect_err restore-missing 1 'psctl: restore: NOT_FOUND: Restore: checkpoint 999' \
    "${ctl[@]}" restore --step 999
expect_err no-command 2 'no command given' "$psctl" --server "$addr"
run "${ctl[@]}" list
if [ "$rc" -eq 0 ] && ! grep -q '^x ' "$tmp/out"; then
    ok refused-creates-left-nothing
else
    fail refused-creates-left-nothing "$(cat "$tmp/out" "$tmp/err")"
fi

# ---- psd exits 0 on SIGTERM ---------------------------------------------

kill -TERM "$psd_pid"
for _ in $(seq 200); do
    kill -0 "$psd_pid" 2>/dev/null || break
    sleep 0.1
done
if kill -0 "$psd_pid" 2>/dev/null; then
    fail psd-sigterm "psd still running 20 s after SIGTERM"
else
    wait "$psd_pid"
    status=$?
    psd_pid=
    if [ "$status" -eq 0 ]; then
        ok psd-sigterm
    else
        fail psd-sigterm "psd exited $status: $(tail -n 5 "$tmp/psd.err")"
    fi
fi

echo "psctl: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
