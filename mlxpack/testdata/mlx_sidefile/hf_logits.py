"""The float reference: the Hugging Face checkpoint's logits on TOKENS, from
transformers in float32 on the CPU (the MTP head is not part of the causal
LM; transformers ignores mtp.* on load).

    python3 hf_logits.py BASE_DIR OUT.npy
"""

import sys

import numpy as np
import torch
import transformers
from transformers import AutoModelForCausalLM

from tokens import TOKENS

base, out = sys.argv[1], sys.argv[2]
torch.manual_seed(0)
model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
model.eval()
with torch.no_grad():
    logits = model(torch.tensor([TOKENS])).logits[0].float().numpy()
np.save(out, logits)
print(f"transformers {transformers.__version__} torch {torch.__version__}: {type(model).__name__}, logits {logits.shape}")
