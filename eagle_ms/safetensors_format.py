"""The safetensors file format, read and written without torch, the bfloat16 codec, and the value check.

A file is an 8-byte little-endian header length n, a JSON header of n bytes
``{key: {"dtype": tag, "shape": [...], "data_offsets": [begin, end]}, "__metadata__": {...}}``, then the raw
little-endian tensor data; offsets are relative to the start of the data section. ``SafetensorsFile``
validates every header entry (known dtype tag, byte count = prod(shape) * itemsize, data inside the file)
and, as the format requires and the reference reader checks, that the byte ranges do not overlap and
cover the data section exactly (no gap, no trailing bytes); it reads one tensor at a time (``read``: a
copy) or maps the file once and hands out read-only views of it (``view``: no copy, for the teacher
loader, which checks and then loads every tensor from the same mapped bytes). BF16 has no
NumPy dtype: it is read as uint16 bit patterns and widened by ``uint16 -> uint32 << 16`` (exact), and
written by round-to-nearest-even (``float32_to_bf16_bits``). ``write_safetensors`` writes atomically
(eagle_ms/files.py), data 8-byte aligned as the reference writer does. ``check_float_tensor`` is the
weight loaders' value check (finite; F16/BF16 tag plausible for the bytes).
"""
from __future__ import annotations

import json
import math
import mmap
import os
import struct
from typing import Mapping

import numpy as np

from eagle_ms.files import atomic_write

MAX_HEADER_BYTES = 100 * 1024 * 1024  # the safetensors format's own limit

# safetensors dtype tag -> little-endian NumPy dtype (BF16 is read as raw uint16 bits, then widened)
ST_DTYPES = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "BF16": "<u2", "I64": "<i8", "I32": "<i4",
             "I16": "<i2", "I8": "i1", "U8": "u1", "BOOL": "?"}
FLOAT_TAGS = ("F64", "F32", "F16", "BF16")
SAVE_DTYPES = {"float32": "F32", "float16": "F16", "bfloat16": "BF16"}
OTHER_2BYTE = {"F16": "BF16", "BF16": "F16"}  # the two tags whose bytes are easily mixed up

# check_float_tensor's relabel test: statistics of the nonzero values of one (sampled) tensor
WEIGHT_MEDIAN = (1e-7, 1e6)  # median |w| of any real network weight lies in here
MIN_ELEMENTS = 64  # fewer nonzero values: no evidence either way
MIN_NEAR_ZERO_ELEMENTS = 1024  # the near-zero test below needs this many
NEAR_ZERO_SHARE = 0.01  # zero-centred weights: share of |w| < median/8 is ~6.7 % (Gaussian), 6.2 % (uniform)
SAMPLE = 65536  # statistics on an evenly strided sample of at most this many values


class CheckpointError(ValueError):
    """A checkpoint does not fit the model, or a file is missing, truncated or corrupt."""



# ----------------------------------------------------------------------------------------------
# safetensors format (read without torch; write ourselves so BF16 works too)
# ----------------------------------------------------------------------------------------------

