"""../../mlx_sidefile/check_logits.py, for models MLX's CPU backend cannot
run as loaded: its GatherMM (SwitchLinear over float experts, the MoE's
switch_mlp in bf16, or a 4-bit model's experts left in bf16 because their
input dimension does not divide by the group size) supports float32 only.
When a forward pass fails so, the directory is loaded again (mlx_lm.load,
as before: the load itself succeeded) and its parameters cast to float32
(model.set_dtype) before the forward pass; the record says so
(cast_float32_for_cpu, and the first error). Every other failure is
reported as check_logits.py reports it.

    python3 lazy.py check_cpu.py --out R.json NAME=DIR...
"""

import check_logits as cl
import mlx.core as mx

_load = cl.load


def _load_f32(path):
    model, tokenizer = _load(path)
    model.set_dtype(mx.float32)
    return model, tokenizer


def run_one(d):
    try:
        return _run(d)
    except RuntimeError as e:
        if "GatherMM" not in str(e):
            raise
        cl.load = _load_f32
        try:
            rec, lg = _run(d)
        finally:
            cl.load = _load
        rec["cast_float32_for_cpu"] = True
        rec["error_as_loaded"] = repr(e)
        return rec, lg


_run = cl.run_one
cl.run_one = run_one

if __name__ == "__main__":
    cl.main()
