"""History files in every state a user's disk can leave them: read-only (the file or its folder), garbage,
a valid database with pages overwritten, damaged or unwritable while open. Real files in tmp, made with real
system calls.

Making a file read-only has to work as root too (CI runs as root), where ``chmod`` stops nothing: then the
file or folder is made immutable with ``chattr +i``, which stops root as well. Each helper checks that a
write really fails before the test goes on, and skips with the reason when this machine cannot do either.
"""

from __future__ import annotations

import os
import random
import resource
import signal
import sqlite3
import subprocess
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path

import pytest

from llmchat.core.history._store import MIGRATIONS, HistoryStore


async def _fill(db: Path, conversations: int) -> None:
    async with HistoryStore(db) as store:
        for i in range(conversations):
            conv = await store.new_conversation(title=f"conversation {i}")
            await store.add_user_message(conv, f"question {i} " + "x" * 3000)
            writer = store.reply_writer(await store.start_reply(conv, provider="p", model="m", mode="stream"))
            writer.append(f"answer {i}")
            await writer.finish(status="done", record={"model": "m", "total_ms": 12.5})


async def make_history(db: Path, conversations: int = 3) -> None:
    """A valid history with ``conversations`` conversations (one question, one answer each), closed."""
    db.parent.mkdir(parents=True, exist_ok=True)
    await _fill(db, conversations)


def make_old_history(db: Path, version: int) -> None:
    """A history as the llmchat of schema ``version`` left it, made with that llmchat's own statements
    (``MIGRATIONS[:version]``), in WAL mode, closed: conversation 1, "old one", held with provider
    "slow-llama" and model "llama3" with system prompt "Be brief.", one question and its answer."""
    db.parent.mkdir(parents=True, exist_ok=True)
    with closing(sqlite3.connect(db, isolation_level=None)) as conn:
        conn.execute("PRAGMA journal_mode=WAL")
        for migration in MIGRATIONS[:version]:
            for statement in migration:
                conn.execute(statement)
        conn.execute(f"PRAGMA user_version = {version:d}")
        conn.execute("INSERT INTO conversations (title, system_prompt, provider, model, created_at,"
                     " updated_at, touched) VALUES ('old one', 'Be brief.', 'slow-llama', 'llama3', 1, 2, 1)")
        conn.execute("INSERT INTO messages (conversation_id, role, content, status, created_at)"
                     " VALUES (1, 'user', 'how slow?', 'done', 1)")
        conn.execute("INSERT INTO messages (conversation_id, role, content, status, provider, model, mode,"
                     " record, created_at) VALUES (1, 'assistant', 'very', 'done', 'slow-llama', 'llama3',"
                     " 'stream', '{\"model\": \"llama3\", \"total_ms\": 900.0}', 2)")
        if "parent_id" in {row[1] for row in conn.execute("PRAGMA table_info(messages)")}:
            # A schema with the message tree: the answer follows the question, and it ends the branch.
            conn.execute("UPDATE messages SET parent_id = 1 WHERE id = 2")
            conn.execute("UPDATE conversations SET leaf_id = 2 WHERE id = 1")


def overwrite_pages(db: Path, first: int = 2, count: int = 4, seed: int = 7) -> None:
    """Writes random bytes over pages ``first``.. (1-based) of a closed database, past its 100-byte header:
    the header still says SQLite, the b-trees behind it are garbage."""
    with closing(sqlite3.connect(db)) as conn:
        size = int(conn.execute("PRAGMA page_size").fetchone()[0])
        pages = int(conn.execute("PRAGMA page_count").fetchone()[0])
    assert pages >= first + count, f"only {pages} pages: make a bigger history"
    with open(db, "r+b") as f:
        f.seek((first - 1) * size)
        f.write(random.Random(seed).randbytes(count * size))


def damage_while_open(db: Path) -> None:
    """Damages a history another connection holds open, so that it finds out on its next query: a write from
    here changes the WAL index (which makes every other connection read pages again), a checkpoint moves
    everything into the file, and then pages of the file are overwritten."""
    with closing(sqlite3.connect(db)) as other:
        other.execute("UPDATE conversations SET title = title")
        other.commit()
        assert other.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0] == 0
    overwrite_pages(db, count=6)


def file_state(db: Path) -> tuple[bytes, int]:
    return db.read_bytes(), db.stat().st_mtime_ns


def _write_fails(target: Path, folder: bool) -> bool:
    try:
        if folder:
            probe = target / ".write-probe"
            probe.touch()
            probe.unlink()
        else:
            os.close(os.open(target, os.O_WRONLY))
    except OSError:
        return True
    return False


@contextmanager
def read_only(target: Path) -> Iterator[str]:
    """Makes ``target`` (a file, or a folder: nothing can be created in it) read-only for this process, and
    yields how: "chmod" or "chattr". Undone on exit, so tmp can be cleaned."""
    folder = target.is_dir()
    mode = target.stat().st_mode
    how = ""
    try:
        target.chmod(0o500 if folder else 0o400)
        if _write_fails(target, folder):
            how = "chmod"
        else:  # root (CAP_DAC_OVERRIDE) writes through any mode
            target.chmod(mode)
            if subprocess.run(["chattr", "+i", str(target)], capture_output=True).returncode == 0:
                how = "chattr"
            if how != "chattr" or not _write_fails(target, folder):
                pytest.skip(f"cannot make {target} read-only here: chmod stops nothing for root, and chattr"
                            " +i is not available (it needs CAP_LINUX_IMMUTABLE and ext4, xfs or btrfs)")
        yield how
    finally:
        if how == "chattr":
            subprocess.run(["chattr", "-i", str(target)], check=True)
        target.chmod(mode)


@contextmanager
def no_file_can_grow() -> Iterator[None]:
    """While inside, every write of this process to a regular file fails (RLIMIT_FSIZE 0, EFBIG): what a
    full disk or a file turned read-only does to a connection already open, as any user, root included."""
    limits = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # else the kernel kills the process
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, limits[1]))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, limits)
        signal.signal(signal.SIGXFSZ, handler)
