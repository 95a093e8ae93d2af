"""Run a Python module or script with lazy symbol binding.

The prebuilt MLX (../shared/reference/mlx/tools) links libopenblas.so.0. The
device run gives it Debian's reference BLAS (libblas3, which has CBLAS) under
that name and no LAPACK: MLX calls LAPACK only in mx.linalg, which nothing
here uses, and every LAPACK reference of libmlx.so is a PLT slot
(R_X86_64_JUMP_SLOT), so with RTLD_LAZY it is bound only if called.

    python3 lazy.py -m mlx_lm convert ...
    python3 lazy.py -c "import mlx.core"
    python3 lazy.py script.py args...
"""

import os
import runpy
import sys

sys.setdlopenflags(os.RTLD_LAZY)
if len(sys.argv) < 2:
    sys.exit("usage: lazy.py -m MODULE ARGS... | -c CODE | SCRIPT ARGS...")
if sys.argv[1] == "-c":
    code = sys.argv[2]
    sys.argv = ["-c"] + sys.argv[3:]
    exec(compile(code, "<string>", "exec"), {"__name__": "__main__"})
elif sys.argv[1] == "-m":
    module = sys.argv[2]
    sys.argv = [module] + sys.argv[3:]
    runpy.run_module(module, run_name="__main__", alter_sys=True)
else:
    script = sys.argv[1]
    sys.argv = sys.argv[1:]
    runpy.run_path(script, run_name="__main__")
