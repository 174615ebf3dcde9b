"""Small ElementTree helpers shared by the builders and the parser."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Mapping


def sub(
    parent: ET.Element,
    tag: str,
    attrs: Mapping[str, str] | None = None,
    text: str | None = None,
) -> ET.Element:
    """Append a child; attributes keep the order of ``attrs`` (ElementTree preserves it)."""
    child = ET.SubElement(parent, tag, dict(attrs or {}))
    if text is not None:
        child.text = text
    return child


def element(
    tag: str, attrs: Mapping[str, str] | None = None, text: str | None = None
) -> ET.Element:
    node = ET.Element(tag, dict(attrs or {}))
    if text is not None:
        node.text = text
    return node


def to_pretty_string(root: ET.Element) -> str:
    """Serialize with a 2-space indent and a final newline.

    Indents ``root`` in place (whitespace only).  Not round-tripped through a
    parser on purpose: that would rename the literal ``ep:`` prefix to ``ns0:``.
    """
    ET.indent(root, space="  ")
    return ET.tostring(root, encoding="unicode") + "\n"


def local_name(tag: str) -> str:
    """``{uri}name`` -> ``name``; a plain tag is returned unchanged."""
    return tag.rsplit("}", 1)[-1]


def namespace(tag: str) -> str | None:
    """``{uri}name`` -> ``uri``; ``None`` for a tag without a namespace."""
    return tag[1:].split("}", 1)[0] if tag.startswith("{") else None


def parse(xml: str, what: str) -> ET.Element:
    """Parse XML text, turning syntax errors into ValueError naming ``what``."""
    try:
        return ET.fromstring(xml)
    except ET.ParseError as exc:
        raise ValueError(f"{what}: not well-formed XML ({exc})") from exc
