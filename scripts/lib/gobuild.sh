# shellcheck shell=bash
# Shared by the scripts that build tools from the Go module proxy
# (scripts/build-pulumi, scripts/build-kube, scripts/build-kubernetes-plugin):
# what Go needs, a scratch directory and wrapper modules. Sourced after
# scripts/lib/common.sh (log, die, CACHE, build_lock, build_dir, run_step).
# Each build caches its result in $CACHE by version; Go's own module and
# build caches stay where `go env` says.

# go_env WHAT: what every build here needs: Go itself (WHAT, e.g. "the CLI",
# names what needs it), no toolchain switch, static binaries, modules
# resolved as the wrapper's go.mod says; and the compiler's garbage
# collector at GOGC=400 unless the caller set GOGC: cold compiles took 14 %
# less CPU (client-go and k8s.io/api: 110 against 127 CPU-seconds; peak
# memory 628 against 576 MB) for the same binaries, byte for byte.
go_env() {
  command -v go >/dev/null || die "go is not installed; $1 is built from Go modules (Go 1.26 or newer)"
  export GOFLAGS=-mod=mod GOTOOLCHAIN=local CGO_ENABLED=0 GOGC=${GOGC:-400}
  mkdir -p "$CACHE"
}

# work_dir: a scratch directory in the cache (same filesystem as the result,
# so the final mv is atomic), removed on exit, as is one a killed build of
# the same NAME left. Sets WORK and STEP_LOG. Call it holding build_lock.
# shellcheck disable=SC2034,SC2153 # STEP_LOG is run_step's; NAME is the caller's
work_dir() {
  build_dir "$CACHE/.$NAME"
  WORK=$BUILD_DIR
  STEP_LOG=$WORK/step.log
}

# wrapper DIR NAME: a module of our own to build another module's main
# package in (go install refuses main packages of modules with replaces).
wrapper() {
  local dir=$1 name=$2
  mkdir -p "$dir"
  printf 'module egress-proxies/%s\n\ngo 1.26\n' "$name" >"$dir/go.mod"
}
