"""What `--db` names: an SQLite file (one service) or a PostgreSQL database
(several replicas). Decided here, before anything is opened or created, so a
value that is neither fails with a message that says why.

A PostgreSQL URL is shown (logs, errors) as libpq itself reads it, rebuilt
from its parameters with every secret one as `***`: a password in the
userinfo, in `?password=`, percent-encoded (`?pass%77ord=`), or any other
parameter libpq keeps from display (`sslpassword`, ...). A URL libpq cannot
read is shown with its userinfo and every query value masked, and libpq's
reason without the text it quotes, which may be a piece of the password.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

import psycopg.conninfo
from psycopg import pq

POSTGRES_SCHEMES = ("postgresql", "postgres")
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):")
MASK = "***"
# Kept from display whatever this libpq says (its `*` options), in case an
# older one does not know them all.
_ALWAYS_SECRET = frozenset(
    {"password", "sslpassword", "oauth_client_secret", "scram_client_key", "scram_server_key"}
)
_QUOTED = re.compile(r'"[^"]*"')


class DatabaseError(ValueError):
    """`--db` names nothing this service can use."""


@dataclass(frozen=True)
class PostgresUrl:
    """A libpq connection URL; the password (in the URL or `PGPASSWORD`) is
    never shown."""

    url: str = field(repr=False)

    @property
    def shown(self) -> str:
        """For operators (logs, start-up errors): everything but the secrets."""
        return redact(self.url)

    @property
    def public(self) -> str:
        """For clients: neither user, host nor database name."""
        return "PostgreSQL"

    def __str__(self) -> str:
        return self.shown


Database = Path | PostgresUrl


@functools.cache
def secret_parameters() -> frozenset[str]:
    """libpq's parameters that it keeps from display (`*`: passwords; `D`: debug
    options, SCRAM keys among them)."""
    hidden = {
        option.keyword.decode()
        for option in pq.Conninfo.get_defaults()
        if option.dispchar in (b"*", b"D")
    }
    return frozenset(hidden | _ALWAYS_SECRET)


def redact(url: str) -> str:
    """The URL with every secret replaced by ***, as libpq reads it; a URL libpq
    cannot read with its userinfo and query values masked."""
    scheme = url.partition(":")[0]
    if scheme.lower() not in POSTGRES_SCHEMES:
        return _masked(url)
    try:
        params = psycopg.conninfo.conninfo_to_dict(url)  # libpq's own parser
    except psycopg.Error:
        return _masked(url)
    return _rebuilt(scheme, {k: str(v) for k, v in params.items() if v is not None})


def _rebuilt(scheme: str, params: dict[str, str]) -> str:
    secret = secret_parameters()
    user = params.pop("user", None)
    password = params.pop("password", None)
    dbname = params.pop("dbname", None)
    hosts = params["host"].split(",") if params.get("host") else []
    ports = params["port"].split(",") if params.get("port") else []
    netloc = ""
    # Hosts in the authority when they fit there (no socket directory, one
    # port per host or none); otherwise they stay query parameters.
    if hosts and not any(h.startswith(("/", "@")) for h in hosts) and len(ports) in (0, len(hosts)):
        del params["host"]
        params.pop("port", None)
        netloc = ",".join(
            (f"[{h}]" if ":" in h and "@" not in h else _part(h))
            + (f":{ports[i] if ports[i].isdigit() else MASK}" if ports and ports[i] else "")
            for i, h in enumerate(hosts)
        )
    userinfo = quote(user, safe="") if user is not None else ""
    if password is not None:
        userinfo += ":" + MASK
    if userinfo:
        netloc = f"{userinfo}@{netloc}"
    path = "/" + _part(dbname) if dbname is not None else ""
    query = "&".join(
        f"{key}={MASK if key in secret else _part(value, safe='/')}"
        for key, value in params.items()
    )
    return f"{scheme}://{netloc}{path}" + (f"?{query}" if query else "")


def _part(value: str, safe: str = "") -> str:
    """A value as shown. What precedes an `@` in it is a password libpq did not
    take for one (`user:p@ss@host` gives host `ss@host`; `user:pa/ss@host`
    gives host `user`, port `pa` and database `ss@host`)."""
    if "@" in value:
        return f"{MASK}@" + quote(value.rpartition("@")[2], safe=safe)
    return quote(value, safe=safe)


def _masked(url: str) -> str:
    """A URL no parser accepted: the scheme, host and path, but no userinfo and
    no query value (either may hold a password, in any encoding)."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        name = url.partition(":")[0]
        return f"{name}:{MASK}" if _SCHEME.match(url) else MASK
    # libpq ends the userinfo at its `@`, wherever a `?` or `/` stands before it.
    if "@" in rest:
        rest = f"{MASK}@" + rest.rpartition("@")[2]
    rest, question, query = rest.partition("?")
    shown = f"{scheme}://{rest}"
    if question:
        items = [
            f"{item.partition('=')[0]}={MASK}" if "=" in item else MASK for item in query.split("&")
        ]
        shown += "?" + "&".join(items)
    return shown


def _reason(error: psycopg.Error, url: str) -> str:
    """libpq's first line without what it quotes from the URL (a piece of the
    password, or all of it), but naming a query parameter it does not know."""
    text = str(error).splitlines()[0] if str(error) else "malformed"
    query = url.partition("?")[2]
    keys = {item.partition("=")[0] for item in query.split("&") if "=" in item and "@" not in item}

    def keep(match: re.Match[str]) -> str:
        inner = match.group(0)[1:-1]
        return match.group(0) if inner in keys or inner in ("=", "]") else '"..."'

    return _QUOTED.sub(keep, text)


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
            psycopg.conninfo.conninfo_to_dict(value)  # libpq's own parser
        except psycopg.Error as error:
            raise DatabaseError(
                f"--db {_masked(value)!r} is not a valid URL: {_reason(error, value)}"
            ) from None
        # Valid; libpq's defaults (user, dbname, PGPASSWORD, ...) apply.
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


__all__ = [
    "Database",
    "DatabaseError",
    "PostgresUrl",
    "parse_database",
    "redact",
    "secret_parameters",
]
