"""One writer per output: exclusive locks held for a whole run (``fcntl.flock`` on a lock file).

A writer locks its output before it touches it and holds the lock until it is done. The OS drops a
flock when the process ends, however it ends, so a killed run never blocks a rerun: its lock file stays
behind and the next writer takes it over. The holder writes ``{pid, host, rank, world, job, since}``
into the lock file; a second writer gets ``OutputInUseError`` naming the output and that holder. A
released lock removes its file.

* ``lock_file(path)``: a file that one process writes (``eagle-ms regenerate``'s JSONL); the lock file
  is ``<path>.lock``.
* ``lock_dir(directory, rank, world, job)``: a directory written by the ranks of ONE job (bench and
  sweep runs, preprocessing, draft training; a one-process writer is rank 0 of 1). Rank r holds
  ``<directory>/.lock-rank-<r>``, so two writers of one rank refuse each other. Then every other rank
  lock held in the directory must belong to the same job -- same ``world`` and ``job`` id (msrun's
  scheduler address, ``None`` without msrun) -- else this rank refuses and releases. Of two ranks of
  different jobs, the one that locks second sees the first, so at least one of them refuses.

A probe of another rank's lock (``holders``) holds it for microseconds, and a rank that has just taken
its lock writes its record a moment later; both races are absorbed by retrying for ``GRACE_S``.
flock works between processes of one machine and, on NFS, through the server's byte-range locks.
"""
from __future__ import annotations

import fcntl
import glob
import json
import os
import socket
import time
from contextlib import contextmanager
from typing import Iterator

GRACE_S = 0.5  # how long a refused lock is retried before the holder is believed (see module doc)
POLL_S = 0.02
RANK_LOCK = ".lock-rank-{rank}"


class OutputInUseError(OSError):
    """Another live process (or another job) writes this output."""


def _record(fd: int) -> dict:
    """The holder record in a lock file ({} while its holder has not written it yet)."""
    os.lseek(fd, 0, os.SEEK_SET)
    try:
        record = json.loads(os.read(fd, 65536) or b"null")
    except ValueError:
        return {}
    return record if isinstance(record, dict) else {}


def describe(holder: dict) -> str:
    """``pid 123 on host, rank 0 of 2, msrun job J, since 2025-01-01T12:00:00`` (unknown fields dropped)."""
    if not holder:
        return "holder unknown"
    parts = [f"pid {holder.get('pid')} on {holder.get('host')}"]
    if holder.get("world", 1) > 1:
        parts.append(f"rank {holder.get('rank')} of {holder.get('world')}")
    if holder.get("job"):
        parts.append(f"job {holder['job']}")
    return ", ".join(parts + [f"since {holder.get('since')}"])


def _is_current(fd: int, path: str) -> bool:
    """Is the file open as ``fd`` still the one at ``path`` (a releasing holder removes it)?"""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino)


def _acquire(path: str, output: str, record: dict) -> int:
    """Lock ``path`` (created if missing) and write ``record`` into it; returns the open descriptor."""
    deadline = time.monotonic() + GRACE_S
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _record(fd)
            os.close(fd)
            if time.monotonic() < deadline:
                time.sleep(POLL_S)
                continue
            raise OutputInUseError(f"{output} is being written by another process ({describe(holder)}; lock "
                                   f"{path}): wait for it to end, or write to another output") from None
        if _is_current(fd, path):
            os.ftruncate(fd, 0)
            os.write(fd, json.dumps(record).encode("utf-8"))
            return fd
        os.close(fd)  # its holder released and removed it meanwhile: lock the new file


def _release(path: str, fd: int) -> None:
    try:
        os.unlink(path)  # before unlocking: a waiter that opened this file then sees it is stale
    except FileNotFoundError:
        pass
    finally:
        os.close(fd)


def _holder(path: str) -> dict | None:
    """The record of a lock file somebody holds ({} if unreadable after GRACE_S); None if free or absent."""
    deadline = time.monotonic() + GRACE_S
    while True:
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _record(fd)
        else:
            return None  # free: closing the descriptor drops the probe's shared lock
        finally:
            os.close(fd)
        if holder or time.monotonic() >= deadline:
            return holder
        time.sleep(POLL_S)


def file_holder(path: str) -> dict | None:
    """The holder record of ``lock_file(path)``'s lock ({} if unreadable); None when nobody holds it."""
    return _holder(f"{path}.lock")


def holders(directory: str) -> dict[str, dict]:
    """Lock file -> holder record of every rank lock held in ``directory`` right now."""
    found = {}
    for path in sorted(glob.glob(os.path.join(directory, RANK_LOCK.format(rank="*")))):
        holder = _holder(path)
        if holder is not None:
            found[path] = holder
    return found


def _new_record(rank: int, world: int, job: str | None) -> dict:
    return {"pid": os.getpid(), "host": socket.gethostname(), "rank": rank, "world": world, "job": job,
            "since": time.strftime("%Y-%m-%dT%H:%M:%S")}


@contextmanager
def lock_file(path: str) -> Iterator[None]:
    """Hold ``<path>.lock`` for the ``with`` block: this process is the only writer of ``path``.

    Creates the parent directory. Raises ``OutputInUseError`` naming ``path`` and the holder.
    """
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    lock = f"{path}.lock"
    fd = _acquire(lock, path, _new_record(0, 1, None))
    try:
        yield
    finally:
        _release(lock, fd)


@contextmanager
def lock_dir(directory: str, rank: int = 0, world: int = 1, job: str | None = None) -> Iterator[None]:
    """Hold rank ``rank``'s lock on ``directory`` (created if missing) for the ``with`` block.

    Raises ``OutputInUseError`` naming the directory and the holder when another process holds this
    rank's lock, or when a rank of another job (other ``world`` or ``job``) holds one (module doc).
    """
    os.makedirs(directory, exist_ok=True)
    lock = os.path.join(directory, RANK_LOCK.format(rank=rank))
    mine = _new_record(rank, world, job)
    fd = _acquire(lock, directory, mine)
    try:
        for path, holder in holders(directory).items():
            if path != lock and (holder.get("world"), holder.get("job")) != (world, job):
                raise OutputInUseError(
                    f"{directory} is being written by another job ({describe(holder)}; lock {path}); this "
                    f"process would be {describe(mine)}: wait for that job to end, or write to another output")
        yield
    finally:
        _release(lock, fd)
