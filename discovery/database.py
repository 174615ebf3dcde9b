"""What `--db` names: an SQLite file (one service) or a PostgreSQL database
(several replicas). Decided here, before anything is opened or created, so a
value that is neither fails with a message that says why."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import psycopg.conninfo

POSTGRES_SCHEMES = ("postgresql", "postgres")
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):")


class DatabaseError(ValueError):
    """`--db` names nothing this service can use."""


@dataclass(frozen=True)
class PostgresUrl:
    """A libpq connection URL; the password (in the URL or `PGPASSWORD`) is
    never shown."""

    url: str = field(repr=False)

    @property
    def shown(self) -> str:
        return redact(self.url)

    def __str__(self) -> str:
        return self.shown


Database = Path | PostgresUrl


def redact(url: str) -> str:
    """The URL with any password replaced by ***."""
    return re.sub(r"(//[^/@:]*):[^/@]*@", r"\1:***@", url)


def parse_database(value: str) -> Database:
    """An SQLite path or a PostgreSQL URL; DatabaseError naming the problem."""
    if not value.strip():
        raise DatabaseError("--db is empty: give a file path (SQLite) or postgresql://...")
    scheme = _SCHEME.match(value)
    # A URL is SCHEME://...; a postgres scheme without the slashes is a typo,
    # not a file name. Anything else is a path (file names may hold colons).
    if scheme and (
        value[scheme.end() :].startswith("//") or scheme.group(1).lower() in POSTGRES_SCHEMES
    ):
        name = scheme.group(1).lower()
        if name not in POSTGRES_SCHEMES:
            raise DatabaseError(
                f"--db {redact(value)!r}: {name!r} is not a supported database; give a file "
                "path for SQLite or a postgresql://USER@HOST:PORT/DBNAME URL"
            )
        try:
            params = psycopg.conninfo.conninfo_to_dict(value)  # libpq's own parser
        except psycopg.ProgrammingError as error:
            reason = redact(str(error).splitlines()[0]) if str(error) else "malformed"
            raise DatabaseError(f"--db {redact(value)!r} is not a valid URL: {reason}") from None
        del params  # valid; libpq's defaults (user, dbname, PGPASSWORD, ...) apply
        return PostgresUrl(value)
    path = Path(value)
    if path.is_dir():
        raise DatabaseError(f"--db {value}: is a directory; give the SQLite file inside it")
    for parent in path.absolute().parents:
        if parent.exists():
            if not parent.is_dir():
                raise DatabaseError(f"--db {value}: {parent} is a file, not a directory")
            break
    return path


__all__ = ["Database", "DatabaseError", "PostgresUrl", "parse_database", "redact"]
