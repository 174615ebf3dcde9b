# shellcheck shell=bash
# Daemons a project script starts and stops by PID (scripts/testbed,
# scripts/kube): each PID is kept in $STATE/NAME.pid, and only those are ever
# signalled; and the claim on what such daemons make machine-wide. Sourced
# after scripts/lib/common.sh (log, die), with STATE set.

# alive PID NAME: PID is a live (not zombie) process called NAME (the kernel
# keeps 15 characters of it). Checking the name guards against a recycled PID
# in a stale pid file.
alive() {
  local status
  status=$(cat "/proc/$1/status" 2>/dev/null) || return 1
  [[ $status == *$'Name:\t'"${2:0:15}"$'\n'* && $status != *$'State:\tZ'* ]]
}

# until_exec PID NAME: wait (at most 30 s) while PID, just forked to run
# NAME, is still the shell between its fork and its exec: a look in that
# moment (as much as seconds on a loaded machine) would take the daemon for
# dead, before even its log was opened. Returns once it is NAME, or gone.
until_exec() {
  local deadline=$((SECONDS + 30)) status
  while ((SECONDS < deadline)); do
    alive "$1" "$2" && return 0
    status=$(cat "/proc/$1/status" 2>/dev/null) || return 0
    [[ $status != *$'State:\tZ'* ]] || return 0
    sleep 0.05
  done
}

# ours NAME: print the PID of the NAME daemon we started, if it still runs.
ours() {
  local pid
  pid=$(tr -dc 0-9 2>/dev/null <"$STATE/$1.pid") || return 1
  [[ -n $pid ]] && alive "$pid" "$1" && echo "$pid"
}

# wait_for SECONDS DESCRIPTION COMMAND...: poll until COMMAND succeeds.
wait_for() {
  local secs=$1 what=$2
  shift 2
  local deadline=$((SECONDS + secs))
  until "$@" >/dev/null 2>&1; do
    ((SECONDS < deadline)) || die "timed out after ${secs}s waiting for $what"
    sleep 0.1
  done
}

# stop NAME: stop our NAME daemon (TERM, then KILL after 15 s); never a
# foreign one.
stop() {
  local pid i
  pid=$(ours "$1") || {
    rm -f "$STATE/$1.pid"
    return 0
  }
  log "stopping $1 (pid $pid)"
  kill -TERM "$pid" 2>/dev/null || true
  for ((i = 0; i < 150; i++)); do
    alive "$pid" "$1" || break
    sleep 0.1
  done
  if alive "$pid" "$1"; then
    log "$1 (pid $pid) ignored SIGTERM for 15 s: SIGKILL"
    kill -KILL "$pid" 2>/dev/null || true
  fi
  rm -f "$STATE/$1.pid"
}

# put_file PATH MODE < CONTENT: write only when the content differs, so a warm
# `up` leaves files (and their mtimes) alone. Returns 0 when it wrote.
put_file() {
  local path=$1 mode=$2 tmp
  tmp=$(mktemp "$path.XXXXXX")
  cat >"$tmp"
  if [[ -f $path ]] && cmp -s "$tmp" "$path"; then
    rm -f "$tmp"
    return 1
  fi
  chmod "$mode" "$tmp"
  mv -f "$tmp" "$path"
}

# any_alive DIR NAME...: one of the NAME daemons whose PIDs DIR records still
# runs. Another checkout's testbed or cluster whose daemons are all gone was
# left by a run that was killed (a CI job cut off, a session ended): it is no
# longer up, and `up` here may take its place.
any_alive() {
  local dir=$1 name
  shift
  for name in "$@"; do
    STATE=$dir ours "$name" >/dev/null && return 0
  done
  return 1
}

# ---- the machine's owner -----------------------------------------------------

# What a testbed or a cluster makes is the machine's, not one checkout's (a
# bridge, ports, a user, a pool): one at a time, and FILE (under /run) names
# the state directory of the checkout that holds it.

# other_owner FILE: print the state directory FILE names when it is another
# checkout's; a record whose directory is gone is stale, and not printed.
other_owner() {
  local owner
  owner=$(cat "$1" 2>/dev/null) || return 1
  [[ -n $owner && $owner != "$STATE" && -d $owner ]] || return 1
  echo "$owner"
}

# claim_machine FILE WHAT HINT DAEMON...: record STATE in FILE. When another
# checkout holds the machine and one of its DAEMONs runs, its WHAT (e.g. "the
# cluster") is up: die, saying so and HINT. When none runs, a run that was
# killed left it: take its place, saying so. CLAIMED_FROM: that checkout's
# state directory, or empty.
claim_machine() {
  local file=$1 what=$2 hint=$3 other
  shift 3
  CLAIMED_FROM=
  if other=$(other_owner "$file"); then
    any_alive "$other" "$@" && die "$what of ${other%/*} is up on this machine: $hint"
    log "$what of ${other%/*} was left by a run that was killed (none of its daemons runs): taking its place"
    # shellcheck disable=SC2034 # for the caller
    CLAIMED_FROM=$other
  fi
  echo "$STATE" >"$file"
}

# release_machine FILE: forget the claim, unless FILE names another checkout.
release_machine() {
  other_owner "$1" >/dev/null || rm -f "$1"
}
