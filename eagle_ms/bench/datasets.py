"""Benchmark prompts: ``<data-dir>/<dataset>/question.jsonl`` files (MT-Bench, HumanEval, any same schema).

Schema, one JSON object a line: ``question_id`` (int), ``category`` (str), ``turns`` (non-empty list of
str: the user messages in order), optional ``reference`` (list of str). Blank lines are skipped; any
other malformed line raises ``DatasetError`` naming the file and the 1-based line number.

A question with T user messages gives T *turns*. Turn k > 1 is asked after the previous turns and the
**baseline's** (teacher-only greedy) answers to them, so the speculative run and the baseline run of a
turn always see the identical prompt (``eagle_ms.bench.runner`` builds it).

Example: ``load_questions(dir, ["mt_bench", "humaneval"], limit=1)`` -> the first MT-Bench question
(2 turns) and the first HumanEval question (1 turn); ``expand_turns`` -> 3 ``TurnSpec`` with keys
``mt_bench-81-1``, ``mt_bench-81-2``, ``humaneval-0-1`` and indices 0, 1, 2.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass

DEFAULT_DATASETS = ("mt_bench", "humaneval")
QUESTION_FILE = "question.jsonl"


class DatasetError(ValueError):
    """A malformed or missing question file (the message names the file and line)."""


@dataclass(frozen=True)
class Question:
    dataset: str
    question_id: int
    category: str
    turns: tuple[str, ...]
    reference: tuple[str, ...] | None = None


@dataclass(frozen=True)
class TurnSpec:
    """One evaluation turn. ``index`` is its position in the whole (unsharded) turn list."""

    dataset: str
    question_id: int
    turn: int  # 1-based
    category: str
    index: int

    @property
    def key(self) -> str:
        """``<dataset>-<question_id>-<turn>``: the trace file stem and the turn's id everywhere."""
        return f"{self.dataset}-{self.question_id}-{self.turn}"


def dataset_path(data_dir: str, dataset: str) -> str:
    return os.path.join(data_dir, dataset, QUESTION_FILE)


def _check_line(obj, where: str, dataset: str) -> Question:
    if not isinstance(obj, dict):
        raise DatasetError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    qid = obj.get("question_id")
    if isinstance(qid, bool) or not isinstance(qid, int):
        raise DatasetError(f"{where}: 'question_id' must be an integer, got {qid!r}")
    if qid < 0:
        raise DatasetError(f"{where}: 'question_id' must be >= 0 (it shards runs), got {qid}")
    category = obj.get("category", "")
    if not isinstance(category, str):
        raise DatasetError(f"{where}: 'category' must be a string, got {category!r}")
    turns = obj.get("turns")
    if not isinstance(turns, list) or not turns or not all(isinstance(t, str) for t in turns):
        raise DatasetError(f"{where}: 'turns' must be a non-empty list of strings, got {turns!r:.80}")
    ref = obj.get("reference")
    if ref is not None and (not isinstance(ref, list) or not all(isinstance(r, str) for r in ref)):
        raise DatasetError(f"{where}: 'reference' must be a list of strings, got {ref!r:.80}")
    return Question(dataset, qid, category, tuple(turns), tuple(ref) if ref is not None else None)


def read_question_file(path: str, dataset: str) -> list[Question]:
    """All questions of one file, in file order; DatasetError on the first malformed line."""
    if not os.path.isfile(path):
        raise DatasetError(f"question file not found: {path} (expected <data-dir>/{dataset}/{QUESTION_FILE})")
    out: list[Question] = []
    seen: dict[int, int] = {}
    with open(path, "rb") as fh:
        raw_lines = fh.read().split(b"\n")
    for lineno, raw in enumerate(raw_lines, 1):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise DatasetError(f"{path}:{lineno}: not UTF-8 text ({exc.reason} at byte {exc.start} of the line); "
                               "is this a question.jsonl file?") from None
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DatasetError(f"{where}: invalid JSON ({exc.msg} at column {exc.colno})") from None
        q = _check_line(obj, where, dataset)
        if q.question_id in seen:
            raise DatasetError(f"{where}: duplicate question_id {q.question_id} "
                               f"(first on line {seen[q.question_id]})")
        seen[q.question_id] = lineno
        out.append(q)
    if not out:
        raise DatasetError(f"{path}: no questions")
    return out


def parse_datasets(spec: str | list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """``"mt_bench,humaneval"`` -> ("mt_bench", "humaneval"); names are sub-directories of --data-dir."""
    names = [s.strip() for s in spec.split(",")] if isinstance(spec, str) else list(spec)
    names = [n for n in names if n]
    if not names:
        raise DatasetError(f"--datasets {spec!r}: no dataset names")
    for n in names:
        if os.sep in n or n in (".", ".."):
            raise DatasetError(f"--datasets: {n!r} is not a dataset directory name")
    if len(set(names)) != len(names):
        raise DatasetError(f"--datasets {spec!r}: a dataset is listed twice")
    return tuple(names)


def load_questions(data_dir: str, datasets=DEFAULT_DATASETS, limit: int | None = None) -> list[Question]:
    """Questions of each dataset in order; ``limit`` keeps the first ``limit`` questions of EACH dataset."""
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise DatasetError(f"--limit {limit!r}: must be a positive integer")
    if not os.path.isdir(data_dir):
        raise DatasetError(f"--data-dir {data_dir}: not a directory")
    out: list[Question] = []
    for name in parse_datasets(datasets):
        questions = read_question_file(dataset_path(data_dir, name), name)
        out.extend(questions[:limit] if limit else questions)
    return out


def expand_turns(questions: list[Question]) -> list[TurnSpec]:
    """One TurnSpec per user message, in question order then turn order; ``index`` counts from 0."""
    specs: list[TurnSpec] = []
    for q in questions:
        for t in range(1, len(q.turns) + 1):
            specs.append(TurnSpec(q.dataset, q.question_id, t, q.category, len(specs)))
    keys = [s.key for s in specs]
    if len(set(keys)) != len(keys):
        dup = next(k for k in keys if keys.count(k) > 1)
        raise DatasetError(f"turn key {dup} occurs twice")
    return specs


def shard_turns(turns: list[TurnSpec], rank: int, world_size: int) -> list[TurnSpec]:
    """The turns of one rank: ``question_id % world_size == rank``, so all turns of a question (turn 2
    needs turn 1's baseline answer) stay on one rank. ``index`` keeps its unsharded value."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} outside [0, world_size={world_size})")
    return [t for t in turns if t.question_id % world_size == rank]
