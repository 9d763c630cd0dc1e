"""``autotune repair STORAGE``: make a storage that a fault left behind readable again, keeping a backup."""

from __future__ import annotations

import click

from autotune.cli.app import main
from autotune.errors import StorageError, redact


@main.command()
@click.argument("storage")
def repair(storage):
    """Cut a torn last record (a full disk, a kill -9 mid-write) off a journal storage, keeping a backup.

    The file as it was is copied to PATH.torn-<UTC time>.bak first; the whole records are kept and the count
    is printed. A whole journal, or another kind of storage, is left alone (and said so).

    Example: autotune repair journal:studies/autotune.log
    """
    from autotune.study.storage_check import check_journal_file, journal_path, repair_journal

    path = journal_path(storage)
    if path is None:
        raise StorageError(f"repair {redact(storage)}: only journal:PATH storages are repaired here (SQLite and "
                           "PostgreSQL roll back a cut write themselves); for a damaged SQLite file restore a backup")
    check_journal_file(storage, must_exist=True)
    done = repair_journal(storage)
    if done is None:
        click.echo(f"{path}: every record is whole; nothing to repair")
        return
    kept, backup = done
    click.echo(f"{path}: removed a torn last record; {kept} whole records kept; the file as it was is in {backup}")
