"""Test helper: edit a safetensors file's header byte-exactly (independent of eagle_ms)."""
import json
import struct


def relabel(path, new_tag):
    """Rewrite the header of a safetensors file: every F16/BF16 tag becomes ``new_tag``; data unchanged."""
    data = open(path, "rb").read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    for key, info in header.items():
        if key != "__metadata__" and info["dtype"] in ("F16", "BF16"):
            info["dtype"] = new_tag
    head = json.dumps(header).encode()
    head += b" " * (-len(head) % 8)
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(head)) + head + data[8 + n:])
