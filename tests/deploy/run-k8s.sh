#!/bin/sh
# SPDX-License-Identifier: MIT
# Offline checks of deploy/kubernetes: the base and the overlays (large-budget, node-patcher) render
# with kubectl's built-in kustomize (every kubectl named in $KUBECTLS, default the one on PATH;
# kubectl 1.20, Debian 12's kubernetes-client, is the oldest meant to work), yamllint on the
# sources, shellcheck on the patcher, the device plugin compiles and the image installs it where
# the DaemonSet runs it, the structural checks of check-manifests.py on what was rendered (the real
# pinbrokerd validates the ConfigMap's config; the client example against the restricted Pod
# Security level), and a schema check with kubernetes-models when node has it.
# Nothing here talks to a cluster: `kubectl apply --dry-run=client` needs an API server for
# discovery even with --validate=false, so it is not used.
# usage: run-k8s.sh SOURCE_DIR BUILD_DIR      exit 0 pass, 1 fail, 77 skip
set -u
SRC=${1:?usage: run-k8s.sh SOURCE_DIR BUILD_DIR}
BUILD=${2:?usage: run-k8s.sh SOURCE_DIR BUILD_DIR}
K8S=$SRC/deploy/kubernetes
OVERLAY=$SRC/deploy/overlays/large-budget
PATCHER_OV=$SRC/deploy/overlays/node-patcher
DRA_OV=$SRC/deploy/overlays/dra
PLUGIN=$K8S/device-plugin/pinbroker-device-plugin.py
# The packages' version (debian/changelog's first entry), which the image's tag must be.
VERSION=$(sed -n '1s/^[^ ]* (\([^)]*\)).*/\1/p' "$SRC/debian/changelog")

fail() { echo "FAIL: $*" >&2; exit 1; }
skip() { echo "SKIP: $*" >&2; exit 77; }

KUBECTLS=${KUBECTLS:-kubectl}
for k in $KUBECTLS; do
	command -v "$k" >/dev/null || skip "$k not found (apt-get install kubernetes-client: kubectl with kustomize built in)"
done
python3 -c 'import yaml' 2>/dev/null || skip "python3 with yaml not found (apt-get install python3-yaml)"
[ -x "$BUILD/daemon/pinbrokerd" ] || fail "no $BUILD/daemon/pinbrokerd: build first"

T=$(mktemp -d /tmp/pinbroker-k8s-manifests.XXXXXX) || fail "cannot create a temp directory"
trap 'rm -rf "$T"' EXIT

# 1. Render, with each kubectl; the checks below run on every rendering.
i=0
for k in $KUBECTLS; do
	i=$((i + 1))
	v=$("$k" version --client 2>/dev/null | grep -o 'v[0-9][0-9.]*[^ ",]*' | head -n 1)
	"$k" kustomize "$K8S" >"$T/base-$i.yaml" 2>"$T/err" || { cat "$T/err"; fail "$k kustomize $K8S failed"; }
	"$k" kustomize "$OVERLAY" >"$T/overlay-$i.yaml" 2>"$T/err" || { cat "$T/err"; fail "$k kustomize $OVERLAY failed"; }
	"$k" kustomize "$PATCHER_OV" >"$T/patcher-$i.yaml" 2>"$T/err" || { cat "$T/err"; fail "$k kustomize $PATCHER_OV failed"; }
	"$k" kustomize "$DRA_OV" >"$T/dra-$i.yaml" 2>"$T/err" || { cat "$T/err"; fail "$k kustomize $DRA_OV failed"; }
	echo "ok: rendered with $k ($v): $(grep -c '^kind:' "$T/base-$i.yaml") objects in the base," \
		"$(grep -c '^kind:' "$T/overlay-$i.yaml") in large-budget, $(grep -c '^kind:' "$T/patcher-$i.yaml") in node-patcher," \
		"$(grep -c '^kind:' "$T/dra-$i.yaml") in dra"
done

# 2. yamllint on the sources, two-space style, lines up to 120.
if command -v yamllint >/dev/null; then
	rules='line-length: {max: 120}, document-start: disable, comments: {min-spaces-from-content: 1}'
	yamllint -s -d "{extends: default, rules: {$rules}}" \
		"$K8S" "$SRC/deploy/overlays" || fail "yamllint found problems (above)"
	echo "ok: yamllint"
else
	echo "note: yamllint not found (apt-get install yamllint): not linted"
fi

