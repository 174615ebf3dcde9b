# shellcheck shell=bash
# Shared by the scripts that build tools from the Go module proxy
# (scripts/build-pulumi, scripts/build-kube, scripts/build-kubernetes-plugin):
# logging, a step runner that names what failed, wrapper modules and the
# cache directory. Sourced; the caller sets NAME (its log prefix) first.
#
# Cache: $EGRESS_PROXIES_CACHE (default ${XDG_CACHE_HOME:-~/.cache}/egress-proxies),
# outside the checkout so that every clone shares it; Go's own module and
# build caches stay where `go env` says.

CACHE=${EGRESS_PROXIES_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/egress-proxies}

log() { printf '%s: %s\n' "${NAME:?}" "$*" >&2; }
die() {
  log "error: $*"
  exit 1
}

# go_env WHAT: what every build here needs: Go itself (WHAT, e.g. "the CLI",
# names what needs it), no toolchain switch, static binaries, modules
# resolved as the wrapper's go.mod says.
go_env() {
  command -v go >/dev/null || die "go is not installed; $1 is built from Go modules (Go 1.26 or newer)"
  export GOFLAGS=-mod=mod GOTOOLCHAIN=local CGO_ENABLED=0
  mkdir -p "$CACHE"
}

# build_lock NAME: one build of NAME at a time (fd 8); a second caller waits,
# then finds the cache.
build_lock() {
  exec 8>"$CACHE/.build-$1.lock"
  flock 8
}

# work_dir: a scratch directory in the cache (same filesystem as the result,
# so the final mv is atomic), removed on exit. Sets WORK and STEP_LOG.
work_dir() {
  WORK=$(mktemp -d "$CACHE/.build.XXXXXX")
  # shellcheck disable=SC2064 # expand now: WORK is fixed
  trap "rm -rf '$WORK'" EXIT
  STEP_LOG=$WORK/step.log
}

# step N/M WHAT MODULE COMMAND...: run COMMAND, its output kept in a log that
# is shown (tail) when it fails, with the step and the module named.
step() {
  local n=$1 what=$2 module=$3 t0=$SECONDS
  shift 3
  log "[$n] $what ($module)"
  if ! "$@" >"$STEP_LOG" 2>&1; then
    tail -n 25 "$STEP_LOG" >&2
    die "step [$n] '$what' failed for module $module (command: $*)"
  fi
  log "[$n] done in $((SECONDS - t0))s"
}

# wrapper DIR NAME: a module of our own to build another module's main
# package in (go install refuses main packages of modules with replaces).
wrapper() {
  local dir=$1 name=$2
  mkdir -p "$dir"
  printf 'module egress-proxies/%s\n\ngo 1.26\n' "$name" >"$dir/go.mod"
}
