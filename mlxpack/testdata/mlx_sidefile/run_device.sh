#!/usr/bin/env bash
# The device run behind mlxpack/testdata/mlx_sidefile and
# mlxpack/testdata/qwen35vl_mlx (their PROVENANCE.md say what it showed).
# Needs an x86-64 Linux machine with Python 3.12, numpy, torch and
# transformers, and no network. Usage, from the repository root:
#
#   bash mlxpack/testdata/mlx_sidefile/run_device.sh INPUTS OUT
#
# INPUTS holds what the run takes along (PROVENANCE.md lists each file and
# its sha256):
#   mlxpy_cpu_cp312_x86_64.tar.xz   MLX 0.32.1, CPU, built by ../shared/reference/mlx/tools/build_mlx.sh
#   debs/*.deb                      Debian 12 libblas3 (reference BLAS with CBLAS), libgfortran5, libquadmath0
#   mlxlm-0.31.3.tar.xz             git archive of ml-explore/mlx-lm v0.31.3 (mlx_lm/, setup.py)
#   mlxlm-0.32.0.tar.xz             the same of d78bf58e (0.32.0)
#   artifacts.tar.xz                ferry's MLX directories (mlx4-mtp-side, mlx4-no-mtp, mlx4-mtp-in-model)
#   qwen35vl_base.tar.xz            ../shared/reference/qwen35vl/base
# OUT receives run_device.log, sidefile_<version>.json, qwen35vl_mlx_inventory.json,
# qwen35vl_mlx.tar.xz (the conversions) and logs.tar.xz (every log, the logits).
set -uo pipefail
IN=$(realpath "$1")
OUT=$(realpath "$2")
shift 2
PARTS=("$@")
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../../.." && pwd)
Q28=$REPO/mlxpack/testdata/qwen35vl_mlx/tools
W=/tmp/ferry-mlxrun
LOGS=$W/logs
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1 PYTHONUNBUFFERED=1
export OPENBLAS_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false

# py VERSION ARGS...: python3 with MLX and that mlx-lm, lazily bound (lazy.py).
py() {
	local v=$1
	shift
	PYTHONPATH=/tmp/mlxpy:$W/mlxlm-$v:$HERE:$Q28 python3 "$HERE/lazy.py" "$@"
}

# logged LOG CMD...: the command line first, its output, the exit status last.
logged() {
	local log=$1
	shift
	{
		echo "+ $*"
		"$@"
		echo "exit=$?"
	} >"$log" 2>&1
	tail -n 30 "$log"
}

