#!/usr/bin/env bash
# The device run behind ../PROVENANCE.md's "ferry's output in mlx-lm 0.32":
# mlx-lm 0.32.0 converts the vision-language checkpoints itself and loads
# ferry's conversions of them next to its own. Needs an x86-64 Linux
# machine with Python 3.12, numpy, torch and transformers, no network. From
# the repository root:
#
#   bash mlxpack/testdata/qwen35vl_mlx/tools/run_vl_device.sh INPUTS OUT SET...
#
# SET is vl or moe. A device call may take little along, so the sets ran in
# two calls on the same machine: the second finds MLX, BLAS and mlx-lm
# unpacked by the first. INPUTS (PROVENANCE.md lists each file and its
# sha256; each call's INPUTS held what its sets need):
#   mlxpy_cpu_cp312_x86_64.tar.xz  MLX 0.32.1, CPU (../shared/reference/mlx/tools)
#   debs/*.deb                     Debian 12 libblas3, libgfortran5, libquadmath0
#   mlxlm-0.32.0.tar.xz            git archive of ml-explore/mlx-lm d78bf58e
#   make_vl.py, vl_base.sha256     ../shared/reference/qwen35vl/tools/make_vl.py
#                                  and its SHA256SUMS lines of base/: the
#                                  reference base is made again on the device
#                                  (regen_vl_base.py) and checked, being too
#                                  large to take along (or vl_base.tar.xz, the
#                                  base itself, when it fits)
#   moe_base.tar.xz                testmodel qwen35moe-vl's base/ (cmd/testmodel)
#   ferry_vl.tar.xz, ferry_moe.tar.xz  ferry's conversions (SET_bf16,
#                                  SET_g64_b4, SET_g64_b4_mtp), each
#                                  model.safetensors as its header and sha256
#                                  (rebuild.py), mtp.safetensors whole
# The scripts it runs: this directory's rebuild.py, regen_vl_base.py,
# check_cpu.py and inventory.py,
# ../../mlx_sidefile's lazy.py, check_logits.py and tokens.py.
set -uo pipefail
IN=$(realpath "$1")
OUT=$(realpath "$2")
shift 2
SETS=("$@")
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(pwd)
SIDE=$REPO/mlxpack/testdata/mlx_sidefile
W=/tmp/ferry-vlrun
LOGS=$W/logs
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1 PYTHONUNBUFFERED=1
export OPENBLAS_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false

# py ARGS...: python3 with MLX and mlx-lm 0.32.0, lazily bound (lazy.py).
py() { PYTHONPATH=/tmp/mlxpy:$W/mlxlm-0.32.0:$SIDE:$HERE python3 "$SIDE/lazy.py" "$@"; }

# logged LOG CMD...: the command line first, its output, the exit status last.
logged() {
	local log=$1
	shift
	{
		echo "+ $*"
		"$@"
		echo "exit=$?"
	} >"$log" 2>&1
	tail -n 25 "$log"
}

