"""`--db`: an SQLite path or a PostgreSQL URL, told apart before anything is
opened or created; anything else refused with the reason."""

from __future__ import annotations

from pathlib import Path

import pytest

from discovery.cli import parser, settings_from
from discovery.database import DatabaseError, PostgresUrl, parse_database, redact


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://postgres@127.0.0.1:25433/bars",
        "postgres://crawler:secret@db.internal/leases?sslmode=require",
        "postgresql:///leases?host=/run/postgresql",
        "postgresql://db.internal",  # libpq's defaults name the database
    ],
)
def test_postgres_urls_are_taken_as_they_are(url: str) -> None:
    assert parse_database(url) == PostgresUrl(url)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("mysql://u@h/x", "'mysql' is not a supported database"),
        ("sqlite:///tmp/x.db", "'sqlite' is not a supported database"),
        ("postgresql:h/db", "is not a valid URL"),
        ("postgresql://h/db?nonsense=1", "is not a valid URL"),
        ("", "--db is empty"),
    ],
)
def test_other_urls_are_refused_with_the_reason(value: str, message: str) -> None:
    with pytest.raises(DatabaseError, match=message):
        parse_database(value)


def test_paths_are_sqlite_files_and_must_be_usable(tmp_path: Path) -> None:
    assert parse_database(str(tmp_path / "new" / "leases.db")) == tmp_path / "new" / "leases.db"
    assert parse_database("leases:v2.db") == Path("leases:v2.db")  # a colon in a file name
    with pytest.raises(DatabaseError, match="is a directory"):
        parse_database(str(tmp_path))
    (tmp_path / "file").write_text("")
    with pytest.raises(DatabaseError, match=r"file is a file, not a directory"):
        parse_database(str(tmp_path / "file" / "leases.db"))
    assert not (tmp_path / "new").exists()  # deciding creates nothing


def test_a_password_is_never_shown() -> None:
    url = "postgresql://crawler:hunter2@db:5432/leases"
    shown = PostgresUrl(url)
    assert "hunter2" not in repr(shown) and "hunter2" not in str(shown)
    assert redact(url) == "postgresql://crawler:***@db:5432/leases"
    with pytest.raises(DatabaseError) as refused:
        parse_database("mysql://crawler:hunter2@db/x")
    assert "hunter2" not in str(refused.value)


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        # Wherever libpq finds a password, and however it is encoded.
        (
            "postgresql://postgres@127.0.0.1:25433/db?password=hunter2",
            "postgresql://postgres:***@127.0.0.1:25433/db",
        ),
        ("postgresql://u:hunt%65r2@h/db", "postgresql://u:***@h/db"),
        ("postgresql://u@h/db?pass%77ord=hunter2", "postgresql://u:***@h/db"),
        ("postgresql://u@h/db?password=hunt%65r2&password=hunter2", "postgresql://u:***@h/db"),
        ("postgresql://u:hun?ter2@h/db", "postgresql://u:***@h/db"),
        ("postgres://u:hunter2@[::1]:5/db", "postgres://u:***@[::1]:5/db"),
        # Other parameters libpq keeps from display.
        (
            "postgresql://u@h/db?sslmode=require&sslpassword=hunter2",
            "postgresql://u@h/db?sslmode=require&sslpassword=***",
        ),
        (
            "postgresql://u@h/db?scram_client_key=hunter2",
            "postgresql://u@h/db?scram_client_key=***",
        ),
        # What is no secret stays readable.
        (
            "postgresql://u:hunter2@h1:5,h2:6/db?target_session_attrs=any",
            "postgresql://u:***@h1:5,h2:6/db?target_session_attrs=any",
        ),
        ("postgresql:///leases?host=/run/postgresql", "postgresql:///leases?host=/run/postgresql"),
        ("postgresql://db.internal", "postgresql://db.internal"),
        # A password with an unencoded @ or /: libpq takes part of it for the
        # host, port or database; that part is masked too.
        ("postgresql://u:hunt@er2@h/db", "postgresql://u:***@***@h/db"),
        ("postgresql://u:hu/nter2@h/db", "postgresql://u:***/***@h%2Fdb"),
    ],
)
def test_no_form_of_password_is_shown(url: str, shown: str) -> None:
    assert parse_database(url) == PostgresUrl(url)
    assert PostgresUrl(url).shown == shown == str(PostgresUrl(url))
    for piece in ("hunter2", "hunt", "nter2", "er2"):
        assert piece not in PostgresUrl(url).shown


@pytest.mark.parametrize(
    ("url", "message"),
    [
        (
            "postgresql://u:hunt%zzer2@h/db",
            "'postgresql://***@h/db' is not a valid URL: invalid percent-encoded token",
        ),
        (
            "postgresql://u@h/db?password=hunter2%zz",
            "'postgresql://***@h/db?password=***' is not a valid URL: invalid percent-encoded",
        ),
        ("postgresql://u@h/db?hunter2", "missing key/value separator"),
        ("postgresql://u@h/db?password=hunter2=", 'in URI query parameter: "password"'),
        ("postgresql://u:hunter2@[::1/db", "'postgresql://***@[::1/db' is not a valid URL"),
        ("postgresql:u:hunter2@h/db", "'postgresql:***' is not a valid URL"),
        ("postgresql://u:hunter2@h/db?nonsense=1", 'invalid URI query parameter: "nonsense"'),
        ("postgresql://u:hun?ter2@h/db?x%zz=1", "'postgresql://***@h/db?x%zz=***'"),
    ],
)
def test_a_malformed_url_never_echoes_its_password(url: str, message: str) -> None:
    with pytest.raises(DatabaseError) as refused:
        parse_database(url)
    assert message in str(refused.value)
    for piece in ("hunter2", "hunt", "ter2"):
        assert piece not in str(refused.value)
        assert piece not in redact(url)


def test_clients_see_neither_user_host_nor_database() -> None:
    assert (
        PostgresUrl("postgresql://crawler:hunter2@db.internal:5432/leases").public == "PostgreSQL"
    )


def test_the_command_line_takes_either(capsys: pytest.CaptureFixture[str]) -> None:
    base = ["serve", "--fleet", "f.json", "--listen", "127.0.0.1:8080", "--db"]
    args = parser().parse_args([*base, "postgresql://u@h:5/d"])
    assert settings_from(args, {}).db == PostgresUrl("postgresql://u@h:5/d")
    with pytest.raises(SystemExit) as stopped:
        parser().parse_args([*base, "redis://h/0"])
    assert stopped.value.code == 2
    assert "'redis' is not a supported database" in capsys.readouterr().err
