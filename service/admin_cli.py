"""`amct admin ...`: projects and API keys, straight against the database named by the environment.

Run where DATABASE_URL (or AMCT_DATA_DIR for the embedded SQLite) points at the service's database.
A new key's secret is printed once and never stored: copy it then.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Column, Table

admin_app = typer.Typer(help="Projects and API keys (run against the service's database).", no_args_is_help=True)
console = Console()
err_console = Console(stderr=True)


class Scope(StrEnum):
    read = "read"
    write = "write"
    admin = "admin"


def _sessions():
    from core.db import migrate
    from core.db.session import session_factory
    from core.settings import Settings

    settings = Settings()
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    # Idempotent, and makes `create-project` work on a database no server has started on yet.
    migrate.upgrade(settings.resolved_database_url)
    return session_factory(settings.resolved_database_url)


def _fail(message: str) -> typer.Exit:
    err_console.print(f"[red]error:[/red] {message}")
    return typer.Exit(code=1)


@admin_app.command("create-project")
def create_project(
    project_id: Annotated[str, typer.Argument(metavar="ID", help="e.g. vision-team")],
    name: Annotated[str | None, typer.Option(help="display name")] = None,
) -> None:
    """Create a project: jobs, models, configs, datasets and keys all belong to one."""
    from service import auth

    try:
        auth.create_project(_sessions(), project_id, name)
    except ValueError as e:
        raise _fail(str(e)) from None
    console.print(f"created project {project_id}")


@admin_app.command("create-key")
def create_key(
    project: Annotated[str, typer.Argument(help="the project the key acts for")],
    scope: Annotated[
        list[Scope] | None,
        typer.Option("--scope", help="read, write (implies read) or admin (implies both); repeatable"),
    ] = None,
    name: Annotated[str | None, typer.Option(help="what the key is for")] = None,
) -> None:
    """Create an API key and print its secret, once."""
    from service import auth

    scopes = [s.value for s in scope] if scope else ["read"]
    try:
        key_id, secret = auth.create_key(_sessions(), project, scopes, name)
    except ValueError as e:
        raise _fail(str(e)) from None
    err_console.print(
        f"key {key_id} for project {project}, scopes {', '.join(sorted(scopes))}. The secret below is shown only now:"
    )
    # The secret alone on stdout, so `KEY=$(amct admin create-key ...)` works.
    print(secret)


@admin_app.command("list-keys")
def list_keys(project: Annotated[str, typer.Argument(help="the project whose keys to list")]) -> None:
    """The project's keys: id, prefix, scopes, dates. Secrets are never shown."""
    from service import auth

    keys = auth.list_keys(_sessions(), project)
    # The id is what revoke-key takes: never wrapped, whatever the terminal's width.
    table = Table(
        Column("id", no_wrap=True, min_width=36),
        Column("prefix", no_wrap=True),
        "name",
        "scopes",
        "created",
        "last used",
        "revoked",
    )
    for k in keys:
        table.add_row(
            k.id,
            k.prefix + "…",
            k.name,
            ",".join(k.scopes),
            f"{k.created_at:%Y-%m-%d}",
            f"{k.last_used_at:%Y-%m-%d %H:%M}" if k.last_used_at else "-",
            f"{k.revoked_at:%Y-%m-%d %H:%M}" if k.revoked_at else "-",
        )
    console.print(table if keys else f"project {project} has no keys")


@admin_app.command("revoke-key")
def revoke_key(key_id: Annotated[str, typer.Argument(help="the key's id (from list-keys)")]) -> None:
    """Revoke a key: requests with it answer 401 from now on."""
    from service import auth

    if not auth.revoke_key(_sessions(), key_id):
        raise _fail(f"no key with id {key_id!r}")
    console.print(f"revoked key {key_id}")
