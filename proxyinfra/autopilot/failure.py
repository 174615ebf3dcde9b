"""Why an update failed, in one line, from what the Pulumi CLI printed.

The CLI ends a failed update with its summary ("Resources: ... 2 errored",
"Duration"), and the cause is above it, in the "Diagnostics:" block: under
each resource, ``error:`` entries, and for an exception in a provider or
the program, a Python traceback whose last line names it
(``providers.kvm.errors.HostResourceMissing: host 'nas1' ...``). An operator
reading the decision log needs that line, not the summary.

Only the exception's name and the first line of its message are kept: the
lines a traceback shows after it (pydantic's, for one) may quote the input
that failed, which can hold a proxy's password.
"""

from __future__ import annotations

import re

from proxyinfra.autopilot.changes import one_line

_DIAGNOSTICS = "Diagnostics:"
_RESOURCE = re.compile(r"^  (\S+) \((?P<name>[^)]*)\):$")
_ERROR = re.compile(r"^(?P<indent> +)error: (?P<text>.*)$")
_TRACEBACK = "Traceback (most recent call last):"
_EXCEPTION = re.compile(r"^(?P<type>[A-Za-z_][\w.]*)(?:: (?P<message>.*))?$")
# What the engine adds to every failed update: no cause in them.
_ECHOES = ("update failed", "Resource monitor has terminated, shutting down")
_PROGRAM_FAILED = "Program failed with an unhandled exception:"


def _entries(lines: list[str]) -> list[tuple[str, list[str]]]:
    """Each ``error:`` entry of the Diagnostics block: its resource's name and
    its lines (the first without ``error: ``, the rest as printed, up to the
    next entry, the next resource or a line less indented)."""
    entries: list[tuple[str, list[str]]] = []
    resource = ""
    indent = 0
    current: list[str] | None = None
    for line in lines:
        if not line.strip():
            continue  # inside a traceback too, between chained exceptions
        found = _RESOURCE.match(line)
        if found:
            resource, current = found.group("name"), None
            continue
        error = _ERROR.match(line)
        if error:
            indent = len(error.group("indent"))
            # Its first line where it stands: a traceback in it is read by indent.
            current = [error.group("indent") + error.group("text")]
            entries.append((resource, current))
        elif current is not None and _indent(line) >= indent:
            current.append(line)
        else:
            current = None
    return entries


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def _cause(lines: list[str]) -> str | None:
    """An entry's cause: a traceback's exception line (the last traceback's,
    when one was raised while handling another), or the entry's own text."""
    starts = [i for i, line in enumerate(lines) if line.strip() == _TRACEBACK]
    if not starts:
        text = lines[0].strip()
        return None if text in _ECHOES or text == _PROGRAM_FAILED else text
    start = starts[-1]
    base = _indent(lines[start])
    for line in lines[start + 1 :]:
        if _indent(line) == base:
            found = _EXCEPTION.match(line.strip())
            if found:
                name = found.group("type").rsplit(".", 1)[-1]
                message = found.group("message")
                return f"{name}: {message}" if message else name
    return None


def failure_summary(output: str) -> str:
    """One line: each failed resource's cause (``name: cause``, joined by
    `` | ``), or, when the output holds none, its last lines as before."""
    lines = output.splitlines()
    try:
        start = next(i for i, line in enumerate(lines) if line.strip() == _DIAGNOSTICS)
    except StopIteration:
        start = None
    causes: list[str] = []
    if start is not None:
        for resource, entry in _entries(lines[start + 1 :]):
            cause = _cause(entry)
            if cause is not None and f"{resource}: {cause}" not in causes:
                causes.append(f"{resource}: {cause}" if resource else cause)
    if causes:
        return one_line(" | ".join(causes))
    shown = [line.strip() for line in lines if line.strip()]
    return one_line(" | ".join(shown[-6:]))


def cli_error(output: str) -> str:
    """One line for a command that failed before any update (no such stack, a
    backend that cannot be opened): the CLI's own ``error:`` lines, or, when
    it printed none, what failure_summary makes of the output."""
    # The Automation API's error text: " code: N", " stdout: ...", " stderr: ...".
    lines = (line.strip().removeprefix("stderr: ") for line in output.splitlines())
    errors = [line.removeprefix("error: ") for line in lines if line.startswith("error: ")]
    return one_line(" | ".join(errors)) if errors else failure_summary(output)
