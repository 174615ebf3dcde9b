# shellcheck shell=bash
# What the project's scripts share, stated once: logging, the cache
# directory, exit hooks, a step runner that names what failed, a build lock
# and scratch build directories. Sourced; the caller sets NAME (its log prefix) first.
# Sourcing it changes nothing (no trap, no option) until a function is called.

# The cache of builds that take minutes (the Pulumi CLI, the cluster's
# binaries and images, the proxy image, the apt repository), outside the
# checkout so that every clone shares it. Each build keys its directory in it
# by version or recipe.
# shellcheck disable=SC2034 # for the scripts that source this file
CACHE=${EGRESS_PROXIES_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/egress-proxies}

log() { printf '%s: %s\n' "${NAME:?}" "$*" >&2; }
die() {
  log "error: $*"
  exit 1
}

# ---- exit hooks --------------------------------------------------------------

# at_exit COMMAND [ARGS...]: run COMMAND when the script exits, however it
# exits (an error, `exit`, SIGINT, SIGTERM); hooks run last-registered first
# and a failing one does not stop the others. The script's exit status stays.
# The one EXIT trap of a script that sources this file: set no other.
AT_EXIT=()
at_exit() {
  local hook
  printf -v hook '%q ' "$@"
  AT_EXIT+=("$hook")
  _exit_trap
}

_exit_trap() {
  [[ -z ${_EXIT_TRAP:-} ]] || return 0
  _EXIT_TRAP=1
  trap _on_exit EXIT
  # Without these, a signal ends bash without running the EXIT trap.
  trap 'exit 130' INT
  trap 'exit 143' TERM
}

_on_exit() {
  local status=$? i
  if [[ -n ${CURRENT_STEP:-} ]]; then
    # The step's redirection may still hold: report on the script's own output.
    exec 1>&"$_STEP_STDOUT" 2>&"$_STEP_STDERR"
    if ((status != 0)); then
      # shellcheck disable=SC2153 # STEP_LOG: set by the caller of run_step
      tail -n 30 "$STEP_LOG" >&2 || true
      log "error: step $CURRENT_STEP failed${STEP_FOR:+ for $STEP_FOR} (exit status $status)${FAILED_COMMAND:+ at: $FAILED_COMMAND}"
    fi
  fi
  for ((i = ${#AT_EXIT[@]} - 1; i >= 0; i--)); do
    eval "${AT_EXIT[i]}" || true
  done
  return "$status"
}

# private_tmpdir: TMPDIR, for the rest of the script and what it runs, is a
# new private directory (0700) under the one it was given, removed with what
# is in it when the script exits. pulumi-kubernetes leaves a copy of its
# kubeconfig, client key included, in $TMPDIR at every run
# (docs/kubernetes-provider.md, "Temporary files").
private_tmpdir() {
  TMPDIR=$(mktemp -d "${TMPDIR:-/tmp}/egress-proxies-pulumi.XXXXXX")
  export TMPDIR
  at_exit rm -rf "$TMPDIR"
}

# ---- steps -------------------------------------------------------------------

# run_step [--for SUBJECT] N/M WHAT COMMAND...: run COMMAND (a function, as a
# rule) with its output in $STEP_LOG (the caller sets it), under errexit: the
# first command in it that fails ends the script, and the exit trap shows the
# log's tail and names the step, SUBJECT (e.g. "module M@V") and that
# command. Call it as a plain command, never in a condition (`if`, `||`),
# which would turn errexit off inside COMMAND.
CURRENT_STEP=
FAILED_COMMAND=
STEP_FOR=
run_step() {
  STEP_FOR=
  if [[ $1 == --for ]]; then
    STEP_FOR=$2
    shift 2
  fi
  local n=$1 what=$2 t0=$SECONDS
  shift 2
  if [[ -z ${_STEP_STDERR:-} ]]; then
    exec {_STEP_STDOUT}>&1 {_STEP_STDERR}>&2
    set -o errtrace
    # The first failing command of the step; when it is COMMAND itself (not a
    # command inside a function), its expanded words.
    trap '[[ -n $FAILED_COMMAND ]] || if [[ ${FUNCNAME[0]:-} == run_step ]]; then FAILED_COMMAND=$_STEP_COMMAND; else FAILED_COMMAND=$BASH_COMMAND; fi' ERR
    _exit_trap
  fi
  CURRENT_STEP="[$n] '$what'"
  FAILED_COMMAND=
  _STEP_COMMAND="$*"
  log "[$n] $what${STEP_FOR:+ ($STEP_FOR)}"
  "$@" >"${STEP_LOG:?}" 2>&1
  CURRENT_STEP=
  log "[$n] done in $((SECONDS - t0))s"
}

# ---- builds ------------------------------------------------------------------

# build_lock NAME: one build of NAME at a time (fd 8); a second caller waits,
# then finds the cache.
build_lock() {
  mkdir -p "$CACHE"
  exec 8>"$CACHE/.build-$1.lock"
  flock 8
}

# remove_build_dir DIR: DIR and everything in it, after unmounting what is
# mounted below it (a chroot's /proc), deepest first; never crosses into
# another file system.
remove_build_dir() {
  local m
  while read -r m; do umount -l "$m" || true; done < <(
    awk -v d="$1/" 'index($5, d) == 1 {print $5}' /proc/self/mountinfo | sort -r
  )
  rm -rf --one-file-system "$1"
}

# build_dir PREFIX: a new scratch directory PREFIX.XXXXXX, in BUILD_DIR,
# removed (with remove_build_dir) when the script exits. The directories
# PREFIX.* a killed build left go first: call it holding the build's lock.
# PREFIX lies beside the build's result, so that moving it in is atomic.
build_dir() {
  local old
  for old in "$1".*; do
    if [[ -d $old && ! -L $old ]]; then remove_build_dir "$old"; fi
  done
  BUILD_DIR=$(mktemp -d "$1.XXXXXX")
  at_exit remove_build_dir "$BUILD_DIR"
}
