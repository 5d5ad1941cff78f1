# checks.sh - what the shell tests share: counters, one line per result,
# and what a failing command must look like. Sourced by test_psctl.sh,
# test_cluster_badinput.sh and test_hardening.sh, which set $tmp first.

passed=0
failed=0

ok() {
    echo "ok   $1"
    passed=$((passed + 1))
}

fail() {
    echo "FAIL $1: $2"
    failed=$((failed + 1))
}

# run CMD...: runs a psctl command, bounded in time, leaving its status in
# $rc, its stdout in $tmp/out and its stderr in $tmp/err.
run() {
    timeout 60 "$@" >"$tmp/out" 2>"$tmp/err"
    rc=$?
}

# expect_err NAME STATUS KEYWORD CMD...: CMD exits STATUS with exactly one
# stderr line that starts "psctl: " and contains KEYWORD, and nothing on
# stdout.
expect_err() {
    local name=$1 want=$2 keyword=$3
    shift 3
    run "$@"
    local lines
    lines=$(wc -l <"$tmp/err")
    if [ "$rc" -ne "$want" ]; then
        fail "$name" "exit status $rc, want $want: $(cat "$tmp/err")"
    elif [ "$lines" -ne 1 ]; then
        fail "$name" "$lines stderr lines, want 1: $(cat "$tmp/err")"
    elif ! grep -q '^psctl: ' "$tmp/err"; then
        fail "$name" "stderr does not start with 'psctl: ': $(cat "$tmp/err")"
    elif ! grep -qF -- "$keyword" "$tmp/err"; then
        fail "$name" "stderr lacks '$keyword': $(cat "$tmp/err")"
    elif [ -s "$tmp/out" ]; then
        fail "$name" "wrote to stdout on failure: $(cat "$tmp/out")"
    else
        ok "$name"
    fi
}
