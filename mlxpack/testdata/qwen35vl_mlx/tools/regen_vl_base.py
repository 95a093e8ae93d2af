"""Make ../shared/reference/qwen35vl/base again on the device, with the
reference's own recipe (its tools/make_vl.py, steps "tokenizer" and "base":
the set's PROVENANCE.md records that a fresh machine regenerated every base
file byte for byte), for a device call that cannot take the 4.3 MB
checkpoint along. The caller checks the files against the reference's
SHA256SUMS; only then is the result the reference base.

    python3 regen_vl_base.py MAKE_VL_DIR TOKENIZER_DIR OUT_BASE_DIR

TOKENIZER_DIR holds the qwen35 DEV tokenizer (testdata/models/qwen35-tiny/base).
"""

import pathlib
import sys

sys.path.insert(0, sys.argv[1])
import make_vl  # noqa: E402

import torch  # noqa: E402

torch.set_num_threads(4)  # as make_vl.py's main
spec = make_vl.SPECS["qwen35vl"]
tok, out = pathlib.Path(sys.argv[2]), pathlib.Path(sys.argv[3])
make_vl.REPORT.clear()
make_vl.REPORT["steps"] = {}
info = make_vl.do_tokenizer(spec, tok, out)
res = make_vl.do_base(spec, "qwen35vl", out, info)
print("base written:", res["saved"]["files"], res["key_prefix_counts"])