# 3. The patcher and the image build: POSIX sh.
for f in "$PATCHER_OV/node-patcher.sh" "$K8S/build-image.sh"; do
	sh -n "$f" || fail "$f does not parse"
	if command -v shellcheck >/dev/null; then
		shellcheck -s sh "$f" || fail "shellcheck found problems in $f (above)"
		echo "ok: shellcheck $(basename "$f")"
	else
		echo "note: shellcheck not found: $(basename "$f") only parsed with sh -n"
	fi
done

# The Python programs compile, and the image build puts each (with the shared module and the stubs it
# generates) where the DaemonSet runs it; run-device-plugin.py and run-dra-driver.py run them.
for f in "$PLUGIN" "$K8S/dra/pinbroker-dra-driver.py" "$K8S/lib/pinbroker_k8s.py" "$K8S/listen-exec.py"; do
	python3 -c 'import sys; compile(open(sys.argv[1]).read(), sys.argv[1], "exec")' "$f" 2>"$T/err" ||
		{ cat "$T/err"; fail "$f does not compile"; }
done
for d in /usr/lib/pinbroker/device-plugin /usr/lib/pinbroker/dra /usr/lib/pinbroker/kubernetes/listen-exec.py gen-stubs; do
	grep -q "$d" "$K8S/build-image.sh" || fail "build-image.sh does not install $d (where the DaemonSet runs it)"
done
echo "ok: the device plugin, the DRA driver and listen-exec.py compile; build-image.sh installs them"

# The image's tag is the packages' version: kustomization.yaml's newTag, and what build-image.sh tags.
tag=$(sed -n "s/^ *newTag: *//p" "$K8S/kustomization.yaml" "$SRC"/deploy/overlays/*/kustomization.yaml | sort -u)
[ -n "$VERSION" ] && [ "$tag" = "$VERSION" ] ||
	fail "kustomization.yaml's images newTag is '$tag', the packages' version (debian/changelog) '$VERSION': make them one"
[ "$(sh "$K8S/build-image.sh" --print-tag)" = "pinbroker:$VERSION" ] ||
	fail "build-image.sh --print-tag says '$(sh "$K8S/build-image.sh" --print-tag)', not pinbroker:$VERSION"
echo "ok: the image tag is the packages' version, $VERSION, in kustomization.yaml and build-image.sh"

# 4. What matters in the rendered objects (with a self-test: each broken variant must be caught).
i=0
for k in $KUBECTLS; do
	i=$((i + 1))
	python3 "$SRC/tests/deploy/check-manifests.py" "$T/base-$i.yaml" "$T/overlay-$i.yaml" "$T/patcher-$i.yaml" \
		"$K8S/examples/client-pod.yaml" "$K8S/examples/client-pod-hostpath.yaml" "$BUILD/daemon/pinbrokerd" \
		"$PATCHER_OV/node-patcher.sh" "$T/dra-$i.yaml" "$K8S/examples/client-pod-dra.yaml" "$K8S/podmonitor.yaml" \
		"$VERSION" >"$T/check.out" 2>&1 ||
		{ cat "$T/check.out"; fail "check-manifests.py on $k's rendering"; }
	grep '^self-test' "$T/check.out" | sed 's/^/  /'
	echo "ok: structural checks on $k's rendering"
done

# 5. Schema: kubernetes-models (npm) from $PINBROKER_K8S_MODELS or .cache/k8s-schema, when there.
MODELS=${PINBROKER_K8S_MODELS:-$SRC/.cache/k8s-schema/node_modules}
if command -v node >/dev/null && [ -d "$MODELS/kubernetes-models" ]; then
	mv=$(jq -r .version "$MODELS/kubernetes-models/package.json" 2>/dev/null)
	for f in "$T/base-1.yaml" "$T/overlay-1.yaml" "$T/patcher-1.yaml" "$T/dra-1.yaml" "$K8S/examples/client-pod.yaml" \
		"$K8S/examples/client-pod-hostpath.yaml" "$K8S/examples/client-pod-dra.yaml"; do
		python3 -c 'import sys, yaml, json; print(json.dumps([d for d in yaml.safe_load_all(open(sys.argv[1])) if d]))' "$f" |
			NODE_PATH=$MODELS node "$SRC/tests/deploy/validate-schema.js" >"$T/schema.out" 2>&1 ||
			{ cat "$T/schema.out"; fail "schema check of $f (kubernetes-models $mv)"; }
	done
	echo "ok: schema check (kubernetes-models $mv) of the base, the overlays and the client pods" \
		"(not the PodMonitor: a CRD's, not in kubernetes-models)"
else
	echo "note: schema check skipped: needs node and kubernetes-models" \
		"(npm install --prefix $SRC/.cache/k8s-schema kubernetes-models@5.1.0, or set PINBROKER_K8S_MODELS)"
fi
echo "PASS: deploy/kubernetes"