setup() {
	mkdir -p "$W" "$LOGS"
	echo "== machine"
	uname -srm
	grep -m1 'model name' /proc/cpuinfo
	echo "cores $(nproc)"
	python3 -c 'import sys, numpy, torch, transformers; print("python", sys.version.split()[0], "numpy", numpy.__version__, "torch", torch.__version__, "transformers", transformers.__version__)'
	(cd "$IN" && sha256sum ./*.tar.xz debs/*.deb 2>/dev/null)
	echo "== MLX and BLAS"
	local L=/tmp/blasroot/usr/lib/x86_64-linux-gnu
	if [[ -f $L/openblas-pthread/libopenblas.so.0 ]]; then
		echo "BLAS: unpacked by an earlier call"
	else
		for f in "$IN"/debs/*.deb; do dpkg -x "$f" /tmp/blasroot; done
		mkdir -p "$L/openblas-pthread"
		cp "$L/blas/libblas.so.3.11.0" "$L/openblas-pthread/libopenblas.so.0"
	fi
	export LD_LIBRARY_PATH=$L:$L/openblas-pthread${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
	if [[ -f $IN/mlxpy_cpu_cp312_x86_64.tar.xz ]]; then
		rm -rf /tmp/mlxpy && mkdir -p /tmp/mlxpy && tar -xJf "$IN/mlxpy_cpu_cp312_x86_64.tar.xz" -C /tmp/mlxpy
		rm -rf "$W/mlxlm-0.32.0" && tar -xJf "$IN/mlxlm-0.32.0.tar.xz" -C "$W"
	else
		echo "MLX and mlx-lm: unpacked by an earlier call"
	fi
	py -c 'import mlx.core as mx, mlx_lm; print("mlx", mx.__version__, mx.default_device(), "mlx-lm", mlx_lm.__version__)'
}

# convert SET: mlx-lm's own conversions of $W/SET/base, bf16 and 4-bit g64.
convert() {
	local set=$1
	rm -rf "$W/$set" && mkdir -p "$W/$set" "$W/ferry"
	if [[ -f $IN/${set}_base.tar.xz ]]; then
		tar -xJf "$IN/${set}_base.tar.xz" -C "$W/$set"
	else
		echo "== the reference base made again with its recipe, checked against its SHA256SUMS"
		logged "$LOGS/regen_${set}_base.log" python3 "$HERE/regen_vl_base.py" "$IN" "$REPO/testdata/models/qwen35-tiny/base" "$W/$set/base"
		(cd "$W/$set" && sha256sum -c "$IN/${set}_base.sha256") || {
			echo "the regenerated base is not the reference's: $set not converted"
			return 1
		}
	fi
	tar -xJf "$IN/ferry_$set.tar.xz" -C "$W/ferry"
	echo "== mlx-lm 0.32.0 convert of $set"
	(cd "$W/$set" && logged "$LOGS/convert_${set}_bf16.log" py -m mlx_lm convert --hf-path base --mlx-path mlxlm_bf16)
	(cd "$W/$set" && logged "$LOGS/convert_${set}_g64_b4.log" py -m mlx_lm convert --hf-path base --mlx-path mlxlm_g64_b4 -q --q-group-size 64 --q-bits 4)
}

# rebuild SET: ferry's files made whole from mlx-lm's tensors (rebuild.py).
rebuild() {
	local set=$1 d
	echo "== ferry's conversions of $set, rebuilt and checked against ferry's sha256"
	for d in bf16 g64_b4 g64_b4_mtp; do
		local src=mlxlm_${d%_mtp}
		logged "$LOGS/rebuild_${set}_$d.log" python3 "$HERE/rebuild.py" "$W/ferry/${set}_$d" "$W/$set/$src"
	done
}

# check SET: load all five in one process, logits over tokens.py, compare.
check() {
	local set=$1
	echo "== mlx-lm 0.32.0 loads $set: ferry's and its own"
	logged "$LOGS/check_$set.log" py "$HERE/check_cpu.py" --out "$OUT/check_$set.json" \
		ferry_bf16="$W/ferry/${set}_bf16" mlxlm_bf16="$W/$set/mlxlm_bf16" \
		ferry_g64_b4="$W/ferry/${set}_g64_b4" ferry_g64_b4_mtp="$W/ferry/${set}_g64_b4_mtp" mlxlm_g64_b4="$W/$set/mlxlm_g64_b4"
}

main() {
	setup
	for s in "${SETS[@]}"; do
		convert "$s" || continue
		rebuild "$s"
		check "$s"
		if [[ $s == moe ]]; then
			echo "== inventory of mlx-lm's conversions of the MoE set (the golden)"
			(cd "$W/moe" && rm -rf moevl_bf16 moevl_g64_b4 && cp -r mlxlm_bf16 moevl_bf16 && cp -r mlxlm_g64_b4 moevl_g64_b4 &&
				python3 "$HERE/inventory.py" "$OUT/moevl_mlx_inventory.json" moevl_bf16 moevl_g64_b4 &&
				tar -cJf "$OUT/moevl_mlx_small.tar.xz" --exclude='*.safetensors' moevl_bf16 moevl_g64_b4)
		fi
	done
	tar -cJf "$OUT/logs.tar.xz" -C "$W" logs
	ls -la "$OUT"
}

main 2>&1 | tee "$OUT/run_vl_device_$(IFS=_; echo "${SETS[*]}").log"
