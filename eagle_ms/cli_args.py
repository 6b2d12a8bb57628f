"""Command-line options shared by every ``eagle-ms`` command: the config file, ``--set`` overrides, and
the decoding flags, each declared once and derived from the config field it sets.

A decoding flag ``--max-depth`` is the config key ``speculative.max_depth``: its name, destination and
type come from the field of eagle_ms/config.py (choices from the config's own lists). Where two
sections share a field name the flag is named explicitly: ``--sample-top-k`` is ``generation.top_k``
(``--top-k`` is the tree's k), ``--seed`` is the sampling seed ``generation.seed`` (as in
``eagle-ms regenerate``) and ``--runtime-seed`` is ``runtime.seed`` (random weights, test drafter).
A flag that is not given leaves the config value alone (argparse ``SUPPRESS``), so
``--draft-window none`` can set the key back to null. ``--set section.key=value`` reaches every other key.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
from dataclasses import dataclass
from typing import Any, Callable

from eagle_ms.config import (DECODE_MODES, DRAFTS, FALLBACK_AUTO, STEPS, GenerationConfig, RuntimeConfig,
                             SpeculativeConfig)
from eagle_ms.config_yaml import parse_overrides

REPO_CONFIGS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs")
DEFAULT_CONFIG = os.path.join(REPO_CONFIGS, "demo.yaml")  # the shipped demo pair, in a source checkout


def _null_or_int(text: str) -> int | None:
    if text.lower() in ("none", "null", "full"):
        return None
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer or 'none', got {text!r}") from None


def _auto_or_float(text: str) -> float | str:
    if text.lower() == FALLBACK_AUTO:
        return FALLBACK_AUTO
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number or 'auto', got {text!r}") from None


@dataclass(frozen=True)
class Flag:
    """One decoding flag: the config key it sets and its help text."""

    key: str  # "section.field"
    help: str
    nullable: bool = False  # the flag can set the key to null ('none')
    name: str | None = None  # the option when it is not --<field> (a field name two sections share)
    parse: Callable[[str], Any] | None = None  # the argparse type when the field's default does not give it

    @property
    def field(self) -> str:
        return self.key.split(".", 1)[1]

    @property
    def option(self) -> str:
        return self.name or "--" + self.field.replace("_", "-")

    @property
    def dest(self) -> str:
        return self.option[2:].replace("-", "_")


_SECTIONS = {"generation": GenerationConfig, "runtime": RuntimeConfig, "speculative": SpeculativeConfig}
SAMPLING_FLAGS = (
    Flag("generation.temperature", "0 = greedy; > 0 = position-keyed sampling"),
    Flag("generation.top_k", "sampling: keep the k most likely tokens (0 = off)", name="--sample-top-k"),
    Flag("generation.top_p", "sampling: keep the most likely tokens up to this mass (1 = off)"),
    Flag("generation.seed", "sampling seed"),
)
DECODE_FLAGS = (
    Flag("generation.max_new_tokens", "new tokens per answer"),
    *SAMPLING_FLAGS,
    Flag("runtime.seed", "seed of random weights (when no checkpoint) and of the test drafter", name="--runtime-seed"),
    Flag("speculative.draft", "draft model; none = teacher-only"),
    Flag("speculative.draft_path", "EAGLE-3 draft directory"),
    Flag("speculative.budget", "M: draft nodes per verify"),
    Flag("speculative.max_depth", "Dmax: tree depth bound"),
    Flag("speculative.top_k", "k: children per expanded draft node"),
    Flag("speculative.min_path_prob", "eagle3 depth cut"),
    Flag("speculative.score_temperature", "eagle3: the tree ranks log-softmax(draft logits / T); < 1 favours "
         "deep chains"),
    Flag("speculative.shallow_depth", "after a step that accepted fewer than D drafts, draft a tree of depth <= D "
         "(every candidate, up to the budget); 'none' = always the full tree", nullable=True),
    Flag("speculative.fallback_accept", "teacher-only steps while the mean accept_L is below this; 'auto' = "
         "the break-even measured from step times", parse=_auto_or_float),
    Flag("speculative.mode", "reference (all checks) or performance"),
    Flag("speculative.step", "device (draft + verify graphs, tokens to the host), fused (the same in one graph "
         "call per step) or host (host-driven step)"),
    Flag("speculative.draft_window", "keep the last W tokens of draft context, or 'none'", nullable=True),
)
_CHOICES = {"speculative.draft": DRAFTS, "speculative.mode": DECODE_MODES, "speculative.step": STEPS}


def _argparse_type(flag: Flag):
    if flag.parse is not None:
        return flag.parse
    if flag.nullable:
        return _null_or_int
    default = {f.name: f.default for f in dataclasses.fields(_SECTIONS[flag.key.split(".")[0]])}[flag.field]
    return type(default) if isinstance(default, (int, float)) and not isinstance(default, bool) else str


def default_config() -> str:
    """``configs/demo.yaml`` of the source checkout this package runs from; a clear error when eagle_ms
    is installed without one (pass ``--config`` then)."""
    if not os.path.isfile(DEFAULT_CONFIG):
        raise FileNotFoundError(f"no --config given and the default {DEFAULT_CONFIG} does not exist (eagle_ms "
                                "installed without its source checkout): pass --config PATH")
    return DEFAULT_CONFIG


def add_config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", default=None,
                   help=f"MindFormers-style YAML (default: the demo pair, {os.path.relpath(DEFAULT_CONFIG)})")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key, e.g. --set runtime.seq_length=1024 (repeatable)")


def add_decode_flags(p: argparse.ArgumentParser, drafts: tuple[str, ...] = DRAFTS,
                     flags: tuple[Flag, ...] = DECODE_FLAGS) -> None:
    """Every flag of ``flags`` (default ``DECODE_FLAGS``; demo and regenerate take ``SAMPLING_FLAGS``);
    ``drafts`` narrows the ``--draft`` choices (bench needs a draft)."""
    for flag in flags:
        choices = drafts if flag.key == "speculative.draft" else _CHOICES.get(flag.key)
        p.add_argument(flag.option, dest=flag.dest, type=_argparse_type(flag), choices=choices,
                       default=argparse.SUPPRESS, help=f"{flag.help} ({flag.key})")


def config_path(args) -> str:
    return args.config or default_config()


def overrides(args) -> dict:
    """Dotted overrides from ``--set`` and from the decoding flags that were given."""
    out = parse_overrides(args.set)
    for flag in DECODE_FLAGS:
        if hasattr(args, flag.dest):
            value = getattr(args, flag.dest)
            if value is not None or flag.nullable:
                out[flag.key] = value
    return out
