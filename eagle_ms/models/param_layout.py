"""Where each HF checkpoint tensor lives in a Cell's parameters (teacher and draft alike).

Checkpoints keep the HF keys and layouts (``<path>.q_proj.weight`` [out, in] ...). In the Cells, matrices
are stored [in, out] and projections over the same input are packed (eagle_ms/models/layers.py:
``FusedLinear``, ``Linear``). ``checkpoint_slots(model)`` lists, for every HF key, the parameter that
holds it and where:

* a ``FusedLinear`` at Cell path P with parts ((name_p, out_p), ...): key ``<parent of P>.<name_p>.weight``
  [out_p, in] = ``P.weight[:, o_p:o_p + out_p]`` transposed, and ``....bias`` [out_p] = ``P.bias[o_p:o_p +
  out_p]``, o_p the sum of the earlier parts' widths; a ``Linear`` is one part whose key is ``P.weight``;
* every other checkpoint parameter (norms, embeddings, ``d2t``) is its own key, as is.

Worked example, teacher layer 0 with H = 256, Hq·D = 256, Hkv·D = 128: ``model.layers.0.self_attn.
k_proj.weight`` [128, 256] is ``model.layers.0.self_attn.qkv_proj.weight[:, 256:384].T``.

``params_from_state`` assembles whole parameter values from HF arrays; ``state_from_params`` cuts them
back (tests/test_param_layout.py: a round trip, and a forward against the HF layout in NumPy).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import numpy as np

import mindspore as ms
from mindspore import nn

from eagle_ms.models.layers import FusedLinear

RUNTIME_STATE = ("k_cache", "v_cache")  # last name component of non-checkpoint Parameters
FLOAT_DTYPES = (ms.float16, ms.float32, ms.bfloat16, ms.float64)


@dataclass(frozen=True)
class Slot:
    """HF tensor ``key`` of ``shape`` = ``param``[..., start:stop] (last axis), transposed if ``transpose``."""

    key: str
    shape: tuple[int, ...]
    param_name: str
    param: ms.Parameter
    start: int | None = None  # None: the whole parameter
    stop: int | None = None
    transpose: bool = False

    def cut(self, value: np.ndarray) -> np.ndarray:
        """This slot's HF tensor from the parameter's whole value."""
        part = value if self.start is None else value[..., self.start:self.stop]
        return np.ascontiguousarray(part.T if self.transpose else part)

    def place(self, whole: np.ndarray, tensor: np.ndarray) -> None:
        """Write the HF ``tensor`` into the parameter's whole value ``whole`` (in place)."""
        part = tensor.T if self.transpose else tensor
        if self.start is None:
            whole[...] = part
        else:
            whole[..., self.start:self.stop] = part


def checkpoint_parameters(model: nn.Cell) -> dict[str, ms.Parameter]:
    """Parameter name -> Parameter, without runtime state (KV caches)."""
    return {name: p for name, p in model.parameters_and_names() if name.rsplit(".", 1)[-1] not in RUNTIME_STATE}


def checkpoint_slots(model: nn.Cell) -> dict[str, Slot]:
    """HF key -> Slot for every checkpoint tensor of ``model``, in parameter order; a packed Cell's keys
    come part by part (weight, then bias), the order of the HF checkpoint (module doc)."""
    params = checkpoint_parameters(model)
    packed: dict[str, list[Slot]] = {}  # first parameter name of a FusedLinear -> all its slots
    covered = set()
    for path, cell in model.cells_and_names():
        if not isinstance(cell, FusedLinear):
            continue
        parent = path.rsplit(".", 1)[0] if "." in path else ""
        slots, offset = [], 0
        for name, out in cell.parts:
            base = path if not name else (f"{parent}.{name}" if parent else name)
            stop = offset + out
            slots.append(Slot(f"{base}.weight", (out, cell.in_features), f"{path}.weight", cell.weight, offset, stop,
                              True))
            if cell.has_bias:
                slots.append(Slot(f"{base}.bias", (out,), f"{path}.bias", cell.bias, offset, stop))
            offset = stop
        packed[f"{path}.weight"] = slots
        covered.update(slot.param_name for slot in slots)
    slots = {}
    for name, param in params.items():
        if name in packed:
            slots.update((slot.key, slot) for slot in packed[name])
        elif name not in covered:
            slots[name] = Slot(name, tuple(param.shape), name, param)
    return slots


def parameter_value(param: ms.Parameter) -> np.ndarray:
    """A parameter's value as a NumPy copy (bf16 comes back as float32)."""
    return (param.astype(ms.float32) if param.dtype == ms.bfloat16 else param).asnumpy().copy()


def state_from_params(slots: dict[str, Slot]) -> dict[str, np.ndarray]:
    """HF key -> array, cut from the parameters' current values."""
    values: dict[str, np.ndarray] = {}
    out = {}
    for key, slot in slots.items():
        if slot.param_name not in values:
            values[slot.param_name] = parameter_value(slot.param)
        out[key] = slot.cut(values[slot.param_name])
    return out


def params_from_state(slots: dict[str, Slot], read) -> Iterator[tuple[ms.Parameter, np.ndarray]]:
    """(Parameter, whole value) per parameter, assembled from ``read(key)`` (the HF array of a slot's
    shape) over that parameter's slots; one parameter at a time, so host memory holds one packed
    parameter beyond what ``read`` maps. Float parameters come as float32, integer buffers (``d2t``) as
    read. Shapes must have been checked by the caller."""
    by_param: dict[str, list[Slot]] = {}
    for slot in slots.values():
        by_param.setdefault(slot.param_name, []).append(slot)
    for group in by_param.values():
        param = group[0].param
        if len(group) == 1 and group[0].start is None and not group[0].transpose:
            value = np.asarray(read(group[0].key))
            yield param, value.astype(np.float32) if param.dtype in FLOAT_DTYPES else value
            continue
        whole = np.empty(tuple(param.shape), np.float32)
        for slot in group:
            slot.place(whole, np.asarray(read(slot.key), np.float32))
        yield param, whole
