#!/bin/sh
# make-secrets.sh - the Secrets of deploy/k8s (and of tfjob.yaml), one per
# role, each holding only what that role's pods need (deploy/ps-bundle.sh):
# ca.pem, the role's tls.pem and tls.key, the role's own token, and for the
# servers (pscoord, psd) the role table as SHA-256 hashes.
#
#   deploy/k8s/make-secrets.sh [--namespace NS] OUT
#
# OUT/ca/ keeps the CA's key and the tokens: keep it off the cluster (run
# again with the same OUT to renew the certificates under the same CA and
# tokens). OUT/secrets.yaml is for `kubectl apply -f`. A role's pods share
# its certificate, which names every pod of the role (psd-0.psd, psd-1.psd,
# their TFJob names in NS) and 127.0.0.1 for the health probe.
# Needs pscerts (tools/pscerts.sh, or installed), openssl and kubectl.
set -eu
ns=default
[ "${1:-}" = --namespace ] && { ns=$2; shift 2; }
[ $# -eq 1 ] || { echo "usage: make-secrets.sh [--namespace NS] OUT" >&2; exit 2; }
out=$1
here=$(cd "$(dirname "$0")" && pwd)
pscerts=$(command -v pscerts || echo "$here/../../tools/pscerts.sh")
bundle=$(command -v ps-bundle || echo "$here/../ps-bundle.sh")
command -v kubectl >/dev/null || { echo "make-secrets.sh: kubectl is missing" >&2; exit 1; }
# TFJob's names for the same tasks (tfjob.yaml's job "psd-tfjob").
tf=psd-tfjob
svc=$ns.svc
sh "$pscerts" --out "$out/ca" --tokens \
    "pscoord=pscoord-0.pscoord,pscoord-0.pscoord.$svc,$tf-chief-0,$tf-chief-0.$svc,127.0.0.1" \
    "ps=psd-0.psd,psd-1.psd,psd-0.psd.$svc,psd-1.psd.$svc,$tf-ps-0,$tf-ps-1,$tf-ps-0.$svc,$tf-ps-1.$svc,127.0.0.1" \
    worker evaluator >/dev/null
sh "$bundle" --from "$out/ca" --out "$out/bundles" pscoord=operator,serves ps=worker,serves \
    worker=worker evaluator=worker >/dev/null
: >"$out/secrets.yaml.new"
for role in pscoord ps worker evaluator; do
    echo "---" >>"$out/secrets.yaml.new"
    kubectl create secret generic "psd-tls-$role" --from-file="$out/bundles/$role" \
        --dry-run=client -o yaml >>"$out/secrets.yaml.new"
done
mv "$out/secrets.yaml.new" "$out/secrets.yaml"
echo "make-secrets.sh: $out/secrets.yaml (psd-tls-pscoord, psd-tls-ps, psd-tls-worker, psd-tls-evaluator)"
