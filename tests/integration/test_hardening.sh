#!/bin/bash
# The hardening the build promises (issue #13), read back from each built
# binary with binutils' readelf as the oracle:
#   - ELF type DYN: a position-independent executable (ASLR moves its code);
#   - a GNU_RELRO program header and BIND_NOW (FLAGS BIND_NOW or FLAGS_1
#     NOW) in the dynamic section: full RELRO, the GOT read-only from start;
#   - a GNU_STACK header without E: the stack is never executable;
#   - __stack_chk_fail imported: -fstack-protector-strong put canaries in;
#   - some glibc *_chk function imported (__memcpy_chk, __snprintf_chk...):
#     _FORTIFY_SOURCE is on. --no-fortify skips this one, for the builds that
#     leave it out (-O0 or a sanitizer: see meson.build).
#
# Usage: test_hardening.sh [--no-fortify] BINARY...
set -u

fortify=1
if [ "${1:-}" = --no-fortify ]; then
    fortify=0
    shift
fi
[ $# -gt 0 ] || { echo "usage: $0 [--no-fortify] BINARY..." >&2; exit 2; }
command -v readelf >/dev/null || { echo "test_hardening: readelf (binutils) is not installed" >&2; exit 2; }

tmp=$(mktemp -d "${TMPDIR:-/tmp}/hardening.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
. "$(dirname "$0")/checks.sh"

# check NAME DETAIL COMMAND...: ok when COMMAND succeeds, else FAIL with
# DETAIL.
check() {
    local name=$1 detail=$2
    shift 2
    if "$@"; then ok "$name"; else fail "$name" "$detail"; fi
}

for bin in "$@"; do
    b=$(basename "$bin")
    if ! timeout 60 readelf -W -h -l -d --dyn-syms "$bin" >"$tmp/$b" 2>"$tmp/$b.err"; then
        fail "$b: readelf" "$(head -1 "$tmp/$b.err")"
        continue
    fi
    type=$(sed -n 's/^ *Type: *\([A-Z]*\).*/\1/p' "$tmp/$b")
    check "$b: ELF type DYN (PIE)" "Type is '$type'" [ "$type" = DYN ]
    check "$b: GNU_RELRO program header" "no GNU_RELRO in readelf -l" \
        grep -q '^ *GNU_RELRO ' "$tmp/$b"
    check "$b: BIND_NOW (full RELRO)" "neither FLAGS BIND_NOW nor FLAGS_1 NOW in readelf -d" \
        grep -Eq '\((FLAGS)\) .*BIND_NOW|\((FLAGS_1)\) .*\bNOW\b' "$tmp/$b"
    stack=$(grep '^ *GNU_STACK ' "$tmp/$b")
    # The flags column holds R, W and E separated by spaces, before the
    # alignment (0x10).
    flags=$(echo "$stack" | sed -n 's/.* \([RWE ]\{3\}\) *0x[0-9a-f]*$/\1/p')
    check "$b: GNU_STACK not executable" "GNU_STACK is '${stack:-missing}'" \
        eval '[ -n "$flags" ] && [[ "$flags" != *E* ]]'
    check "$b: imports __stack_chk_fail" "no __stack_chk_fail in its dynamic symbols" \
        grep -Eq ' UND __stack_chk_fail(@|$)' "$tmp/$b"
    if [ $fortify = 1 ]; then
        chk=$(grep -Eo ' UND __[a-z0-9_]+_chk(@|$)' "$tmp/$b" | grep -v __stack_chk_fail |
              head -3 | tr -d ' @' | sed 's/^UND//' | tr '\n' ' ' | sed 's/ $//')
        check "$b: imports fortified *_chk functions (${chk:-none})" \
            "no __*_chk symbol but __stack_chk_fail: built without _FORTIFY_SOURCE" [ -n "$chk" ]
    fi
done

echo "hardening: $passed passed, $failed failed"
[ $failed -eq 0 ]
