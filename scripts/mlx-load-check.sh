#!/usr/bin/env bash
# Load ferry's MLX outputs with the real mlx-lm (0.32.0, d78bf58e) on MLX 0.32.1 and generate a
# few tokens from each: `ferry mlx quantize` of the two tiny references (Qwen3, Qwen3.5: float,
# 4/8-bit, g32, a mixed recipe, --keep-mtp) and of every generated family (llama, qwen2,
# qwen3_moe, qwen3_5_moe per-expert and fused, qwen3_5 ConditionalGeneration, qwen3_next), and
# `ferry mlx repack` of compressed-tensors checkpoints (deepseek_v3 link farm; qwen3 and qwen3_moe
# --rewrite). With REF set to ../shared/reference/mlx/convert, the logits of ferry's reference
# conversions are compared with mlx_lm.convert's own (they must be identical).
#
# Usage: scripts/mlx-load-check.sh DEPS [WORK]
#   DEPS holds what the machine cannot download (see "DEPS" below); WORK (default
#   /tmp/mlx-load-check) receives the outputs and logs. Needs python3.12 with transformers
#   (mlx-lm's tokenizers) and numpy; ferry from $FERRY, else bin/ferry, else `go build`.
#
# DEPS (a git-ignored folder of the checkout, e.g. .mlxdeps/, taken along with `carry`):
#   mlxpy_cpu_cp312_x86_64.tar.xz   ../shared/reference/mlx/tools/ (the prebuilt mlx package)
#   *.deb                            libopenblas0-pthread libopenblas-pthread-dev liblapacke-dev
#                                    libgfortran5 libquadmath0 (Debian 12, `apt-get download`);
#                                    optional where the system already has OpenBLAS
#   mlx-lm/                          mlx-lm at d78bf58e217c904ec282ed8da9b947491f78c022 (its
#                                    mlx_lm/ package directory inside)
#   testmodel                        optional: a prebuilt `go build ./internal/testmodel/cmd/testmodel`
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEPS="$(cd "${1:?usage: mlx-load-check.sh DEPS [WORK]}" && pwd)"
W="${2:-/tmp/mlx-load-check}"
mkdir -p "$W"
W="$(cd "$W" && pwd)"

# MLX, as ../shared/reference/mlx/PROVENANCE.md says.
mkdir -p "$W/mlxpy" "$W/blasroot"
tar -xJf "$DEPS/mlxpy_cpu_cp312_x86_64.tar.xz" -C "$W/mlxpy" || exit 1
for d in "$DEPS"/*.deb; do [ -e "$d" ] && dpkg -x "$d" "$W/blasroot"; done
export LD_LIBRARY_PATH="$W/blasroot/usr/lib/x86_64-linux-gnu/openblas-pthread:$W/blasroot/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PYTHONPATH="$W/mlxpy:$DEPS/mlx-lm${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1 OPENBLAS_NUM_THREADS=1
PY="${PY:-python3}"
"$PY" -c "import mlx.core as mx, mlx_lm; print('mlx', mx.__version__, 'mlx-lm', mlx_lm.__version__)" || exit 1

FERRY="${FERRY:-}"
if [ -z "$FERRY" ]; then
  if [ -x "$ROOT/bin/ferry" ]; then FERRY="$ROOT/bin/ferry"; else (cd "$ROOT" && go build -o "$W/ferry" ./cmd/ferry) || exit 1; FERRY="$W/ferry"; fi
fi
TESTMODEL="$DEPS/testmodel"
if [ ! -x "$TESTMODEL" ]; then (cd "$ROOT" && go build -o "$W/testmodel" ./internal/testmodel/cmd/testmodel) || exit 1; TESTMODEL="$W/testmodel"; fi

OUT="$W/out"; rm -rf "$OUT" "$W/src"; mkdir -p "$OUT"
"$TESTMODEL" "$W/src" llama qwen2 qwen3moe qwen35moe qwen35moe-fused qwen35-condgen qwen3next \
  ct-deepseek_v3 ct-qwen3 ct-qwen3_moe > /dev/null || exit 1
Q3="$ROOT/gguf/convert/testdata/qwen3/base"     # = ../shared/reference/qwen3/base
Q35="$ROOT/testdata/models/qwen35-tiny/base"    # = ../shared/reference/qwen35/base

fail=0
run() { echo "+ ferry $*" >> "$W/ferry.log"; "$FERRY" "$@" >> "$W/ferry.log" 2>&1 || { echo "ferry $* failed (see $W/ferry.log)"; fail=1; }; }
# The reference conversions (names as in ../shared/reference/mlx/convert), then more settings.
run mlx quantize "$Q3" --out "$OUT/qwen3_bf16"
run mlx quantize "$Q3" --out "$OUT/qwen3_g64_b4" --bits 4 --group-size 64
run mlx quantize "$Q3" --out "$OUT/qwen3_g64_b8" --bits 8 --group-size 64
run mlx quantize "$Q3" --out "$OUT/qwen3_g32_b4" --bits 4 --group-size 32
run mlx quantize "$Q35" --out "$OUT/qwen35_g64_b4" --bits 4 --group-size 64
run mlx quantize "$Q35" --out "$OUT/qwen35_g64_b4_keep_mtp" --bits 4 --group-size 64 --keep-mtp
run mlx quantize "$Q35" --out "$OUT/qwen35_mixed_3_6" --bits 3 --recipe mixed_3_6
run mlx quantize "$Q35" --out "$OUT/qwen35_f16" --dtype f16
for fam in llama qwen2 qwen3moe qwen35moe qwen35moe-fused qwen35-condgen qwen3next; do
  run mlx quantize "$W/src/$fam" --out "$OUT/$fam-g32-b4" --bits 4 --group-size 32
done
run mlx repack "$W/src/ct-deepseek_v3" --out "$OUT/repack-deepseek_v3-link"
run mlx repack "$W/src/ct-qwen3" --out "$OUT/repack-qwen3-rewrite" --rewrite
run mlx repack "$W/src/ct-qwen3_moe" --out "$OUT/repack-qwen3_moe-rewrite" --rewrite

refs=()
if [ -n "${REF:-}" ]; then
  for n in qwen3_bf16 qwen3_g64_b4 qwen3_g64_b8 qwen3_g32_b4 qwen35_g64_b4; do refs+=(--ref "$n=$REF/$n"); done
fi
"$PY" "$ROOT/scripts/mlx_load_check.py" "${refs[@]}" "$OUT"/* 2>&1 | tee "$W/load-check.log"
rc=${PIPESTATUS[0]}
[ "$fail" = 0 ] && [ "$rc" = 0 ]
