#!/bin/bash
# psctl cluster validate on malformed specs: each must exit 1 with exactly one
# line on stderr that names the problem. A valid spec (from a file or from
# TF_CONFIG) exits 0, and a wrong command line exits 2.
#
# Usage: test_cluster_badinput.sh PSCTL
set -u

psctl=${1:?usage: $0 PSCTL}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/cluster-badinput.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
unset TF_CONFIG

. "$(dirname "$0")/checks.sh"

# bad NAME KEYWORD JSON: the spec in a file must be refused with one stderr
# line "psctl: ..." containing KEYWORD.
bad() {
    local name=$1 keyword=$2 json=$3
    printf '%s' "$json" >"$tmp/$name.json"
    expect_err "$name" 1 "$keyword" "$psctl" cluster validate "$tmp/$name.json"
}

# expect NAME STATUS KEYWORD CMD...: CMD exits STATUS and its output (stdout
# for 0, stderr otherwise) contains KEYWORD; a failure says one line.
expect() {
    local name=$1 want=$2 keyword=$3
    shift 3
    run "$@"
    local stream="$tmp/out"
    [ "$want" -ne 0 ] && stream="$tmp/err"
    if [ "$rc" -ne "$want" ]; then
        fail "$name" "exit status $rc, want $want: $(cat "$tmp/err")"
    elif [ "$want" -ne 0 ] && [ "$(wc -l <"$tmp/err")" -ne 1 ]; then
        fail "$name" "want one stderr line: $(cat "$tmp/err")"
    elif ! grep -qF -- "$keyword" "$stream"; then
        fail "$name" "output lacks '$keyword': $(cat "$stream")"
    else
        ok "$name"
    fi
}

bad not-json        'not valid JSON at line 1'   '{"cluster": {"worker": [h1:2222]}}'
bad truncated       'not valid JSON'             '{"cluster": {'
bad empty-file      'not valid JSON'             ''
bad not-object      'must be a JSON object'      '["h1:2222"]'
bad no-cluster      "key 'cluster' is missing"   '{"task": {"type": "worker", "index": 0}}'
bad cluster-list    "'cluster' must be an object" '{"cluster": ["h1:2222"]}'
bad unknown-role    "unknown role 'master'"      '{"cluster": {"master": ["h1:2222"]}}'
bad role-not-list   'cluster.worker must be a list' '{"cluster": {"worker": "h1:2222"}}'
bad addr-not-string 'worker[1] must be a "host:port" string' '{"cluster": {"worker": ["h1:2222", 7]}}'
bad no-port         "address 'h1' has no port"   '{"cluster": {"worker": ["h1"]}}'
bad port-zero       'out of range 1..65535'      '{"cluster": {"ps": ["h1:0"]}}'
bad port-high       "port 65536 in 'h1:65536' is out of range" '{"cluster": {"ps": ["h1:65536"]}}'
bad v6-no-brackets  'IPv6 without brackets'      '{"cluster": {"ps": ["::1:2222"]}}'
bad duplicate       "ps[1] and worker[0] both use 'h:2222'" \
    '{"cluster": {"ps": ["a:1", "h:2222"], "worker": ["h:2222"]}}'
bad two-chiefs      'cluster has 2 chiefs'       '{"cluster": {"chief": ["a:1", "b:1"]}}'
bad no-tasks        'cluster lists no tasks'     '{"cluster": {"ps": []}}'
bad task-type       "task type 'master' is not a role" \
    '{"cluster": {"worker": ["a:1"]}, "task": {"type": "master", "index": 0}}'
bad task-range      'task worker[3] but the cluster has 2 workers' \
    '{"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker", "index": 3}}'
bad task-negative   'task index -1 is negative' \
    '{"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": -1}}'
bad task-no-type    'task.type is missing'       '{"cluster": {"worker": ["a:1"]}, "task": {"index": 0}}'
bad job-id-empty    'job_id must be a non-empty string' '{"cluster": {"worker": ["a:1"]}, "job_id": ""}'
bad job-id-number   'job_id must be a non-empty string' '{"cluster": {"worker": ["a:1"]}, "job_id": 3}'
bad unknown-key     "unknown key 'tsak'"         '{"cluster": {"worker": ["a:1"]}, "tsak": {}}'

valid='{"cluster": {"chief": ["h0:2222"], "worker": ["h1:2222", "h2:2222"],
 "ps": ["[::1]:2223"]}, "task": {"type": "worker", "index": 1}, "job_id": "j42"}'
printf '%s' "$valid" >"$tmp/valid.json"
expect valid-file 0 'task       worker[1] at h2:2222' "$psctl" cluster validate "$tmp/valid.json"
expect valid-env  0 'TF_CONFIG: valid cluster spec, 4 tasks' \
    env TF_CONFIG="$valid" "$psctl" cluster validate
expect bad-env    1 'TF_CONFIG: cluster has 2 chiefs' \
    env TF_CONFIG='{"cluster": {"chief": ["a:1", "b:1"]}}' "$psctl" cluster validate
expect no-env     1 'TF_CONFIG is not set' "$psctl" cluster validate
expect missing    1 'No such file or directory' "$psctl" cluster validate "$tmp/missing.json"
expect bad-flag   2 "unknown option '--bogus'" "$psctl" --bogus cluster validate
expect bad-cmd    2 "unknown command 'frobnicate'" "$psctl" frobnicate
expect two-files  2 'at most one FILE' "$psctl" cluster validate "$tmp/valid.json" "$tmp/valid.json"
expect help       0 'cluster validate' "$psctl" --help
expect version    0 'psctl ' "$psctl" --version

echo "cluster-badinput: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
