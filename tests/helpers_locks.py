"""A lock on an output held by ANOTHER process (a real second writer), for the one-writer-per-output tests."""
from __future__ import annotations

import os
import subprocess
import sys
from contextlib import contextmanager

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# argv: kind (file|dir) path rank world job('-' = None). Prints "locked" (then holds until stdin closes)
# or "refused: <message>" (exit 3).
_HOLDER = """
import sys
from eagle_ms.locks import OutputInUseError, lock_dir, lock_file
kind, path, rank, world, job = sys.argv[1:6]
lock = lock_file(path) if kind == "file" else lock_dir(path, int(rank), int(world), None if job == "-" else job)
try:
    with lock:
        print("locked", flush=True)
        sys.stdin.read()
except OutputInUseError as exc:
    print(f"refused: {exc}", flush=True)
    sys.exit(3)
"""


def start_holder(kind: str, path: str, rank: int = 0, world: int = 1, job: str | None = None):
    """(process, first line it printed: "locked" or "refused: ..."); close its stdin to release."""
    proc = subprocess.Popen([sys.executable, "-c", _HOLDER, kind, str(path), str(rank), str(world), job or "-"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": REPO})
    return proc, proc.stdout.readline().strip()


def stop_holder(proc) -> None:
    proc.stdin.close()
    proc.wait(timeout=30)


@contextmanager
def held_elsewhere(kind: str, path: str, rank: int = 0, world: int = 1, job: str | None = None):
    """Another process holds the lock during the block; yields its pid."""
    proc, line = start_holder(kind, path, rank, world, job)
    try:
        assert line == "locked", line
        yield proc.pid
    finally:
        stop_holder(proc)
