"""Rebuild one of ferry's model.safetensors on the device from its header and
the tensors of mlx-lm's own conversion, and prove it is ferry's file.

ferry's outputs travel without their tensor data (the device call may take
little along): DIR/model.safetensors.header holds the file's first 8 + N
bytes (length and header JSON, padding included) and
DIR/model.safetensors.sha256 the whole file's sha256. Each tensor's bytes
are taken, by name, from SRC/model.safetensors (mlx-lm's conversion of the
same checkpoint with the same settings) and put at ferry's offsets; the
result is kept only if its sha256 is ferry's, so what mlx-lm then loads is
ferry's file byte for byte (and every tensor was mlx-lm's).

    python3 rebuild.py DIR SRC
Exit status 0 when rebuilt and verified, 1 otherwise (the reason printed).
"""

import hashlib
import json
import pathlib
import struct
import sys


def read(path):
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    header.pop("__metadata__", None)
    return data, 8 + n, header


def main():
    d, src = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
    head = (d / "model.safetensors.header").read_bytes()
    want = (d / "model.safetensors.sha256").read_text().split()[0]
    (n,) = struct.unpack("<Q", head[:8])
    if len(head) != 8 + n:
        sys.exit(f"{d}: header file is {len(head)} bytes, its length field says {8 + n}")
    header = json.loads(head[8:])
    header.pop("__metadata__", None)
    sdata, sbase, sheader = read(src / "model.safetensors")
    size = max(t["data_offsets"][1] for t in header.values())
    body = bytearray(size)
    for name, t in header.items():
        s = sheader.get(name)
        if s is None:
            print(f"{name}: not in mlx-lm's conversion")
            sys.exit(1)
        if s["dtype"] != t["dtype"] or s["shape"] != t["shape"]:
            print(f"{name}: ferry {t['dtype']} {t['shape']}, mlx-lm {s['dtype']} {s['shape']}")
            sys.exit(1)
        b, e = t["data_offsets"]
        sb, se = s["data_offsets"]
        body[b:e] = sdata[sbase + sb : sbase + se]
    extra = sorted(set(sheader) - set(header))
    if extra:
        print(f"mlx-lm's conversion has tensors ferry's has not: {extra}")
        sys.exit(1)
    out = head + bytes(body)
    got = hashlib.sha256(out).hexdigest()
    if got != want:
        print(f"{d}: rebuilt file sha256 {got}, ferry's {want}: some tensor's bytes differ from mlx-lm's")
        sys.exit(1)
    (d / "model.safetensors").write_bytes(out)
    (d / "model.safetensors.header").unlink()
    (d / "model.safetensors.sha256").unlink()
    print(f"{d}: rebuilt, {len(header)} tensors, sha256 {got} (ferry's)")


main()
