"""Load an MLX directory with mlx_lm.load and generate 5 greedy tokens for
"hi" (the load check of ../../../../../shared/reference/mlx, as there).

    python3 ../../mlx_sidefile/lazy.py load_generate.py DIR
"""

import sys

import mlx.core as mx
from mlx_lm import generate, load

model, tokenizer = load(sys.argv[1])
text = generate(model, tokenizer, prompt="hi", max_tokens=5)
print(repr(text))
print("loaded-ok", type(model).__module__, mx.default_device())
