#!/bin/sh
# pscerts - makes a CA and a certificate per task for psd, pscoord,
# workerd and psctl (doc/security.md, "Transport security (TLS)").
#
#   pscerts --out DIR [--days N] [--new-ca] [--tokens] NAME[=SAN,SAN...]...
#
# DIR/ca.pem and DIR/ca.key: the CA (made on first use, reused after, so
# that tasks can be added later; --new-ca makes a fresh one). For each NAME,
# DIR/NAME.pem and DIR/NAME.key: a certificate with CN=NAME and the subject
# alternative names NAME and each SAN (an IPv4 or IPv6 address is an IP
# SAN, anything else a DNS name), usable both to serve (serverAuth) and to
# call other daemons with mutual TLS (clientAuth). Keys are P-256, mode 0600.
#
# --tokens also makes DIR/tokens/: one token per role (reader, worker,
# operator: 256 random bits each, from openssl rand) in a file of that name
# holding "ROLE TOKEN", for a client's --token-file, and DIR/tokens/server
# holding the three lines, for psd's and pscoord's --tokens; all mode 0600.
# Tokens already there are kept (a restart must not lock tasks out).
#
# Why the openssl command rather than libcrypto in psctl: the certificates
# are made once per cluster, by an operator or a deploy script, where the
# openssl command is always at hand (Debian's "openssl" package); psctl
# stays free of a second crypto library, and the tests use the same
# command as their oracle (openssl verify).
#
# Exit status: 0, 1 when openssl fails, 2 for a bad command line.
set -eu

usage() {
    echo "usage: pscerts --out DIR [--days N] [--new-ca] [--tokens] NAME[=SAN,SAN...]..." >&2
    exit 2
}

out="" days=825 new_ca=0 tokens=0
while [ $# -gt 0 ]; do
    case "$1" in
    --out) [ $# -ge 2 ] || usage; out=$2; shift 2 ;;
    --out=*) out=${1#--out=}; shift ;;
    --days) [ $# -ge 2 ] || usage; days=$2; shift 2 ;;
    --days=*) days=${1#--days=}; shift ;;
    --new-ca) new_ca=1; shift ;;
    --tokens) tokens=1; shift ;;
    -h|--help) sed -n '2,26p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    --) shift; break ;;
    -*) echo "pscerts: unknown option '$1'" >&2; usage ;;
    *) break ;;
    esac
done
[ -n "$out" ] || { echo "pscerts: --out DIR is required" >&2; exit 2; }
[ $# -gt 0 ] || { echo "pscerts: name at least one task (NAME[=SAN,...])" >&2; exit 2; }
case "$days" in ''|*[!0-9]*) echo "pscerts: --days '$days' is not a number of days" >&2; exit 2 ;; esac
command -v openssl >/dev/null 2>&1 || { echo "pscerts: the openssl command is missing (apt-get install openssl)" >&2; exit 1; }

for spec in "$@"; do
    name=${spec%%=*}
    case "$name" in
    ''|*[!A-Za-z0-9._-]*|.*) echo "pscerts: '$name' is not a task name (letters, digits, . _ -)" >&2; exit 2 ;;
    esac
done

umask 077
mkdir -p "$out"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# Moves $tmp/$1.key and $tmp/$1.pem into $out (the certificate readable by
# all) and says "made $2".
install_pair() {
    mv "$tmp/$1.key" "$out/$1.key"
    mv "$tmp/$1.pem" "$out/$1.pem"
    chmod 644 "$out/$1.pem"
    echo "pscerts: made $2"
}

if [ "$new_ca" = 1 ] || [ ! -s "$out/ca.pem" ] || [ ! -s "$out/ca.key" ]; then
    openssl req -x509 -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 \
        -nodes -keyout "$tmp/ca.key" -out "$tmp/ca.pem" -days "$days" \
        -subj "/CN=psd cluster CA $(date -u +%Y%m%dT%H%M%SZ)-$(openssl rand -hex 4)" \
        -addext "basicConstraints=critical,CA:TRUE" \
        -addext "keyUsage=critical,keyCertSign,cRLSign" 2>"$tmp/err" ||
        { echo "pscerts: openssl could not make the CA: $(tail -1 "$tmp/err")" >&2; exit 1; }
    install_pair ca "the CA $out/ca.pem"
fi

is_ip() {
    case "$1" in
    *:*) return 0 ;;
    *[!0-9.]*) return 1 ;;
    *.*.*.*) return 0 ;;
    *) return 1 ;;
    esac
}

for spec in "$@"; do
    name=${spec%%=*}
    sans="DNS:$name"
    if [ "$spec" != "$name" ]; then
        rest=${spec#*=}
        old_ifs=$IFS
        IFS=,
        for san in $rest; do
            [ -n "$san" ] || continue
            if is_ip "$san"; then sans="$sans,IP:$san"; else sans="$sans,DNS:$san"; fi
        done
        IFS=$old_ifs
    fi
    cat >"$tmp/ext" <<EOF
basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth,clientAuth
subjectAltName=$sans
EOF
    openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
        -keyout "$tmp/$name.key" -out "$tmp/$name.csr" -subj "/CN=$name" 2>"$tmp/err" &&
    openssl x509 -req -in "$tmp/$name.csr" -CA "$out/ca.pem" -CAkey "$out/ca.key" \
        -set_serial "0x$(openssl rand -hex 16)" -days "$days" -extfile "$tmp/ext" \
        -out "$tmp/$name.pem" 2>"$tmp/err" ||
        { echo "pscerts: openssl could not make $name's certificate: $(tail -1 "$tmp/err")" >&2; exit 1; }
    install_pair "$name" "$out/$name.pem ($sans)"
done

if [ "$tokens" = 1 ]; then
    mkdir -p "$out/tokens"
    if [ ! -s "$out/tokens/server" ]; then
        for role in reader worker operator; do
            echo "$role $(openssl rand -hex 32)" >"$tmp/$role" ||
                { echo "pscerts: openssl could not make a token" >&2; exit 1; }
        done
        for role in reader worker operator; do mv "$tmp/$role" "$out/tokens/$role"; done
        cat "$out/tokens/reader" "$out/tokens/worker" "$out/tokens/operator" >"$tmp/server"
        mv "$tmp/server" "$out/tokens/server"
        echo "pscerts: made tokens for reader, worker, operator in $out/tokens"
    fi
fi
