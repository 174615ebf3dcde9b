#!/bin/bash
# egress-proxies-squid-sync: squid's files from this VM's metadata, applied in
# place. Installed by the proxy's startup script (or user-data) at boot.
#
#   egress-proxies-squid-sync --once    apply what the metadata holds now
#   egress-proxies-squid-sync --watch   then each change as it comes (its unit)
#
# The metadata keys (written by the stack, docs/gcp-provider.md):
#   egress-proxies-squid-conf        squid.conf
#   egress-proxies-squid-passwords   the password file (only with squid.auth)
#   egress-proxies-squid-sha256      sha256 of the conf, a NUL, the passwords
# Files are checked by squid itself before they move, moved by rename (never
# half written), and squid reloads; a config squid refuses leaves the old
# files and squid as they were. What was applied, or why not, goes to the
# guest attributes (egress-proxies/squid-sha256, egress-proxies/squid-error).
set -euo pipefail

MD="http://${GCE_METADATA_HOST:-metadata.google.internal}/computeMetadata/v1/instance"
KEY=egress-proxies-squid
CONF=/etc/squid/squid.conf
PASSWORDS=/etc/squid/passwords
GROUP=proxy
READ_ETAG= # set by apply
# One apply at a time on the VM: the watching unit and a boot's --once can
# overlap (the unit is enabled, so it may start first at a reboot).
LOCK=/run/egress-proxies-squid-sync.lock

say() { echo "egress-proxies-squid-sync: $*" >&2; }

md() { curl -sS --retry 5 --retry-connrefused --max-time 30 -H 'Metadata-Flavor: Google' "$@"; }

# get NAME FILE [HEADERS]: one attribute into FILE (its answer's headers
# into HEADERS). 0 read, 1 absent, 2 unreachable.
get() {
  local code
  code=$(md -o "$2" -D "${3:-/dev/null}" -w '%{http_code}' "$MD/attributes/$1") || return 2
  case $code in
    200) return 0 ;;
    404) rm -f "$2" && return 1 ;;
    *) say "the metadata server answered $code for $1" && return 2 ;;
  esac
}

# report NAME VALUE: a guest attribute (best effort: a VM without
# enable-guest-attributes answers 403, and the files are applied anyway).
report() {
  md -o /dev/null -X PUT --data-binary "$2" "$MD/guest-attributes/egress-proxies/$1" 2>/dev/null || true
}

digest() {
  { cat "$1/conf" && printf '\0' && { [ ! -f "$1/passwords" ] || cat "$1/passwords"; }; } |
    sha256sum | cut -d' ' -f1
}

# same DIR: the files in DIR are the files squid has now.
same() {
  cmp -s "$1/conf" "$CONF" || return 1
  if [ -f "$1/passwords" ]; then cmp -s "$1/passwords" "$PASSWORDS"; else [ ! -e "$PASSWORDS" ]; fi
}

# move_in DIR: the password file before the conf (a conf that starts reading
# it finds it there); one that no conf reads any more goes after the conf.
move_in() {
  if [ -f "$1/passwords" ]; then
    chown "root:$GROUP" "$1/passwords" && chmod 0640 "$1/passwords" &&
      mv -f "$1/passwords" "$PASSWORDS" || return 1
    chown root:root "$1/conf" && chmod 0644 "$1/conf" && mv -f "$1/conf" "$CONF"
  else
    chown root:root "$1/conf" && chmod 0644 "$1/conf" && mv -f "$1/conf" "$CONF" &&
      rm -f "$PASSWORDS"
  fi
}

etag_of() { sed -n 's/^[Ee][Tt][Aa][Gg]: *\([^[:space:]]*\).*/\1/p' "$1"; }