setup() {
	mkdir -p "$W/art" "$LOGS" "$W/q28"
	echo "== machine"
	uname -srm
	grep -m1 'model name' /proc/cpuinfo
	echo "cores $(nproc)"
	python3 -c 'import sys, numpy, torch, transformers; print("python", sys.version.split()[0], "numpy", numpy.__version__, "torch", torch.__version__, "transformers", transformers.__version__)'
	sha256sum "$IN"/*.tar.xz "$IN"/debs/*.deb 2>/dev/null

	echo "== MLX and BLAS"
	# The prebuilt MLX looks for libopenblas.so.0 in its RUNPATH,
	# /tmp/blasroot/usr/lib/x86_64-linux-gnu/openblas-pthread, then the system.
	local L=/tmp/blasroot/usr/lib/x86_64-linux-gnu
	if [[ -f $L/openblas-pthread/libopenblas.so.0 ]]; then
		echo "BLAS: Debian libblas3 as libopenblas.so.0, unpacked by an earlier call"
	elif ldconfig -p | grep -q 'libopenblas\.so\.0 '; then
		echo "BLAS: the system's $(ldconfig -p | grep -m1 'libopenblas\.so\.0 ')"
	else
		for f in "$IN"/debs/*.deb; do dpkg -x "$f" /tmp/blasroot; done
		mkdir -p "$L/openblas-pthread"
		cp "$L/blas/libblas.so.3.11.0" "$L/openblas-pthread/libopenblas.so.0"
		echo "BLAS: Debian libblas3 3.11.0 (reference BLAS, CBLAS included) as libopenblas.so.0; LAPACK left unbound (lazy.py)"
	fi
	export LD_LIBRARY_PATH=$L:$L/openblas-pthread${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
	if [[ -f $IN/mlxpy_cpu_cp312_x86_64.tar.xz ]]; then
		rm -rf /tmp/mlxpy && mkdir -p /tmp/mlxpy && tar -xJf "$IN/mlxpy_cpu_cp312_x86_64.tar.xz" -C /tmp/mlxpy
	else
		echo "MLX: unpacked by an earlier call ($(ls -d /tmp/mlxpy/mlx))"
	fi
	for v in 0.31.3 0.32.0; do
		if [[ -f $IN/mlxlm-$v.tar.xz ]]; then
			rm -rf "$W/mlxlm-$v" && tar -xJf "$IN/mlxlm-$v.tar.xz" -C "$W"
		fi
	done
	py 0.32.0 -c 'import mlx.core as mx, mlx_lm; a = mx.arange(6, dtype=mx.float32).reshape(2, 3); print("mlx", mx.__version__, mx.default_device(), (a @ a.T).tolist(), "mlx-lm", mlx_lm.__version__)'
}

part_sidefile() {
	rm -rf "$W/art" && mkdir -p "$W/art"
	tar -xJf "$IN/artifacts.tar.xz" -C "$W/art"
	echo "== mlx-lm's own conversion of the same base (config model_type qwen3_5_text -> qwen3_5, as ../shared/reference/mlx)"
	rm -rf "$W/base_mt" && cp -r "$REPO/testdata/models/qwen35-tiny/base" "$W/base_mt"
	python3 - "$W/base_mt/config.json" <<-'EOF'
		import json, sys
		p = sys.argv[1]; c = json.load(open(p))
		assert c["model_type"] == "qwen3_5_text"
		c["model_type"] = "qwen3_5"
		open(p, "w").write(json.dumps(c, indent=2) + "\n")
	EOF
	(cd "$W" && logged "$LOGS/convert_mlxlm_0.32.0_g64_b4.log" py 0.32.0 -m mlx_lm convert --hf-path base_mt --mlx-path art/mlxlm-convert-g64-b4 -q --q-group-size 64 --q-bits 4)

	echo "== the float reference (transformers, float32)"
	(cd "$HERE" && logged "$LOGS/hf_logits.log" python3 hf_logits.py "$REPO/testdata/models/qwen35-tiny/base" "$W/hf_logits.npy")
	local hf=()
	[[ -f $W/hf_logits.npy ]] && hf=(--hf "$W/hf_logits.npy")

	for v in 0.31.3 0.32.0; do
		echo "== mlx-lm $v: load, forward, compare"
		logged "$LOGS/check_$v.log" py "$v" "$HERE/check_logits.py" --out "$OUT/sidefile_$v.json" "${hf[@]}" --npz "$LOGS/logits_$v.npz" \
			side="$W/art/mlx4-mtp-side" no_mtp="$W/art/mlx4-no-mtp" mtp_in_model="$W/art/mlx4-mtp-in-model" mlxlm_convert="$W/art/mlxlm-convert-g64-b4"
	done
}

part_qwen35vl() {
	echo "== issue 28: mlx-lm 0.32.0 convert of ../shared/reference/qwen35vl/base, as it is"
	rm -rf "$W/q28" && mkdir -p "$W/q28"
	tar -xJf "$IN/qwen35vl_base.tar.xz" -C "$W/q28"
	local name args
	while IFS='|' read -r name args; do
		# shellcheck disable=SC2086
		(cd "$W/q28" && logged "$LOGS/convert_qwen35vl_$name.log" py 0.32.0 -m mlx_lm convert --hf-path base --mlx-path "qwen35vl_$name" $args)
		if [[ -f $W/q28/qwen35vl_$name/config.json ]]; then
			(cd "$W/q28" && logged "$LOGS/load_qwen35vl_$name.log" py 0.32.0 "$Q28/load_generate.py" "qwen35vl_$name")
		fi
	done <<-'EOF'
		bf16|
		g64_b4|-q --q-group-size 64 --q-bits 4
	EOF
	local made=()
	for d in "$W"/q28/qwen35vl_*; do [[ -d $d ]] && made+=("$d"); done
	if ((${#made[@]} > 0)); then
		python3 "$Q28/inventory.py" "$OUT/qwen35vl_mlx_inventory.json" "${made[@]}"
		tar -cJf "$OUT/qwen35vl_mlx.tar.xz" -C "$W/q28" $(cd "$W/q28" && ls -d qwen35vl_*)
	fi
}

main() {
	rm -rf "$LOGS"
	setup
	for p in "${PARTS[@]}"; do "part_$p"; done
	tar -cJf "$OUT/logs.tar.xz" -C "$W" logs
	ls -la "$OUT"
}

main 2>&1 | tee "$OUT/run_device.log"
