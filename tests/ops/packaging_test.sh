#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# The packaging's facts that live in more than one file agree, and the
# Kubernetes manifests pass their offline validation (which must also catch
# a broken copy). Usage: packaging_test.sh SOURCE_DIR KVSHARED
# Exit 77 (skipped) when /usr/bin/python3 lacks python3-kubernetes or
# python3-yaml; the version checks run first either way.
set -eu
src=$1
kvshared=$2
fail() {
    echo "packaging_test: $*" >&2
    exit 1
}
hdr="$src/common/kvshare_version.h"
define() { sed -n "s/^#define $1 \([0-9]*\).*/\1/p" "$hdr"; }
version="$(define KVS_VERSION_MAJOR).$(define KVS_VERSION_MINOR).$(define KVS_VERSION_PATCH)"
so=$(define KVS_SOVERSION)

# One version: kvshare_version.h; the copies the packaging formats need.
changelog=$(sed -n '1s/^kvshare (\([^)-]*\).*/\1/p' "$src/debian/changelog")
[ "$changelog" = "$version" ] ||
    fail "debian/changelog is $changelog, kvshare_version.h $version (add a changelog entry)"
pyproject=$(sed -n 's/^version = "\(.*\)"/\1/p' "$src/client/python/pyproject.toml")
[ "$pyproject" = "$version" ] ||
    fail "client/python/pyproject.toml is $pyproject, kvshare_version.h $version"
grep -q "newTag: $version\$" "$src/packaging/kubernetes/kustomization.yaml" ||
    fail "packaging/kubernetes/kustomization.yaml: the image tag is not $version"
# One SOVERSION: the library package's name, its symbols file, the binding.
grep -q "^Package: libkvshare$so\$" "$src/debian/control" ||
    fail "debian/control has no package libkvshare$so (KVS_SOVERSION $so)"
head -1 "$src/debian/libkvshare$so.symbols" | grep -q "^libkvshare.so.$so libkvshare$so " ||
    fail "debian/libkvshare$so.symbols does not describe libkvshare.so.$so"
grep -q "^_SOVERSION = $so\$" "$src/client/python/kvshare/__init__.py" ||
    fail "client/python/kvshare/__init__.py: _SOVERSION is not $so"
echo "versions: $version, libkvshare.so.$so: consistent"

validate="$src/packaging/kubernetes/validate.py"
kubectl_arg=""
if command -v kubectl >/dev/null; then
    kubectl_arg="--kubectl $(command -v kubectl)"
fi
set +e
# shellcheck disable=SC2086
/usr/bin/python3 "$validate" --kvshared "$kvshared" $kubectl_arg
rc=$?
set -e
[ "$rc" = 77 ] && exit 77
[ "$rc" = 0 ] || fail "the manifests do not validate"

# The validator must see a broken copy: a misspelt field, a string for an
# integer, a selector that misses its pods, rules that drifted, a namespace
# without its Pod Security level, a system priority class outside kube-system.
tmp=$(mktemp -d "${TMPDIR:-/tmp}/kvs-k8s-XXXXXX")
trap 'rm -rf "$tmp"' EXIT
cp -r "$src/packaging/kubernetes" "$tmp/k"
sed -i 's/readOnlyRootFilesystem: true/readOnlyRootFilesystm: true/' "$tmp/k/daemonset.yaml"
sed -i 's/failureThreshold: 60/failureThreshold: "60"/' "$tmp/k/daemonset.yaml"
sed -i '/^  selector:/{n;s/kvshared/nothing/}' "$tmp/k/service.yaml"
sed -i '0,/\[5m\]/s//[6m]/' "$tmp/k/prometheusrule.yaml"
sed -i '/pod-security.kubernetes.io\/enforce/d' "$tmp/k/namespace.yaml"
sed -i 's/priorityClassName: kvshared-node-critical/priorityClassName: system-node-critical/' \
    "$tmp/k/daemonset.yaml"
/usr/bin/python3 "$validate" --dir "$tmp/k" >"$tmp/out" 2>&1 && fail "a broken copy validated"
for want in "readOnlyRootFilesystm: no such field" "failureThreshold: expected an integer" \
            "Service/kvshared-metrics" "spec.groups differ" \
            "no pod-security.kubernetes.io/enforce label" "admitted only in kube-system"; do
    grep -q "$want" "$tmp/out" || { cat "$tmp/out"; fail "the broken copy's '$want' was not seen"; }
done
echo "packaging_test: ok"
