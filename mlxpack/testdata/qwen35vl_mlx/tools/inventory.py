"""Inventory of MLX directories: every file's size and sha256, and for each
*.safetensors its header metadata and every tensor's dtype, shape and sha256
(of its bytes), read from the files themselves.

    python3 inventory.py OUT.json DIR...
"""

import hashlib
import json
import pathlib
import struct
import sys


def tensors(data):
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    meta = header.pop("__metadata__", None)
    out = {}
    for name, t in sorted(header.items()):
        b, e = t["data_offsets"]
        out[name] = [t["dtype"], t["shape"], hashlib.sha256(data[8 + n + b : 8 + n + e]).hexdigest()]
    return meta, out


inv = {}
for d in map(pathlib.Path, sys.argv[2:]):
    files = {}
    for f in sorted(d.iterdir()):
        if not f.is_file():
            continue
        data = f.read_bytes()
        e = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        if f.suffix == ".safetensors":
            e["metadata"], e["tensors"] = tensors(data)
        files[f.name] = e
    inv[d.name] = files
pathlib.Path(sys.argv[1]).write_text(json.dumps(inv, indent=1, sort_keys=True) + "\n")
print({k: len(v) for k, v in inv.items()})
