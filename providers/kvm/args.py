"""Typed inputs of the kvm dynamic resources.

Each resource has one frozen dataclass of its inputs. A field declares, once,
the key it has among the resource's properties (camelCase, as the engine and
the state file show it), how a value read back from the engine becomes the
field's type (numbers cross the engine as floats), and what a change of it
does: ``REPLACE`` (a new object on the host) or ``UPDATE`` (in place). The
program builds the dataclass and sends :meth:`ResourceArgs.to_props`; the
provider process rebuilds it with :meth:`ResourceArgs.from_props`, and its
``diff`` asks :meth:`ResourceArgs.changed` which keys differ.

Inputs that are outputs of other resources (a volume's path, a seed's digest)
are typed by the class parameter ``Made``: ``pulumi.Input[str]`` in the
program (an Output, usually), ``str`` in the provider.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from enum import Enum
from typing import Any, Self, TypeVar

import pulumi

from providers.kvm.access import HostAccess

Made = TypeVar("Made", covariant=True)
"""The type of inputs another resource makes: an Input in the program, str in
the provider (covariant: the dataclasses are frozen)."""


class Change(Enum):
    REPLACE = "replace"
    UPDATE = "update"


@dataclasses.dataclass(frozen=True)
class _Spec:
    key: str
    change: Change
    convert: Callable[[Any], Any]
    optional: bool


def _same(value: Any) -> Any:
    return value


def _bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"expected true or false, got {value!r}")
    return value


def _int(value: Any) -> int:
    # Numbers come back from the engine as floats; 2.5 is an error, not 2.
    if isinstance(value, bool) or not isinstance(value, int | float) or int(value) != value:
        raise TypeError(f"expected a whole number, got {value!r}")
    return int(value)


def _str(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected a string, got {value!r}")
    return value


CONVERTERS: dict[type, Callable[[Any], Any]] = {str: _str, int: _int, bool: _bool}


def arg(
    key: str,
    change: Change,
    kind: type | None = None,
    *,
    optional: bool = False,
    default: Any = dataclasses.MISSING,
) -> Any:
    """A field of a resource's inputs: its property ``key``, what a change
    does, and its type (``str``, ``int``, ``bool``, ``HostAccess``; None
    passes the value through). ``optional`` fields may be None."""
    if kind is HostAccess:
        convert: Callable[[Any], Any] = HostAccess.from_props
    elif kind is None:
        convert = _same
    else:
        convert = CONVERTERS[kind]
    spec = _Spec(key, change, convert, optional)
    return dataclasses.field(default=default, metadata={"arg": spec})


def _specs(cls: type) -> list[tuple[str, _Spec]]:
    return [(f.name, f.metadata["arg"]) for f in dataclasses.fields(cls) if "arg" in f.metadata]


def is_unknown(value: Any) -> bool:
    """Whether VALUE is not known yet (a preview: made by a resource not made)."""
    return isinstance(value, pulumi.output.Unknown)


def _comparable(spec: _Spec, value: Any) -> Any:
    """A value as diff compares it: host settings as HostAccess (ports come
    back as floats), empty optional strings as None."""
    # `==`: each access to a classmethod makes a new bound method.
    if spec.convert == HostAccess.from_props and isinstance(value, dict):
        try:
            return HostAccess.from_props(value)
        except (TypeError, ValueError, KeyError):
            return value
    if spec.optional and value == "":
        return None
    return value


class ResourceArgs:
    """Base of the inputs dataclasses (mix into a frozen dataclass)."""

    def to_props(self) -> dict[str, Any]:
        """The resource's input properties (values may be Outputs in the program)."""
        props: dict[str, Any] = {}
        for name, spec in _specs(type(self)):
            value = getattr(self, name)
            props[spec.key] = value.to_props() if isinstance(value, HostAccess) else value
        return props

    @classmethod
    def from_props(cls, props: dict[str, Any]) -> Self:
        """The inputs from the properties the engine hands a provider; a
        missing or mistyped value is a ValueError naming its key."""
        values: dict[str, Any] = {}
        defaults = {f.name: f.default for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        for name, spec in _specs(cls):
            value = props.get(spec.key)
            if value is None or (spec.optional and value == ""):
                if spec.optional:
                    values[name] = None
                    continue
                if defaults[name] is not dataclasses.MISSING:
                    continue
                raise ValueError(f"input {spec.key!r} is missing")
            try:
                values[name] = spec.convert(value)
            except (TypeError, ValueError, KeyError) as error:
                raise ValueError(f"input {spec.key!r}: {error}") from None
        return cls(**values)

    @classmethod
    def keys(cls, change: Change) -> tuple[str, ...]:
        """The property keys whose change does ``change``."""
        return tuple(spec.key for _name, spec in _specs(cls) if spec.change is change)

    @classmethod
    def changed(
        cls, olds: dict[str, Any], news: dict[str, Any], change: Change | None = None
    ) -> list[str]:
        """Keys (of fields declared ``change``, or of all) whose value differs
        between the state and the new inputs, in field order; a value not known
        yet (preview) differs."""
        found = []
        for _name, spec in _specs(cls):
            if change is not None and spec.change is not change:
                continue
            old, new = olds.get(spec.key), news.get(spec.key)
            if is_unknown(new) or _comparable(spec, old) != _comparable(spec, new):
                found.append(spec.key)
        return found


__all__ = ["Change", "Made", "ResourceArgs", "arg", "is_unknown"]