# apply: 0 applied (or nothing to do), 1 refused or unreadable, 3 read while
# the metadata changed (read again). READ_ETAG: the ETag of the digest it
# read, the version it acted on, which the watch waits to change from (not
# the ETag that woke it: the metadata may have moved on, or back, since).
apply() {
  local dir want got out code=0
  READ_ETAG=
  # Beside the files, so that each moves into place by rename.
  dir=$(mktemp -d /etc/squid/.sync.XXXXXX) || return 1
  get "$KEY-sha256" "$dir/want" "$dir/headers" || code=$?
  [ "$code" = 0 ] && READ_ETAG=$(etag_of "$dir/headers")
  [ "$code" = 0 ] && { get "$KEY-conf" "$dir/conf" || code=$?; }
  if [ "$code" = 0 ]; then
    get "$KEY-passwords" "$dir/passwords" || { [ $? = 1 ] || code=2; }
  fi
  if [ "$code" != 0 ]; then
    say "could not read $KEY-sha256 and $KEY-conf from this VM's metadata"
    rm -rf "$dir" && return 1
  fi
  want=$(cat "$dir/want")
  got=$(digest "$dir")
  if [ "$got" != "$want" ]; then
    say "the files read do not match $KEY-sha256 (the metadata changed meanwhile)"
    rm -rf "$dir" && return 3
  fi
  if same "$dir"; then
    rm -rf "$dir"
    report squid-sha256 "$want" && report squid-error "" && return 0
  fi
  if ! out=$(squid -k parse -f "$dir/conf" 2>&1); then
    # squid's own words name the line and the directive, never a secret.
    out=$(sed -e 's/^[0-9/]* [0-9:]*| //' -e "s|$dir/conf|squid.conf|g" <<<"$out" |
      grep -v -E '^(Startup|Processing|Initializ)' | head -n 5 | tr '\n' ' ' || true)
    say "squid refused the new squid.conf; squid keeps the old one: $out"
    report squid-error "refused $want: $out"
    rm -rf "$dir" && return 1
  fi
  if ! move_in "$dir"; then
    say "could not move the new files into /etc/squid"
    rm -rf "$dir" && return 1
  fi
  rm -rf "$dir"
  if squid -k check -f "$CONF" >/dev/null 2>&1; then
    if ! out=$(squid -k reconfigure -f "$CONF" 2>&1); then
      say "applied $want, but squid did not take the signal to reload: $out"
      report squid-error "not reloaded $want: $out"
      return 1
    fi
    say "applied $want; squid reloaded"
  else
    say "applied $want; squid is not running and reads them when it starts"
  fi
  report squid-sha256 "$want"
  report squid-error ""
}

# apply_settled: apply, reading again while the metadata moves under it,
# holding the lock (fd 9, opened by the caller).
apply_settled() {
  local tries=0 code
  flock 9
  # No other apply is under way, so a .sync directory here is one whose apply
  # died (the VM preempted or reset, the agent killed): squid ignores it, but
  # it may hold a copy of the password file.
  rm -rf /etc/squid/.sync.*
  while :; do
    code=0 && apply || code=$?
    [ "$code" = 3 ] && [ $((tries += 1)) -lt 10 ] && sleep 1 && continue
    break
  done
  flock -u 9
  return "$code"
}

watch() {
  local etag=none next headers code
  headers=$(mktemp)
  trap 'rm -f "$headers"' EXIT
  while :; do
    # The metadata server holds the request until the value's ETag differs
    # from last_etag (at once the first time), or for timeout_sec.
    code=$(curl -sS --max-time 330 -o /dev/null -D "$headers" -w '%{http_code}' \
      -H 'Metadata-Flavor: Google' \
      "$MD/attributes/$KEY-sha256?wait_for_change=true&timeout_sec=300&last_etag=$etag") || code=000
    next=$(etag_of "$headers")
    if [ "$code" != 200 ] || [ -z "$next" ]; then
      say "waiting for $KEY-sha256 in the metadata (answer $code)"
      sleep 5
      continue
    fi
    [ "$next" = "$etag" ] && continue
    # A refused config is not tried again until the metadata changes.
    apply_settled || true
    if [ -z "$READ_ETAG" ]; then
      sleep 5 # the digest could not be read: try again
      etag=none
    else
      etag=$READ_ETAG
    fi
  done
}

case ${1:-} in
  --once) exec 9>"$LOCK" && apply_settled ;;
  --watch) exec 9>"$LOCK" && watch ;;
  *)
    echo "usage: $0 --once | --watch" >&2
    exit 2
    ;;
esac
