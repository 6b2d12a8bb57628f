"""Append-only JSONL files that survive a killed writer.

Writer contract: one record = one ``write`` of ``json + "\\n"``, then fsync. So after a kill
the file is a sequence of complete lines, possibly followed by ONE partial line without a newline.
``open_resumable`` detects that partial tail, cuts it off (the file is repaired in place) and returns
the complete records; a malformed line *before* the tail cannot come from a kill and raises.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass


@dataclass(frozen=True)
class ResumeState:
    """Records already in the file and what the repair did."""

    records: list[dict]
    repaired_bytes: int  # bytes of a partial last line that were cut off (0 = file was intact)


def open_resumable(path: str) -> ResumeState:
    """Read the complete records of ``path`` (missing file: none) and cut a partial last line off."""
    if not os.path.exists(path):
        return ResumeState([], 0)
    with open(path, "rb") as fh:
        raw = fh.read()
    keep = raw.rfind(b"\n") + 1  # bytes up to and including the last newline
    tail = raw[keep:]
    if tail.strip():
        try:  # a complete last record that only lacks its newline is kept
            json.loads(tail)
            raw, keep, tail = raw + b"\n", len(raw) + 1, b""
            _append_newline(path)
        except json.JSONDecodeError:
            pass
    records = []
    for lineno, line in enumerate(raw[:keep].split(b"\n")[:-1], start=1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}: line {lineno} is not valid JSON ({exc}); only a partial LAST line can come "
                             "from an interrupted run, so this file was edited or corrupted") from None
    if tail:
        with open(path, "r+b") as fh:
            fh.truncate(keep)
            os.fsync(fh.fileno())
    return ResumeState(records, len(tail))


def _append_newline(path: str) -> None:
    with open(path, "ab") as fh:
        fh.write(b"\n")
        fh.flush()
        os.fsync(fh.fileno())


def _numbered_records(path: str, log=None) -> list[tuple[int, dict]]:
    """(line number, record) of every complete line (the ``read_records`` rules)."""
    with open(path, "rb") as fh:
        lines = fh.read().split(b"\n")
    records = []
    for n, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            records.append((n, json.loads(line)))
        except json.JSONDecodeError as exc:
            if n == len(lines):
                if log is not None:
                    log(f"ignoring a partial last line of {path}")
                continue
            raise ValueError(f"{path}: line {n} is not valid JSON ({exc})") from None
    return records


def read_records(path: str, log=None) -> list[dict]:
    """Complete records of a JSONL file without modifying it: a partial last line (a writer still running
    or killed) is skipped (and reported through ``log``); a malformed earlier line raises."""
    return [record for _, record in _numbered_records(path, log)]


def read_unique_records(path: str, log=None) -> list[dict]:
    """``read_records``, with at most one record per ``id`` (an id names one conversation).

    A later record whose ``id`` an earlier line already had is dropped when it is identical to that one
    (what two writers of one deterministic run appended twice; reported through ``log``), and raises
    ValueError naming the id, both lines and the file when it differs. Records without ``id`` are kept.
    """
    first: dict[str, tuple[int, dict]] = {}
    records, dropped = [], 0
    for n, record in _numbered_records(path, log):
        key = record.get("id") if isinstance(record, dict) else None
        if key is None:
            records.append(record)
            continue
        if str(key) in first:
            line, earlier = first[str(key)]
            if record != earlier:
                raise ValueError(f"{path}: record id {key!r} appears on line {line} and again, different, on "
                                 f"line {n}: two runs wrote into this file; keep one record per id")
            dropped += 1
            continue
        first[str(key)] = (n, record)
        records.append(record)
    if dropped and log is not None:
        log(f"{path}: dropped {dropped} identical duplicate record(s) (same id written twice)")
    return records


def record_line(record: dict) -> bytes:
    """One JSONL line of ``record`` as every writer here encodes it: compact JSON, non-ASCII kept, UTF-8,
    newline-terminated (so a file rewritten from its records has the bytes the appender wrote)."""
    return (json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n").encode("utf-8")


class JsonlAppender:
    """Append records durably: one ``write`` per record (continued only after a short write), then fsync.

    The file (and its directory) is created with the first record, so an appender that writes nothing
    leaves nothing behind. An OS error (full or read-only file system) is re-raised naming the file;
    what it can leave is a partial last line, which ``open_resumable`` cuts off on the next run.
    """

    def __init__(self, path: str):
        self.path = path
        self._fd: int | None = None

    def append(self, record: dict) -> None:
        data = memoryview(record_line(record))
        try:
            if self._fd is None:
                os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
                self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            while data:
                data = data[os.write(self._fd, data):]
            os.fsync(self._fd)
        except OSError as exc:
            raise OSError(exc.errno, exc.strerror, self.path) from exc

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> "JsonlAppender":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
