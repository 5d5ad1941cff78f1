#!/bin/bash
# `meson install` as a user would run it, into a temporary DESTDIR: the four
# programs, libpsclient with its headers and psclient.pc, the .proto files,
# the units (ExecStart at this install's bindir), example configuration,
# man pages, bash completion and the LICENSE. Then the installed library is
# used as an outside program would: examples/c/linreg.c compiled with
# `pkg-config --cflags --libs psclient` alone, run against a real psd on
# 127.0.0.1:0, must fit y = 3x - 2; the completion, sourced in bash,
# completes psd's flags; each man page renders.
# Usage: test_install.sh MESON BUILD_DIR PREFIX LIBDIR PSD
set -u
meson=$1 build=$2 prefix=$3 libdir=$4 psd=$5
tmp=$(mktemp -d /tmp/ps-install.XXXXXX)
psd_pid=
cleanup() {
    [ -n "$psd_pid" ] && kill -9 "$psd_pid" 2>/dev/null
    rm -rf "$tmp"
}
trap cleanup EXIT
. "$(dirname "$0")/checks.sh"

root=$tmp/root
if timeout 120 "$meson" install -C "$build" --destdir "$root" --no-rebuild --quiet \
        >"$tmp/install.log" 2>&1; then
    ok "meson install --destdir succeeds"
else
    fail "meson install" "$(tail -5 "$tmp/install.log")"
fi
P=$root$prefix
case $libdir in /*) L=$root$libdir ;; *) L=$P/$libdir ;; esac
for f in bin/psd bin/pscoord bin/workerd bin/psctl \
         include/psd/common/psclient.h include/psd/proto/ps.pb-c.h \
         share/psd/proto/ps.proto share/psd/proto/health.proto \
         lib/systemd/system/psd@.service lib/systemd/system/workerd@.service \
         lib/systemd/system/pscoord.service \
         share/psd/examples/psd-0.json share/psd/examples/workerd-0.json \
         share/psd/examples/cluster.json share/psd/examples/linreg.c \
         share/man/man1/psd.1 share/man/man1/pscoord.1 share/man/man1/workerd.1 \
         share/man/man1/psctl.1 share/bash-completion/completions/psd \
         share/bash-completion/completions/psctl share/doc/psd/LICENSE; do
    if [ -s "$P/$f" ]; then ok "installed $f"; else fail "installed $f" "missing or empty"; fi
done
for u in psd@ workerd@ pscoord; do
    if grep -q "^ExecStart=$prefix/bin/" "$P/lib/systemd/system/$u.service"; then
        ok "$u.service starts the program from $prefix/bin"
    else
        fail "$u.service ExecStart" "$(grep ^ExecStart "$P/lib/systemd/system/$u.service")"
    fi
done

# The library, as an outside program uses it: nothing but pkg-config's word.
# PKG_CONFIG_SYSROOT_DIR: the .pc file names $prefix; the files are in $root.
pc=$(PKG_CONFIG_PATH=$L/pkgconfig PKG_CONFIG_SYSROOT_DIR=$root \
     pkg-config --cflags --libs psclient 2>&1)
if [ $? -eq 0 ]; then ok "pkg-config knows psclient"; else fail "pkg-config psclient" "$pc"; fi
if cc "$P/share/psd/examples/linreg.c" $pc -o "$tmp/linreg" 2>"$tmp/cc.err"; then
    ok "examples/c/linreg.c builds against the installed header and library"
else
    fail "linreg.c builds" "$(head -5 "$tmp/cc.err")"
fi
if nm -D --defined-only "$L/libpsclient.so" | awk '{print $3}' | grep -qv '^ps_\|^ps__'; then
    fail "libpsclient exports" "$(nm -D --defined-only "$L/libpsclient.so" | awk '{print $3}' | grep -v '^ps_' | head -3)"
else
    ok "libpsclient exports only ps_* and ps__* names"
fi
"$psd" --data-dir "$tmp/data" --listen 127.0.0.1:0 --log-level warn >"$tmp/psd.out" 2>&1 &
psd_pid=$!
for _ in $(seq 100); do grep -q '^PORT ' "$tmp/psd.out" && break; sleep 0.1; done
port=$(awk '/^PORT /{print $2; exit}' "$tmp/psd.out")
out=$(LD_LIBRARY_PATH=$L timeout 60 "$tmp/linreg" "127.0.0.1:$port" 2>&1)
if echo "$out" | awk '{ exit !($1 == "w" && $2 > 2.95 && $2 < 3.05 && $4 > -2.05 && $4 < -1.95) }'; then
    ok "linreg against psd fits w = 3, b = -2: $out"
else
    fail "linreg against psd" "$out"
fi
out=$(LD_LIBRARY_PATH=$L timeout 30 "$tmp/linreg" "127.0.0.1:1" 2>&1)
if [ $? -eq 1 ] && [ "$(echo "$out" | wc -l)" -eq 1 ]; then
    ok "linreg with no psd there: one line, exit 1 ($out)"
else
    fail "linreg with no psd" "$out"
fi

# Bash completion from the installed file: psd's flags from its --help,
# psctl's commands, and a command's own options.
comp() {  # comp LINE...: the completions bash offers for the last word
    PATH=$P/bin:$PATH bash -c '
        . "$1"; shift
        COMP_WORDS=("$@"); COMP_CWORD=$(($# - 1))
        _ps_complete "$1"; printf "%s\n" "${COMPREPLY[@]}"' _ \
        "$P/share/bash-completion/completions/psd" "$@"
}
got=$(comp psd --data-d)
if [ "$got" = "--data-dir" ]; then ok "completion: psd --data-d -> --data-dir"; else fail "completion psd" "$got"; fi
got=$(comp psctl chec)
if [ "$got" = "checkpoint" ]; then ok "completion: psctl chec -> checkpoint"; else fail "completion psctl" "$got"; fi
got=$(comp psctl restore --st)
if echo "$got" | grep -qx -- '--step'; then ok "completion: psctl restore --st offers --step"; else fail "completion psctl restore" "$got"; fi

for m in psd pscoord workerd psctl; do
    if MANWIDTH=80 man -l "$P/share/man/man1/$m.1" 2>/dev/null | grep -q -- '--help'; then
        ok "man $m renders and lists its options"
    else
        fail "man $m" "does not render"
    fi
done
echo "install: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
