"""Load MLX directories with the mlx-lm on PYTHONPATH and compare their logits.

For each NAME=DIR: mlx_lm.load (what a user calls), one forward pass over
TOKENS with a fresh prompt cache, the loaded model's parameter count and a few
norm weights' means (≈1 once shifted, ≈2 when shifted twice), greedy text for
"hi", and sha256 of every file of DIR and of every tensor of its
*.safetensors files (what was loaded, byte for byte). Then every pair of
logits (max |a-b|, bitwise equality, argmax agreement) and, with --hf, each
against the float reference (hf_logits.py). Writes JSON and prints a table.

    python3 lazy.py check_logits.py --out R.json [--hf HF.npy] [--npz L.npz] NAME=DIR...
"""

import argparse
import hashlib
import json
import pathlib
import struct
import sys
import traceback

import mlx.core as mx
import mlx_lm
import numpy as np
from mlx.utils import tree_flatten
from mlx_lm import generate, load
from mlx_lm.models.cache import make_prompt_cache

from tokens import TOKENS

NORMS = [
    "language_model.model.layers.0.input_layernorm.weight",
    "language_model.model.layers.3.self_attn.q_norm.weight",
    "language_model.model.norm.weight",
    "language_model.model.layers.0.linear_attn.norm.weight",  # never shifted
]


def sha256_bytes(b):
    return hashlib.sha256(b).hexdigest()


def safetensors_tensors(path):
    """name -> [dtype, shape, sha256 of its bytes], from the file itself."""
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    header.pop("__metadata__", None)
    base = 8 + n
    out = {}
    for name, t in sorted(header.items()):
        b, e = t["data_offsets"]
        out[name] = [t["dtype"], t["shape"], sha256_bytes(data[base + b : base + e])]
    return out


def describe_dir(d):
    files, tensors = {}, {}
    for f in sorted(d.iterdir()):
        if f.is_file():
            files[f.name] = {"sha256": sha256_bytes(f.read_bytes()), "size": f.stat().st_size}
            if f.suffix == ".safetensors":
                tensors[f.name] = safetensors_tensors(f)
    return files, tensors


def run_one(d):
    model, tokenizer = load(str(d))
    cache = make_prompt_cache(model)
    logits = model(mx.array([TOKENS]), cache=cache)
    mx.eval(logits)
    lg = np.array(logits.astype(mx.float32))[0]
    params = dict(tree_flatten(model.parameters()))
    norms = {k: float(np.array(params[k].astype(mx.float32)).mean()) for k in NORMS if k in params}
    text = generate(model, tokenizer, prompt="hi", max_tokens=8, verbose=False)
    rec = {
        "loaded": True,
        "model_class": type(model).__module__ + "." + type(model).__name__,
        "parameters_loaded": len(params),
        "mtp_parameters_loaded": sum(1 for k in params if "mtp." in k),
        "norm_means": norms,
        "logits_shape": list(lg.shape),
        "logits_sha256": sha256_bytes(np.ascontiguousarray(lg).tobytes()),
        "logits_last_first8": [float(x) for x in lg[-1, :8]],
        "argmax": lg.argmax(-1).tolist(),
        "text": text,
    }
    return rec, lg


def compare(a, b):
    d = np.abs(a.astype(np.float64) - b.astype(np.float64))
    ref = np.sqrt(np.mean(b.astype(np.float64) ** 2))
    return {
        "identical": bool(np.array_equal(a, b)),
        "max_abs_diff": float(d.max()),
        "rms_diff_over_rms": float(np.sqrt(np.mean(d**2)) / ref) if ref > 0 else None,
        "argmax_agree": float(np.mean(a.argmax(-1) == b.argmax(-1))),
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--hf")
    ap.add_argument("--npz")
    ap.add_argument("artifacts", nargs="+")
    args = ap.parse_args()
    res = {
        "mlx_lm": mlx_lm.__version__,
        "mlx_lm_path": str(pathlib.Path(mlx_lm.__file__).parent),
        "mlx": mx.__version__,
        "device": str(mx.default_device()),
        "tokens": TOKENS,
        "artifacts": {},
        "compare": {},
    }
    logits = {}
    for spec in args.artifacts:
        name, d = spec.split("=", 1)
        d = pathlib.Path(d)
        files, tensors = describe_dir(d)
        try:
            rec, lg = run_one(d)
            logits[name] = lg
        except Exception as e:  # a refusal is a result too
            rec = {"loaded": False, "error": repr(e), "traceback": traceback.format_exc()}
        rec["dir"] = str(d)
        rec["files"] = files
        rec["tensors"] = tensors
        res["artifacts"][name] = rec
    names = list(logits)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            res["compare"][f"{a} vs {b}"] = compare(logits[a], logits[b])
    if args.hf:
        hf = np.load(args.hf)
        for a in names:
            res["compare"][f"{a} vs hf-float32"] = compare(logits[a], hf)
    if args.npz:
        np.savez(args.npz, **logits)
    pathlib.Path(args.out).write_text(json.dumps(res, indent=1, sort_keys=True) + "\n")

    print(f"mlx-lm {res['mlx_lm']} ({res['mlx_lm_path']}), mlx {res['mlx']} on {res['device']}")
    for name, rec in res["artifacts"].items():
        if not rec["loaded"]:
            print(f"  {name}: NOT LOADED: {rec['error']}")
            continue
        nm = " ".join(f"{k.split('.')[-2]}={v:.4f}" for k, v in rec["norm_means"].items())
        print(f"  {name}: {rec['parameters_loaded']} parameters ({rec['mtp_parameters_loaded']} mtp), logits sha256 {rec['logits_sha256'][:16]}, norm means {nm}, text {rec['text']!r}")
    for k, c in res["compare"].items():
        print(f"  {k}: identical={c['identical']} max|diff|={c['max_abs_diff']:.6g} rms_rel={c['rms_diff_over_rms']:.6g} argmax_agree={c['argmax_agree']:.3f}")
    bad = [n for n, r in res["artifacts"].items() if not r["loaded"]]
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