class SafetensorsFile:
    """Header of one safetensors file; ``read(key)`` returns one tensor (BF16 -> float32), ``view(key)``
    the same values without copying them out of the file's one memory map."""

    def __init__(self, path: str):
        self.path = path
        self._map: mmap.mmap | None = None  # the whole file, mapped on the first view()
        if not os.path.isfile(path):
            raise CheckpointError(f"safetensors file not found: {path}")
        size = os.path.getsize(path)
        with open(path, "rb") as fh:
            head = fh.read(8)
            if len(head) < 8:
                raise CheckpointError(f"{path}: truncated safetensors file ({size} bytes, no header length)")
            (n,) = struct.unpack("<Q", head)
            if n > MAX_HEADER_BYTES or 8 + n > size:
                raise CheckpointError(f"{path}: corrupt or truncated safetensors file (header length {n}, "
                                      f"file size {size})")
            raw = fh.read(n)
        try:
            header = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise CheckpointError(f"{path}: corrupt safetensors header: {exc}") from None
        if not isinstance(header, dict):
            raise CheckpointError(f"{path}: corrupt safetensors header (not a JSON object)")
        self.metadata = header.pop("__metadata__", None) or {}
        self.data_start, self.size = 8 + n, size
        self.tensors = {k: self._check_entry(k, v, size - self.data_start) for k, v in header.items()}
        self._check_layout(size - self.data_start)

    def _check_entry(self, key: str, info, data_size: int) -> tuple[str, tuple[int, ...], int, int]:
        try:
            tag, shape, (begin, end) = info["dtype"], tuple(int(s) for s in info["shape"]), info["data_offsets"]
        except (TypeError, KeyError, ValueError) as exc:
            raise CheckpointError(f"{self.path}: corrupt header entry for '{key}': {info!r} ({exc})") from None
        if tag not in ST_DTYPES:
            raise CheckpointError(f"{self.path}: tensor '{key}' has unsupported dtype {tag!r} "
                                  f"(supported: {sorted(ST_DTYPES)})")
        nbytes = math.prod(shape) * np.dtype(ST_DTYPES[tag]).itemsize
        if not (isinstance(begin, int) and isinstance(end, int) and 0 <= begin <= end) or end - begin != nbytes:
            raise CheckpointError(f"{self.path}: tensor '{key}' ({tag}, shape {shape}) has bad data_offsets "
                                  f"[{begin}, {end}] (expected {nbytes} bytes)")
        if end > data_size:
            raise CheckpointError(f"{self.path}: truncated: tensor '{key}' needs data bytes up to {end}, "
                                  f"the file holds {data_size}")
        return tag, shape, begin, end

    def _check_layout(self, data_size: int) -> None:
        """Byte ranges sorted by offset must be back to back from 0 to the end of the file."""
        start, end, last = 0, 0, None
        for begin, stop, key in sorted((b, e, k) for k, (_, _, b, e) in self.tensors.items()):
            if begin < end:
                raise CheckpointError(f"{self.path}: tensors '{last}' [{start}, {end}) and '{key}' "
                                      f"[{begin}, {stop}) overlap in the data section")
            if begin > end:
                where = f"between '{last}' and '{key}'" if last else f"before '{key}'"
                raise CheckpointError(f"{self.path}: gap in the data section: bytes [{end}, {begin}) {where} "
                                      f"belong to no tensor")
            start, end, last = begin, stop, key
        if end != data_size:
            where = f"after the last tensor '{last}' (its data ends at {end})" if last else "but no tensor"
            raise CheckpointError(f"{self.path}: {data_size - end} byte(s) in the data section {where}; the "
                                  f"data section holds {data_size}")

    def keys(self) -> list[str]:
        return list(self.tensors)

    def read(self, key: str) -> np.ndarray:
        if key not in self.tensors:
            raise CheckpointError(f"{self.path}: no tensor '{key}'")
        tag, shape, begin, end = self.tensors[key]
        with open(self.path, "rb") as fh:
            fh.seek(self.data_start + begin)
            buf = fh.read(end - begin)
        if len(buf) != end - begin:  # the file shrank since the header was read
            raise CheckpointError(f"{self.path}: truncated while reading '{key}'")
        arr = np.frombuffer(buf, dtype=ST_DTYPES[tag]).reshape(shape)
        if tag == "BF16":
            return _widen_bf16(arr)
        return arr.astype(arr.dtype.newbyteorder("="), copy=True)

    def view(self, key: str) -> np.ndarray:
        """Tensor ``key`` as a read-only array over the file's memory map: no copy (BF16 is widened to a
        float32 copy). The file is mapped once, at the first view, while this object or a view lives; a
        file replaced meanwhile (an atomic rename, eagle_ms/files.py) keeps serving the mapped bytes.
        Truncating the mapped file in place is undefined (SIGBUS), as for any memory-mapped reader."""
        if key not in self.tensors:
            raise CheckpointError(f"{self.path}: no tensor '{key}'")
        if self._map is None:
            with open(self.path, "rb") as fh:
                if os.fstat(fh.fileno()).st_size != self.size:
                    raise CheckpointError(f"{self.path}: changed size since its header was read")
                self._map = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        tag, shape, begin, end = self.tensors[key]
        dtype = np.dtype(ST_DTYPES[tag])
        arr = np.frombuffer(self._map, dtype, (end - begin) // dtype.itemsize, self.data_start + begin)
        return _widen_bf16(arr.reshape(shape)) if tag == "BF16" else arr.reshape(shape)


def _widen_bf16(bits: np.ndarray) -> np.ndarray:
    """BF16 bit patterns (uint16) -> float32 values, exactly (a new array)."""
    return (bits.astype(np.uint32) << 16).view(np.float32)


def _decode_2byte(bits: np.ndarray, tag: str) -> np.ndarray:
    """uint16 bit patterns -> float32 values, read as F16 or BF16."""
    if tag == "F16":
        return bits.view(np.float16).astype(np.float32)
    return _widen_bf16(bits)


def _not_weights(x: np.ndarray) -> str | None:
    """Why float32 values ``x`` cannot be a network weight's, or None when they can (see check_float_tensor)."""
    x = x[x != 0]
    if x.size < MIN_ELEMENTS:
        return None
    if not np.isfinite(x).all():
        return "it holds NaN/Inf"
    mags = np.abs(x)
    median = float(np.median(mags))
    if not WEIGHT_MEDIAN[0] <= median <= WEIGHT_MEDIAN[1]:
        return f"its median |x| {median:.3g} is outside [{WEIGHT_MEDIAN[0]:g}, {WEIGHT_MEDIAN[1]:g}]"
    if x.size >= MIN_NEAR_ZERO_ELEMENTS and 0.25 <= np.mean(x < 0) <= 0.75:
        share = float(np.mean(mags < median / 8))
        if share < NEAR_ZERO_SHARE:
            return f"its signs are mixed but only {share:.2%} of |x| lie below median/8 (median {median:.3g})"
    return None


def check_float_tensor(key: str, arr: np.ndarray, tag: str, source: str) -> None:
    """Refuse a float tensor (as ``SafetensorsFile.read`` returns it) whose values are not finite, or whose
    2-byte tag ``tag`` (F16 / BF16) cannot be what its bytes hold; CheckpointError names ``source`` and ``key``.

    The relabel test reads an evenly strided sample (<= SAMPLE values; zeros dropped, they mean 0 in
    both) once as the declared tag and once as the other 2-byte tag, and refuses the tensor when the
    declared reading cannot be a network weight and the other one can. A reading cannot be when
      (a) its median |x| lies outside WEIGHT_MEDIAN, or
      (b) its signs are mixed (25-75 % negative; >= 1024 values) but under 1 % of |x| lie below median/8.
    F16 bytes read as BF16 turn magnitude 2^k into ~2^(8k-7) (0.02 -> ~1e-16): (a) catches zero-centred or
    positive F16 tensors of median |w| below ~0.25 or above ~10. BF16 bytes read as F16 turn 2^k into
    ~2^((k+127)/8 - 15), which squeezes 0.02 and 1 alike into [1, 2) with nothing near zero: (b) catches
    zero-centred BF16 tensors of >= 1024 values (an embedding or any projection matrix). Not caught:
    norm-like (positive) tensors relabelled BF16 -> F16, F16 tensors of median |w| in ~[0.25, 10]
    relabelled F16 -> BF16, tensors of fewer than 64 nonzero values, all-zero tensors (identical either
    way) and BF16 -> F16 relabels of tensors under 1024 values; a file of ordinary weights is still refused
    at its first matrix. A true tensor is refused only if its own reading fails (a) or (b) and the other
    reading passes both, e.g. a sign-mixed F16 matrix with no values near zero and median |w| in [0.25, 10].
    """
    if arr.dtype.kind != "f":
        return
    finite = np.isfinite(arr)
    if not finite.all():
        bad = np.flatnonzero(~finite)
        first = tuple(int(i) for i in np.unravel_index(bad[0], arr.shape))
        raise CheckpointError(f"{source}: tensor '{key}' holds {bad.size} NaN/Inf value(s) (first: {arr[first]} "
                              f"at index {list(first)})")
    if tag not in OTHER_2BYTE:
        return
    flat = arr.reshape(-1)
    sample = np.ascontiguousarray(flat[::max(1, flat.size // SAMPLE)])
    bits = sample.view(np.uint16) if tag == "F16" else (sample.view(np.uint32) >> 16).astype(np.uint16)
    other = OTHER_2BYTE[tag]
    problem, as_other = _not_weights(_decode_2byte(bits, tag)), _decode_2byte(bits, other)
    if problem and _not_weights(as_other) is None:
        raise CheckpointError(f"{source}: tensor '{key}' is declared {tag}, but its bytes look like {other}: read "
                              f"as {tag} {problem}; read as {other} they look like network weights (median |x| "
                              f"{float(np.median(np.abs(as_other[as_other != 0]))):.3g}). Was the file's dtype "
                              f"relabelled?")


def read_safetensors(path: str) -> dict[str, np.ndarray]:
    """All tensors of one file (BF16 -> float32)."""
    f = SafetensorsFile(path)
    return {k: f.read(k) for k in f.keys()}


def float32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns (uint16), round to nearest even; NaN stays NaN."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = ((u + (0x7FFF + ((u >> 16) & 1))) >> 16).astype(np.uint16)
    return np.where(np.isnan(x), np.uint16(0x7FC0), rounded)


def _encode(arr: np.ndarray, float_dtype: str | None) -> tuple[str, np.ndarray]:
    """(safetensors tag, little-endian array to write) for ``arr``; floats cast to ``float_dtype``."""
    arr = np.asarray(arr)
    if arr.dtype.kind == "f" and float_dtype is not None:
        tag = SAVE_DTYPES[float_dtype]
        if tag == "BF16":
            return tag, float32_to_bf16_bits(arr.astype(np.float32))
        arr = arr.astype(ST_DTYPES[tag])
    for tag, np_dtype in ST_DTYPES.items():
        if tag != "BF16" and np.dtype(np_dtype).kind == arr.dtype.kind and \
                np.dtype(np_dtype).itemsize == arr.dtype.itemsize:
            return tag, arr.astype(np_dtype)
    raise CheckpointError(f"cannot store dtype {arr.dtype} in safetensors")


def write_safetensors(path: str, tensors: Mapping[str, np.ndarray], metadata: Mapping[str, str] | None = None,
                      float_dtype: str | None = None) -> int:
    """Write ``tensors`` (floats cast to ``float_dtype`` if given) atomically; returns the data bytes."""
    if float_dtype is not None and float_dtype not in SAVE_DTYPES:
        raise ValueError(f"float_dtype {float_dtype!r} must be one of {sorted(SAVE_DTYPES)}")
    header, blobs, offset = {}, [], 0
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    for key, value in tensors.items():
        tag, arr = _encode(value, float_dtype)
        header[key] = {"dtype": tag, "shape": list(arr.shape), "data_offsets": [offset, offset + arr.nbytes]}
        blobs.append(arr)
        offset += arr.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
    raw += b" " * (-len(raw) % 8)  # data starts 8-byte aligned, as the reference writer does

    def write(fh):
        fh.write(struct.pack("<Q", len(raw)) + raw)
        for arr in blobs:
            fh.write(np.ascontiguousarray(arr).tobytes())

    atomic_write(path, write, binary=True)
    return offset


