"""What a name may hold: the one rule for every name that reaches a log line,
a metric, a page or a store (proxies, stacks' proxies' providers, zones and
labels in the fleet manifest; holders and selectors of the lease API and the
gateway).

Names are shown as they are: in JSON log lines (UTF-8, not escaped), on the
status page, in answers, in PostgreSQL (which stores no NUL). So a name holds
no character that does not show as what it is:

- control characters (Unicode Cc: NUL, tab, newline, U+0085, ...): they
  break lines, terminals and PostgreSQL;
- format characters (Cf: the right-to-left override and the other bidi
  controls, zero-width spaces and joiners, the soft hyphen, the byte order
  mark, tag characters): they reorder or hide text;
- line and paragraph separators (Zl, Zp: U+2028, U+2029): readers that split
  lines on them (Python's `splitlines`, JavaScript) cut a log line in two;
- surrogates (Cs): no character at all; no UTF-8 encodes one.

The rule is a table of ranges (those categories in Unicode 14, as Python
3.11 has them) rather than `unicodedata` asked per character: one regular
expression searches a name in C on the lease routes, the JSON Schemas state
the same rule exactly (`PATTERN`), and another Python's Unicode tables change
nothing unnoticed (tests/unit/test_discovery_names.py compares the table with
`unicodedata`).
"""

from __future__ import annotations

import re
import unicodedata
from typing import Annotated, Any

from pydantic import AfterValidator, Field
from pydantic_core import PydanticCustomError

MAX_NAME = 256
"""Characters in a name, at most: far above any name the project makes (a
replica's is at most 44), and far below what a PostgreSQL index row holds
(2,704 bytes: a stack-qualified name of 357 characters is at most 1,428)."""

REFUSED_CATEGORIES = ("Cc", "Cf", "Cs", "Zl", "Zp")
REFUSED_RANGES: tuple[tuple[int, int], ...] = (
    (0x0000, 0x001F),
    (0x007F, 0x009F),
    (0x00AD, 0x00AD),
    (0x0600, 0x0605),
    (0x061C, 0x061C),
    (0x06DD, 0x06DD),
    (0x070F, 0x070F),
    (0x0890, 0x0891),
    (0x08E2, 0x08E2),
    (0x180E, 0x180E),
    (0x200B, 0x200F),
    (0x2028, 0x202E),
    (0x2060, 0x2064),
    (0x2066, 0x206F),
    (0xD800, 0xDFFF),
    (0xFEFF, 0xFEFF),
    (0xFFF9, 0xFFFB),
    (0x110BD, 0x110BD),
    (0x110CD, 0x110CD),
    (0x13430, 0x13438),
    (0x1BCA0, 0x1BCA3),
    (0x1D173, 0x1D17A),
    (0xE0001, 0xE0001),
    (0xE0020, 0xE007F),
)
_KINDS = {
    "Cc": "a control character",
    "Cf": "a format character",
    "Cs": "a surrogate",
    "Zl": "a line separator",
    "Zp": "a paragraph separator",
}
RULE = "a name holds no control, format or line-separator characters"


def _escaped(code: int) -> str:
    # \uXXXX reads alike in Python's and ECMAScript's expressions; the few
    # characters past the BMP stand as themselves.
    return f"\\u{code:04x}" if code <= 0xFFFF else chr(code)


def _class(ranges: tuple[tuple[int, int], ...]) -> str:
    return "".join(_escaped(lo) + (f"-{_escaped(hi)}" if hi > lo else "") for lo, hi in ranges)


SURROGATES = (0xD800, 0xDFFF)
_REFUSED = re.compile(f"[{_class(REFUSED_RANGES)}]")
_ASCII_REFUSED = re.compile(f"[{_class(tuple(r for r in REFUSED_RANGES if r[0] < 0x80))}]")
PATTERN = f"^[^{_class(tuple(r for r in REFUSED_RANGES if r != SURROGATES))}]*$"
"""The rule as a JSON Schema `pattern`, but for surrogates: a schema's
strings are Unicode text, which holds none (a JSON parser that reads
`"\\ud800"` at all makes one; pydantic's refuses it, `parse_fleet` names it),
and a surrogate range makes Rust's and schemathesis' engines drop the whole
pattern."""


def refused_character(value: str) -> str | None:
    """The first character of `value` the rule refuses, as `U+202E (a format
    character)`; None when there is none. Never the value itself, which may
    be anything a client sent."""
    # Most names are ASCII: its controls alone are searched for (4x faster
    # than the whole class, on the lease routes).
    found = (_ASCII_REFUSED if value.isascii() else _REFUSED).search(value)
    if found is None:
        return None
    character = found.group()
    kind = _KINDS.get(unicodedata.category(character), "an invisible character")
    return f"U+{ord(character):04X} ({kind})"


def check_printable(value: str) -> str:
    """A pydantic validator: the value, or an error naming the character."""
    character = refused_character(value)
    if character is not None:
        raise PydanticCustomError("printable", "{reason}", {"reason": f"{character}: {RULE}"})
    return value


def text_field(
    max_length: int = MAX_NAME, min_length: int = 1, description: str | None = None
) -> Any:
    """The field of a name: its length bounds, and the rule in its JSON Schema
    (give `AfterValidator(check_printable)` beside it, as `Name` does)."""
    return Field(
        min_length=min_length,
        max_length=max_length,
        description=description,
        json_schema_extra={"pattern": PATTERN},
    )


Name = Annotated[str, text_field(), AfterValidator(check_printable)]
"""A name: 1 to MAX_NAME characters, none that the rule refuses."""
Value = Annotated[str, text_field(min_length=0), AfterValidator(check_printable)]
"""A label's value: a name that may be empty."""
Key = Annotated[str, Field(min_length=1, max_length=MAX_NAME), AfterValidator(check_printable)]
"""A label's key: a name, its pattern stated by the mapping (`KEYS`): a key
type's own pattern would make the schema's `patternProperties`, which leaves
other keys free."""
KEYS: dict[str, Any] = {
    "propertyNames": {"minLength": 1, "maxLength": MAX_NAME, "pattern": PATTERN}
}
"""`json_schema_extra` of a mapping keyed by `Key`."""


__all__ = [
    "KEYS",
    "MAX_NAME",
    "PATTERN",
    "REFUSED_CATEGORIES",
    "REFUSED_RANGES",
    "RULE",
    "SURROGATES",
    "Key",
    "Name",
    "Value",
    "check_printable",
    "refused_character",
    "text_field",
]
