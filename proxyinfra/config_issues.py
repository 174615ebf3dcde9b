"""A config error as the operator reads it: each issue by its path with the
offending value, every issue of a config in one error. Pydantic's errors are
turned into such issues here, so every block of the config reads the same.
"""

from __future__ import annotations

import difflib
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pulumi
from pydantic import BaseModel, ValidationError

_VALUE_SHOWN = 60


@dataclass(frozen=True)
class ConfigIssue:
    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


class ConfigError(pulumi.RunError):
    """Every error in the stack config, one per line. A RunError so that
    ``pulumi preview`` prints just this message, without a traceback."""

    def __init__(self, issues: Sequence[ConfigIssue]) -> None:
        self.issues = list(issues)
        noun = "error" if len(self.issues) == 1 else "errors"
        lines = "\n".join(f"  {issue}" for issue in self.issues)
        super().__init__(f"invalid stack config ({len(self.issues)} {noun}):\n{lines}")


def show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= _VALUE_SHOWN else text[: _VALUE_SHOWN - 3] + "..."


def config_path(prefix: str, loc: Sequence[int | str]) -> str:
    out = prefix
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _unwrap(tp: Any) -> Any:
    """Strip Annotated and Optional around a type annotation."""
    while True:
        origin = typing.get_origin(tp)
        if origin is typing.Annotated:
            tp = typing.get_args(tp)[0]
        elif origin in (typing.Union, types.UnionType):
            args = [a for a in typing.get_args(tp) if a is not type(None)]
            if len(args) != 1:
                return tp
            tp = args[0]
        else:
            return tp


def _model_at(model: type[BaseModel], loc: Sequence[int | str]) -> type[BaseModel] | None:
    """The model class that holds the key at `loc` (to list its allowed keys)."""
    tp: Any = model
    for part in loc:
        tp = _unwrap(tp)
        origin = typing.get_origin(tp)
        if origin in (list, dict):
            tp = typing.get_args(tp)[-1]
        elif isinstance(tp, type) and issubclass(tp, BaseModel):
            by_alias = {(f.alias or n): f for n, f in tp.model_fields.items()}
            if part not in by_alias:
                return None
            tp = by_alias[str(part)].annotation
        else:
            return None
    tp = _unwrap(tp)
    return tp if isinstance(tp, type) and issubclass(tp, BaseModel) else None


def pydantic_issues(
    error: ValidationError,
    prefix: str,
    model: type[BaseModel],
    pattern_words: Mapping[str, str],
) -> list[ConfigIssue]:
    """Pydantic's errors as config issues: by path, unknown keys with the
    allowed ones (and a close match), a pattern by the words that say it
    (PATTERN_WORDS: a regex is no message for a person)."""
    issues = []
    for e in error.errors():
        loc = tuple(e["loc"])
        path = config_path(prefix, loc)
        if e["type"] == "extra_forbidden":
            holder = _model_at(model, loc[:-1])
            allowed = (
                sorted((f.alias or n) for n, f in holder.model_fields.items()) if holder else []
            )
            close = difflib.get_close_matches(str(loc[-1]), allowed, n=1)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            issues.append(ConfigIssue(path, f"unknown key (allowed: {', '.join(allowed)}){hint}"))
        elif e["type"] == "missing":
            issues.append(ConfigIssue(path, "required"))
        elif e["type"] == "string_pattern_mismatch" and e["ctx"]["pattern"] in pattern_words:
            words = pattern_words[e["ctx"]["pattern"]]
            issues.append(ConfigIssue(path, f"{words} (got {show(e['input'])})"))
        else:
            msg = str(e["msg"]).removeprefix("Value error, ")
            issues.append(ConfigIssue(path, f"{msg} (got {show(e['input'])})"))
    return issues
