"""Atomic file and directory writes, and file hashing: the one home of both in eagle_ms.

Every output a reader may see while it is being written (JSON sidecars, manifests, traces, checkpoints,
safetensors files) goes through ``atomic_write``: the content goes to a temp file next to the target
(``<path>.tmp-<pid>``), which is then renamed over the target, so a reader sees the old file or the
whole new one, never half of it. On any failure the temp file is removed and the target is unchanged;
an OS error (read-only or full file system, a path through a regular file) is re-raised naming the
target. ``replace_dir`` does the same for a directory built in place (training checkpoints).
``check_can_create`` tells, before hours of work, whether an output directory could be written.

``file_sha256`` hashes a file's bytes; with ``memo_path`` the digest is remembered in a JSON memo keyed
by (absolute path, size, mtime_ns), so an unchanged multi-GB checkpoint is hashed once.
"""
from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import tempfile
from typing import IO, Any, Callable

HASH_BLOCK = 1 << 20  # bytes read per hash update


def temp_path(path: str) -> str:
    """The temp name ``atomic_write`` uses for ``path`` in this process."""
    return f"{path}.tmp-{os.getpid()}"


def atomic_write(path: str, write: Callable[[IO], Any], binary: bool = False) -> str:
    """Run ``write(handle)`` on a temp file next to ``path``, then rename it to ``path``; returns ``path``.

    Creates the parent directory. On an exception the temp file is removed and ``path`` is untouched; an
    ``OSError`` with an errno comes back as the same kind of error naming ``path``.
    """
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = temp_path(path)
    try:
        with open(tmp, "wb" if binary else "w", **({} if binary else {"encoding": "utf-8"})) as handle:
            write(handle)
        os.replace(tmp, path)
    except OSError as exc:
        if exc.errno is None:
            raise
        raise OSError(exc.errno, exc.strerror, path) from exc  # e.g. "[Errno 28] No space left on device: 'x'"
    finally:
        _remove_quietly(tmp)
    return path


def _remove_quietly(path: str) -> None:
    """Remove a temp file if it is there; a failure here must not hide the error being handled."""
    try:
        os.remove(path)
    except OSError:
        pass


def write_json_atomic(path: str, obj: Any, indent: int | None = 1, sort_keys: bool = False,
                      newline: bool = False) -> str:
    """``obj`` as UTF-8 JSON (non-ASCII kept) at ``path``, atomically; returns ``path``."""
    def write(handle):
        json.dump(obj, handle, indent=indent, ensure_ascii=False, sort_keys=sort_keys)
        if newline:
            handle.write("\n")
    return atomic_write(path, write)


def replace_dir(final: str, build: Callable[[str], Any]) -> str:
    """Build a directory with ``build(tmp_dir)``, then swap it in for ``final``; returns ``final``.

    An existing ``final`` is removed just before the rename (a crash between the two leaves the
    complete temp directory, never a half-written ``final``).
    """
    tmp = f"{final}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    try:
        build(tmp)
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def check_can_create(directory: str) -> None:
    """Raise an ``OSError`` naming ``directory`` unless files can be written in it once it is created.

    Creates nothing that stays: a temp file is made and removed in ``directory`` or, if it does not
    exist yet, in its nearest existing ancestor (which must be a directory). This is a real write, so
    it is right for root and for read-only mounts too, where permission bits tell nothing.
    """
    directory = os.path.abspath(directory)
    probe = directory
    while not os.path.exists(probe):
        probe = os.path.dirname(probe)
    if not os.path.isdir(probe):
        raise NotADirectoryError(errno.ENOTDIR, f"cannot create {directory}: {probe} is not a directory")
    try:
        fd, tmp = tempfile.mkstemp(dir=probe, prefix=".eagle-ms-probe-")
    except OSError as exc:
        raise OSError(exc.errno, f"cannot write {directory} ({exc.strerror} in {probe})") from exc
    os.close(fd)
    os.remove(tmp)


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(HASH_BLOCK), b""):
            h.update(block)
    return h.hexdigest()


def _read_memo(memo_path: str) -> dict:
    try:
        with open(memo_path, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return {}  # a missing or damaged memo only costs a re-hash
    return data if isinstance(data, dict) else {}


_PROCESS_MEMO: dict[str, str] = {}


def file_sha256(path: str, memo_path: str | None = None) -> str:
    """sha256 hex of a file's bytes.

    With ``memo_path`` the digest is memoised on (absolute path, size, mtime_ns), in this process and in
    the JSON file ``memo_path``; a memo that cannot be written (read-only location) is skipped: it is
    only a cache. Without it the file is always read.
    """
    if memo_path is None:
        return _sha256(path)
    st = os.stat(path)
    key = f"{os.path.abspath(path)}|{st.st_size}|{st.st_mtime_ns}"
    if key not in _PROCESS_MEMO:
        memo = _read_memo(memo_path)
        if key not in memo:
            memo[key] = _sha256(path)
            try:
                write_json_atomic(memo_path, memo, sort_keys=True)
            except OSError:
                pass
        _PROCESS_MEMO[key] = memo[key]
    return _PROCESS_MEMO[key]
