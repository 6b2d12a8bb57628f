"""The files of a distributed ``eagle-ms regenerate``: rank part files, receipts, and the merge.

Under msrun with W workers, rank r answers the conversations whose ``index % W == r`` (``index`` is
the position among the data's kept conversations, the same for every rank) and appends them to its own
part file ``<out>.part<r>-of-<W>``, under that file's lock and with the output's resume rules (a
partial last line is cut off, finished ids are skipped). A rank that has answered all of its share writes
the receipt ``<part>.done`` (``{"rank", "world", "records", "error"}``; ``error`` is set when the
rank failed, so rank 0 stops waiting for it).

Rank 0, after its own share, waits for every other rank's receipt written during this run (older
receipts are ignored), then merges: under the output's lock it reads the output (records of earlier
runs) and every part file of any layout, keeps one record per id, sorts the records by ``index`` and
replaces the output atomically, then removes the parts and receipts. A one-process run ends with the
same merge. Each record depends only on its conversation (rows of a batch never interact, tested in
tests/test_regenerate.py), so **the finished file has the same bytes whatever the rank layout**.

Worked example, 5 kept conversations, W = 2: rank 0 writes indices 0, 2, 4 to ``out.part0-of-2``,
rank 1 writes 1, 3 to ``out.part1-of-2``; rank 0 merges them into ``out`` as 0, 1, 2, 3, 4.

A killed rank leaves its part (resumable) and no receipt: rank 0 names it after ``wait_timeout``
seconds, and rerunning the same command answers only what is missing, then merges.
"""
from __future__ import annotations

import glob
import json
import os
import re
import time

from eagle_ms.files import atomic_write
from eagle_ms.locks import OutputInUseError, describe, file_holder, lock_file
from eagle_ms.train.jsonl import open_resumable, read_records, record_line

PART_RE = re.compile(r"\.part(\d+)-of-(\d+)$")


class RanksMissingError(RuntimeError):
    """Rank 0 stopped waiting: ``missing`` maps rank -> why (``"no receipt"`` or the rank's error)."""

    def __init__(self, message: str, missing: dict[int, str]):
        super().__init__(message)
        self.missing = missing


def part_path(out: str, rank: int, world: int) -> str:
    return f"{out}.part{rank}-of-{world}"


def receipt_path(part: str) -> str:
    return f"{part}.done"


def part_files(out: str) -> list[str]:
    """Every part file of ``out``, of any rank layout, sorted by name."""
    return sorted(p for p in glob.glob(glob.escape(out) + ".part*-of-*") if PART_RE.search(p))


def finished_ids(out: str, skip: str | None = None) -> set[str]:
    """Ids already answered in ``out`` and in every part file except ``skip`` (read-only: a partial last
    line, e.g. of a rank still writing, is ignored, never cut)."""
    ids = set()
    for path in [out] + part_files(out):
        if path != skip and os.path.exists(path):
            ids.update(str(r["id"]) for r in read_records(path))
    return ids


def write_receipt(part: str, rank: int, world: int, records: int, error: str | None = None) -> None:
    atomic_write(receipt_path(part), lambda fh: json.dump(
        {"rank": rank, "world": world, "records": records, "error": error}, fh))


def clear_receipt(part: str) -> None:
    try:
        os.remove(receipt_path(part))
    except FileNotFoundError:
        pass


def wait_for_ranks(out: str, world: int, started: float, timeout: float, poll: float = 2.0, log=print) -> None:
    """Block until ranks 1..W-1 have each written a receipt since ``started`` (time.time()); raise
    RanksMissingError naming the ranks after ``timeout`` seconds, or as soon as every missing rank
    has reported a failure."""
    deadline, reported = time.time() + timeout, 0.0
    while True:
        missing = {}
        for rank in range(1, world):
            receipt = receipt_path(part_path(out, rank, world))
            if not os.path.exists(receipt) or os.path.getmtime(receipt) + 1.0 < started:
                missing[rank] = "no receipt"
                continue
            with open(receipt, encoding="utf-8") as fh:
                error = json.load(fh).get("error")
            if error:
                missing[rank] = f"failed: {error}"
        if not missing:
            return
        if time.time() >= deadline or all(why != "no receipt" for why in missing.values()):
            why = "; ".join(f"rank {r}: {w}" for r, w in missing.items())
            raise RanksMissingError(f"{out}: rank 0 stopped waiting after {time.time() - started:.0f} s -- {why}. "
                                    "Rerun the same command: finished conversations are kept and skipped.", missing)
        if time.time() - reported >= 60:
            log(f"[regenerate] rank 0 waits for ranks {sorted(missing)} to finish their share")
            reported = time.time()
        time.sleep(poll)


def merge_parts(out: str, locked: bool = False) -> int:
    """``out`` + every part file -> ``out``, one record per id, sorted by (index, id); parts and receipts
    are removed once ``out`` is replaced. Returns the record count. ``locked``: the caller holds
    ``out``'s lock (a one-process run); else it is taken here (``OutputInUseError`` if held elsewhere).
    Every part must be finished: its lock free (a part some rank still writes raises)."""
    if not locked:
        with lock_file(out):
            return merge_parts(out, locked=True)
    parts = part_files(out)
    for part in parts:
        holder = file_holder(part)
        if holder is not None:
            raise OutputInUseError(f"{part} is still being written ({describe(holder)}): merge after that run ends")
    records: dict[str, dict] = {}
    for path in [out] + parts:
        if os.path.exists(path):
            for record in open_resumable(path).records:
                records.setdefault(str(record["id"]), record)
    ordered = sorted(records.values(), key=lambda r: (int(r["index"]), str(r["id"])))

    def write(fh):
        for record in ordered:
            fh.write(record_line(record))
        fh.flush()
        os.fsync(fh.fileno())
    if ordered or os.path.exists(out):
        atomic_write(out, write, binary=True)
    for part in parts:
        for path in (receipt_path(part), part):
            try:
                os.remove(path)
            except FileNotFoundError:
                pass
    return len(ordered)
