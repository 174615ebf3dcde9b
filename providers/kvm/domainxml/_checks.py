"""Input checks shared by the spec and the metadata model.

Every failure is a ValueError that names the field and repeats the value, so a
message reads ``DomainSpec.memory_mib: 64 is below the minimum of 128``.
"""

from __future__ import annotations

import re

from providers.kvm.rules import text_problem


def fail(field: str, value: object, problem: str) -> ValueError:
    return ValueError(f"{field}: {value!r} {problem}")


def check_int(field: str, value: object, minimum: int) -> int:
    # bool is an int subclass; True MiB of memory is a bug, not a number.
    if isinstance(value, bool) or not isinstance(value, int):
        raise fail(field, value, "is not an integer")
    if value < minimum:
        raise fail(field, value, f"is below the minimum of {minimum}")
    return value


def check_text(field: str, value: object) -> str:
    """A non-empty string without control characters (ElementTree escapes
    ``<``, ``&`` and quotes, but not those)."""
    if problem := text_problem(value):
        raise fail(field, value, problem)
    assert isinstance(value, str)
    return value


def check_absolute_path(field: str, value: object) -> str:
    path = check_text(field, value)
    if not path.startswith("/"):
        raise fail(field, value, "is not an absolute path")
    if path.endswith("/"):
        raise fail(field, value, "names a directory, not a file")
    return path


def check_pattern(field: str, value: object, pattern: re.Pattern[str], expected: str) -> str:
    text = check_text(field, value)
    if not pattern.fullmatch(text):
        raise fail(field, value, f"is not {expected}")
    return text
