"""SentencePiece tokenizer wrapper and chat templates (openPangu's and a configurable generic one).

Contracts
---------
- :class:`Tokenizer` wraps one SentencePiece ``.model`` file. ``encode`` is plain SentencePiece
  encoding (no BOS/EOS unless asked); pieces declared as ``user_defined_symbols`` in the model are
  matched atomically by SentencePiece itself, so e.g. ``"[unused9]"`` encodes to one id.
- :class:`ChatTemplate` turns ``[{"role": ..., "content": ...}, ...]`` into text (:meth:`render`)
  and into ids plus a loss mask (:meth:`encode_chat`). Template text (turn prefixes, suffixes,
  generation prompt) is split on the template's ``special_pieces``, each of which becomes exactly
  one id; message *content* goes through plain ``encode`` only. Caveat: SentencePiece itself
  matches user-defined symbols anywhere, so with the demo tokenizer a literal ``[unused10]`` inside
  content still becomes the eos id (control pieces, by contrast, are never produced from content
  text). ``encode_chat`` is the canonical tokenisation of a chat -- use it at inference too. Its
  ids are the concatenation of the per-segment encodings; for the ``openpangu`` template on a
  model whose template pieces are user-defined symbols (the demo tokenizer) they equal
  ``[bos] + encode(render(...))`` (tested). For templates whose text around the content is not a
  special piece (e.g. ``"User: "``) the segment-wise ids can differ from encoding the whole
  rendered string (``"▁" + "Hi"`` instead of ``"▁Hi"``).

openPangu template (the openPangu-Embedded chat template): each turn is ``[unused9]`` + role + ``：`` (U+FF1A) + content +
``[unused10]``; roles system/user/assistant/tool/function -> 系统/用户/助手/工具/方法; an empty system
turn is inserted when the first message is not a system message; generation prompt
``[unused9]助手：``; BOS prepended to ids (``render`` returns text without BOS); eos ``[unused10]``.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Dict, List, Mapping, NamedTuple, Optional, Sequence, Tuple, Union

import sentencepiece as spm

PathLike = Union[str, Path]


class UnknownPieceError(KeyError):
    """A piece that is not in the tokenizer vocabulary (message shown without KeyError quoting)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class Tokenizer:
    """A SentencePiece model. ``pad_id`` falls back to ``unk_id`` when the model defines no pad
    piece (openPangu convention: ``<unk>`` = 0 doubles as pad)."""

    def __init__(self, model_path: PathLike) -> None:
        self.path = Path(model_path)
        if not self.path.is_file():
            raise FileNotFoundError(f"SentencePiece model file not found: {self.path}")
        self._sp = spm.SentencePieceProcessor()
        try:
            self._sp.Load(str(self.path))
        except (OSError, RuntimeError) as err:
            raise ValueError(f"not a valid SentencePiece model file: {self.path} ({err})") from err

    def __repr__(self) -> str:
        return f"Tokenizer({str(self.path)!r}, vocab_size={self.vocab_size})"

    @property
    def vocab_size(self) -> int:
        return self._sp.GetPieceSize()

    @property
    def unk_id(self) -> int:
        return self._sp.unk_id()

    @property
    def bos_id(self) -> int:
        """BOS id, or -1 if the model has none."""
        return self._sp.bos_id()

    @property
    def eos_id(self) -> int:
        """The model's ``</s>`` id (-1 if none). Chat stop tokens come from the template."""
        return self._sp.eos_id()

    @property
    def pad_id(self) -> int:
        pad = self._sp.pad_id()
        return pad if pad >= 0 else self.unk_id

    def encode(self, text: str, add_bos: bool = False, add_eos: bool = False) -> List[int]:
        """Token ids of ``text``; BOS/EOS only when asked (ValueError if the model has none)."""
        if not isinstance(text, str):
            raise TypeError(f"encode expects str, got {type(text).__name__}")
        ids = list(self._sp.EncodeAsIds(text)) if text else []
        if add_bos:
            ids.insert(0, self._required_id(self.bos_id, "BOS"))
        if add_eos:
            ids.append(self._required_id(self.eos_id, "EOS"))
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids``; control ids (BOS/EOS) decode to ''. ValueError names an out-of-range id."""
        ids = [int(i) for i in ids]
        for pos, i in enumerate(ids):
            if not 0 <= i < self.vocab_size:
                raise ValueError(f"token id {i} at position {pos} is outside [0, {self.vocab_size})")
        return self._sp.DecodeIds(ids)

    def token_to_id(self, piece: str) -> int:
        """Id of one vocabulary piece; :class:`UnknownPieceError` (a KeyError) names an unknown one."""
        pid = self._sp.PieceToId(piece)
        if pid == self.unk_id and piece != self._sp.IdToPiece(self.unk_id):
            raise UnknownPieceError(f"piece {piece!r} is not in the vocabulary of {self.path}")
        return pid

    def id_to_token(self, token_id: int) -> str:
        """Piece string of ``token_id`` (ValueError if out of range)."""
        if not 0 <= token_id < self.vocab_size:
            raise ValueError(f"token id {token_id} is outside [0, {self.vocab_size})")
        return self._sp.IdToPiece(token_id)

    def _required_id(self, token_id: int, what: str) -> int:
        if token_id < 0:
            raise ValueError(f"{self.path} defines no {what} token")
        return token_id


ROLES: Tuple[str, ...] = ("system", "user", "assistant", "tool", "function")

_TEMPLATE_KEYS = ("name", "role_prefix", "role_suffix", "generation_prompt", "eos_piece",
                  "special_pieces", "default_system", "add_bos")


class ChatEncoding(NamedTuple):
    """``ids``: token ids. ``assistant_mask[i]``: token i is assistant content or the assistant
    end-of-turn (eos) token -- the positions a training loss is computed on."""

    ids: List[int]
    assistant_mask: List[bool]


class _Segment(NamedTuple):
    text: str
    kind: str   # "template" | "content" | "suffix"
    role: str


@dataclass(frozen=True)
class ChatTemplate:
    """A chat format described by per-role strings (the YAML form is :meth:`to_dict`).

    Keys / fields:
      name: label of the template.
      role_prefix: role -> text before the content of a turn of that role.
      role_suffix: role -> text after the content (same role set as ``role_prefix``; must contain
        "assistant"). For assistant turns the suffix tokens up to and including the first
        ``eos_piece`` are part of the loss mask (the whole suffix if it holds no eos piece).
      generation_prompt: text appended when ``add_generation_prompt`` is true.
      eos_piece: the piece that ends an assistant turn (stop token at inference).
      special_pieces: pieces matched atomically (one id each) inside template text; ``eos_piece``
        is always added.
      default_system: content of a system turn inserted when the first message is not a system
        message; ``None`` (YAML ``null``) = insert nothing.
      add_bos: ``encode_chat`` prepends the tokenizer's BOS id.
    """

    name: str
    role_prefix: Mapping[str, str]
    role_suffix: Mapping[str, str]
    generation_prompt: str
    eos_piece: str
    special_pieces: Tuple[str, ...] = ()
    default_system: Optional[str] = None
    add_bos: bool = True
    _split_re: Any = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for key in ("name", "generation_prompt", "eos_piece"):
            if not isinstance(getattr(self, key), str):
                raise ValueError(f"chat template field {key!r} must be a string, "
                                 f"got {getattr(self, key)!r}")
        if not self.eos_piece:
            raise ValueError("chat template field 'eos_piece' must not be empty")
        prefix = _string_map(self.role_prefix, "role_prefix")
        suffix = _string_map(self.role_suffix, "role_suffix")
        if set(prefix) != set(suffix):
            raise ValueError(f"role_prefix roles {sorted(prefix)} differ from role_suffix roles "
                             f"{sorted(suffix)} in chat template {self.name!r}")
        if "assistant" not in prefix:
            raise ValueError(f"chat template {self.name!r} defines no 'assistant' role")
        if self.default_system is not None:
            if not isinstance(self.default_system, str):
                raise ValueError(f"default_system must be a string or None, got {self.default_system!r}")
            if "system" not in prefix:
                raise ValueError(f"chat template {self.name!r} has default_system but no 'system' role")
        specials = [self.special_pieces] if isinstance(self.special_pieces, str) else self.special_pieces
        specials = tuple(dict.fromkeys([*specials, self.eos_piece]))
        if not all(isinstance(p, str) and p for p in specials):
            raise ValueError(f"special_pieces must be non-empty strings, got {specials!r}")
        object.__setattr__(self, "role_prefix", prefix)     # plain dicts: picklable; read-only
        object.__setattr__(self, "role_suffix", suffix)
        object.__setattr__(self, "special_pieces", specials)
        object.__setattr__(self, "add_bos", bool(self.add_bos))
        longest_first = sorted(specials, key=len, reverse=True)
        object.__setattr__(self, "_split_re",
                           re.compile("(" + "|".join(map(re.escape, longest_first)) + ")"))

    @property
    def roles(self) -> Tuple[str, ...]:
        return tuple(self.role_prefix)

    # ----- rendering -------------------------------------------------------------------------
    def render(self, messages: Sequence[Mapping[str, str]], add_generation_prompt: bool) -> str:
        """The chat as text (without BOS).

        Example (openpangu): ``[{"role": "user", "content": "hi"}]`` with generation prompt ->
        ``[unused9]系统：[unused10][unused9]用户：hi[unused10][unused9]助手：``.
        ValueError names the index of a message with an unknown role or a non-string content.
        """
        return "".join(seg.text for seg in self._segments(messages, add_generation_prompt))

    def encode_chat(self, tokenizer: Tokenizer, messages: Sequence[Mapping[str, str]],
                    add_generation_prompt: bool) -> ChatEncoding:
        """Ids of the rendered chat (BOS first if ``add_bos``) and the assistant loss mask.

        KeyError (UnknownPieceError) if a special piece is not in the tokenizer's vocabulary.
        """
        ids: List[int] = []
        mask: List[bool] = []
        if self.add_bos:
            ids.append(tokenizer._required_id(tokenizer.bos_id, "BOS"))
            mask.append(False)
        eos = tokenizer.token_to_id(self.eos_piece)
        for seg in self._segments(messages, add_generation_prompt):
            if seg.kind == "content":
                part = tokenizer.encode(seg.text)
                part_mask = [seg.role == "assistant"] * len(part)
            else:
                part = self._encode_template_text(tokenizer, seg.text)
                part_mask = [False] * len(part)
                if seg.kind == "suffix" and seg.role == "assistant":
                    stop = part.index(eos) + 1 if eos in part else len(part)
                    part_mask[:stop] = [True] * stop
            ids.extend(part)
            mask.extend(part_mask)
        return ChatEncoding(ids=ids, assistant_mask=mask)

    def eos_id(self, tokenizer: Tokenizer) -> int:
        """Id of ``eos_piece`` in ``tokenizer`` (the chat stop token)."""
        return tokenizer.token_to_id(self.eos_piece)

    def _encode_template_text(self, tokenizer: Tokenizer, text: str) -> List[int]:
        ids: List[int] = []
        for i, part in enumerate(self._split_re.split(text)):
            if i % 2:                      # odd parts are the captured special pieces
                ids.append(tokenizer.token_to_id(part))
            elif part:
                ids.extend(tokenizer.encode(part))
        return ids

    def _segments(self, messages: Sequence[Mapping[str, str]],
                  add_generation_prompt: bool) -> List[_Segment]:
        checked = self._validate(messages)
        if self.default_system is not None and (not checked or checked[0][0] != "system"):
            checked.insert(0, ("system", self.default_system))
        segments: List[_Segment] = []
        for role, content in checked:
            segments.append(_Segment(self.role_prefix[role], "template", role))
            segments.append(_Segment(content, "content", role))
            segments.append(_Segment(self.role_suffix[role], "suffix", role))
        if add_generation_prompt:
            segments.append(_Segment(self.generation_prompt, "template", "assistant"))
        return segments

    def _validate(self, messages: Sequence[Mapping[str, str]]) -> List[Tuple[str, str]]:
        if isinstance(messages, (str, bytes, Mapping)) or not isinstance(messages, Sequence):
            raise ValueError(f"messages must be a list of {{'role', 'content'}} dicts, "
                             f"got {type(messages).__name__}")
        out = []
        for i, msg in enumerate(messages):
            if not isinstance(msg, Mapping) or "role" not in msg or "content" not in msg:
                raise ValueError(f"message {i} must be a mapping with 'role' and 'content', got {msg!r}")
            role, content = msg["role"], msg["content"]
            if role not in self.role_prefix:
                raise ValueError(f"message {i} has unknown role {role!r}; chat template "
                                 f"{self.name!r} knows {list(self.roles)}")
            if not isinstance(content, str):
                raise ValueError(f"message {i} (role {role!r}) content must be a string, "
                                 f"got {type(content).__name__}")
            out.append((role, content))
        return out

    # ----- YAML form -------------------------------------------------------------------------
    def to_dict(self) -> Dict[str, Any]:
        """Plain-data form (keys as in the class docstring); ``from_dict(to_dict())`` round-trips."""
        return {"name": self.name, "role_prefix": dict(self.role_prefix),
                "role_suffix": dict(self.role_suffix), "generation_prompt": self.generation_prompt,
                "eos_piece": self.eos_piece, "special_pieces": list(self.special_pieces),
                "default_system": self.default_system, "add_bos": self.add_bos}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "ChatTemplate":
        """Build from a mapping with the keys of :meth:`to_dict`, plus optional ``base``: name of a
        built-in template whose values fill missing keys (``role_prefix``/``role_suffix`` entries
        are merged per role). Unknown keys raise ValueError naming them."""
        if not isinstance(d, Mapping):
            raise ValueError(f"chat template config must be a mapping, got {type(d).__name__}")
        unknown = sorted(set(d) - set(_TEMPLATE_KEYS) - {"base"})
        if unknown:
            raise ValueError(f"unknown chat template keys {unknown}; known: {['base', *_TEMPLATE_KEYS]}")
        values: Dict[str, Any] = get_template(d["base"]).to_dict() if "base" in d else {}
        for key in _TEMPLATE_KEYS:
            if key not in d:
                continue
            if key in ("role_prefix", "role_suffix") and key in values:
                values[key] = {**values[key], **_string_map(d[key], key)}
            else:
                values[key] = d[key]
        missing = [k for k in ("name", "role_prefix", "role_suffix", "generation_prompt", "eos_piece")
                   if k not in values]
        if missing:
            raise ValueError(f"chat template config lacks keys {missing} (or give 'base')")
        values["special_pieces"] = tuple(values.get("special_pieces", ()))
        return cls(**values)


def _string_map(value: Any, what: str) -> Dict[str, str]:
    if not isinstance(value, Mapping):
        raise ValueError(f"{what} must be a mapping role -> string, got {type(value).__name__}")
    for role, text in value.items():
        if not isinstance(role, str) or not isinstance(text, str):
            raise ValueError(f"{what} entry {role!r}: {text!r} must map a string to a string")
    return dict(value)


_PANGU_ROLE_NAMES = {"system": "系统", "user": "用户", "assistant": "助手", "tool": "工具",
                     "function": "方法"}

OPENPANGU = ChatTemplate(
    name="openpangu",
    role_prefix={role: f"[unused9]{name}：" for role, name in _PANGU_ROLE_NAMES.items()},
    role_suffix={role: "[unused10]" for role in _PANGU_ROLE_NAMES},
    generation_prompt="[unused9]助手：",
    eos_piece="[unused10]",
    special_pieces=("[unused9]", "[unused10]"),
    default_system="",
    add_bos=True,
)

GENERIC = ChatTemplate(
    name="generic",
    role_prefix={role: f"{role.capitalize()}: " for role in ROLES},
    role_suffix={role: ("</s>\n" if role == "assistant" else "\n") for role in ROLES},
    generation_prompt="Assistant: ",
    eos_piece="</s>",
    special_pieces=("</s>",),
    default_system=None,
    add_bos=True,
)

BUILTIN_TEMPLATES: Mapping[str, ChatTemplate] = MappingProxyType(
    {OPENPANGU.name: OPENPANGU, GENERIC.name: GENERIC})


def get_template(name: str) -> ChatTemplate:
    """A built-in template by name (``openpangu``, ``generic``); ValueError lists the known ones."""
    try:
        return BUILTIN_TEMPLATES[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown chat template {name!r}; built-ins: {sorted(BUILTIN_TEMPLATES)}") from None
