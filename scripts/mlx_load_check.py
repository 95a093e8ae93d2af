#!/usr/bin/env python3
"""Load MLX directories with the real mlx-lm and generate a few tokens.

Usage: mlx_load_check.py [--ref NAME=DIR]... DIR...

For each DIR: mlx_lm.utils.load_model (strict load_weights, the loader's
quantization rules), then a greedy generation of 5 tokens from token ids
[1, 2, 3] straight through the model (no tokenizer needed), checking the
logits are finite; then, if the directory's tokenizer loads,
mlx_lm.generate(prompt="hi", max_tokens=5) as PROVENANCE.md's check does.
--ref NAME=DIR compares the logits of the output whose directory name is
NAME with those of DIR (an mlx_lm.convert output of the same model): with
the same tensors they must be identical.

Prints one line per directory and exits 1 if any failed. Written for
scripts/mlx-load-check.sh, which sets up MLX and makes the directories.
"""
import sys
import traceback
from pathlib import Path


def greedy(model, ids, n):
    import mlx.core as mx

    out, first = list(ids), None
    for _ in range(n):
        logits = model(mx.array([out]))[0, -1].astype(mx.float32)
        mx.eval(logits)
        if first is None:
            first = logits
        if not bool(mx.all(mx.isfinite(logits)).item()):
            raise ValueError("non-finite logits")
        out.append(int(mx.argmax(logits).item()))
    return out[len(ids):], first


def check(path, refs):
    import mlx.core as mx
    from mlx_lm import generate, load
    from mlx_lm.utils import load_model

    model, config = load_model(Path(path))
    toks, logits = greedy(model, [1, 2, 3], 5)
    q = config.get("quantization")
    qs = "float" if q is None else f"{q.get('bits')}-bit g{q.get('group_size')}"
    line = f"ok    {path}: {config.get('model_type')} {qs}, greedy ids {toks}"
    ref = refs.get(Path(path).name)
    if ref:
        rmodel, _ = load_model(Path(ref))
        _, rlogits = greedy(rmodel, [1, 2, 3], 1)
        diff = float(mx.max(mx.abs(logits - rlogits)).item())
        line += f"; logits vs {ref}: max |diff| {diff}"
        if diff != 0:
            raise ValueError(line + " (want 0: the tensors are the same)")
    try:
        m, tok = load(path)
        text = generate(m, tok, prompt="hi", max_tokens=5)
        line += f"; generate('hi') = {text!r}"
    except Exception as e:  # a model without a usable tokenizer still loads
        line += f"; tokenizer not usable here ({type(e).__name__}: {e})"
    return line


def main(argv):
    refs, dirs = {}, []
    it = iter(argv)
    for a in it:
        if a == "--ref":
            name, _, d = next(it).partition("=")
            refs[name] = d
        else:
            dirs.append(a)
    if not dirs:
        print(__doc__)
        return 2
    import mlx.core as mx
    import mlx_lm

    print(f"mlx {mx.__version__}, mlx-lm {mlx_lm.__version__}, device {mx.default_device()}")
    failed = 0
    for d in dirs:
        try:
            print(check(d, refs), flush=True)
        except Exception:
            failed += 1
            print(f"FAIL  {d}:\n" + traceback.format_exc(), flush=True)
    print(f"{len(dirs) - failed} of {len(dirs)} directories load and generate")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
