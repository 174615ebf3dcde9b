# shellcheck shell=bash
# The self-managed file backend's state directory (the DIR of file://DIR).
# Sourced by scripts/up; tests/support/pulumi_cli.py runs the same function
# in the recovery after a killed run.

# drop_empty_attrs DIR: remove each empty *.attrs file under DIR/.pulumi/stacks/,
# with a warning naming it. The backend writes a stack's checkpoint atomically
# but its <stack>.json.attrs sidecar by truncating and rewriting it, so a run
# killed in between leaves it empty, and every command on that stack (pulumi
# cancel included) then fails with "failed to load checkpoint: EOF". A
# missing sidecar is harmless; a non-empty one is never touched.
drop_empty_attrs() {
  local file
  [[ -d $1/.pulumi/stacks ]] || return 0
  while IFS= read -r -d '' file; do
    printf 'egress-proxies: warning: removing %s: empty (left by a killed pulumi run); with it every command on the stack fails with "failed to load checkpoint: EOF"\n' "$file" >&2
    rm -f -- "$file"
  done < <(find "$1/.pulumi/stacks" -type f -name '*.attrs' -empty -print0)
}
