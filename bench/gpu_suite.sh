#!/usr/bin/env bash
# The whole GPU measurement in one prepared script, on one H100/H200. Measured on an H200 (2026-11-30): 125m and 350m
# took 304 s of the first step's 300 s limit, and 1b alone 239 s more, so 1b and its ZeRO-3 run did not fit; the
# device tool allows 600 s a call: run PRESETS=125m,350m, then PRESETS=1b, as two calls.
#   1. bench/train_bench.py at seq_len 2048 for the 125m, 350m and 1b presets: Kiln's trainer with its default
#      settings against the reference loop, in one invocation (ratio, MFU, goodput);
#   2. the GPU tests (tests marked gpu: bf16, compile, the layout, the chunked loss and pinned input on CUDA, HF
#      export);
#   3. the smallest preset forced to ZeRO-1 (the layout's choice before ZeRO-0 on one GPU), against ZeRO-0 in 1;
#   4. the 1b preset forced to ZeRO-3, against the stage the layout chose in 1.
# The figures come first: each step has a time limit, and each bench run is written to its JSON as it ends.
# Figures go to $FIGURES (default docs/bench; $OUT when the device tool runs it) as train_bench_<gpu>.json and
# train_bench_1b_zero3_<gpu>.json, each with the machine, the command and the date; logs beside them.
#
# On a machine without a package index (the lent GPU machines: PyTorch and Triton installed, Python 3.12), first
# run bench/gpu_wheels.sh here and carry .whl; this script installs it into /tmp/site. Elsewhere it uses the
# Python it finds ($PYTHON, else .venv/bin/python, else python3).
set -uo pipefail
cd "$(dirname "$0")/.."
FIGURES="${FIGURES:-${OUT:-docs/bench}}"
mkdir -p "$FIGURES"
PY="${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}"
if ! "$PY" -c "import deepspeed, pydantic" 2>/dev/null && [ -d .whl ]; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || exit 1
  export PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
export MLFLOW_DISABLE_TELEMETRY=true PYTHONUNBUFFERED=1 KILN_HOME="${KILN_HOME:-/tmp/kiln-gpu-suite}"
export TORCH_EXTENSIONS_DIR="$KILN_HOME/torch_extensions"
unset DS_ACCELERATOR MLFLOW_TRACKING_URI
# The GPU's short name (h200, h100, a100, l40s) names the files; "cpu" without one (a dry run of this script, with
# PRESETS=tiny SEQ_LEN=128 STEPS=4 to keep it short).
gpu=$("$PY" -c "import torch; n = torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'cpu'; \
print(next((w for w in n.split() if w[0] in 'ABHL' and w[1:2].isdigit()), n.split()[-1]).lower())") || exit 1
PRESETS="${PRESETS:-125m,350m,1b}" SEQ_LEN="${SEQ_LEN:-2048}" STEPS="${STEPS:-60}"
LOG="$FIGURES/gpu_suite_$gpu.log"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$LOG" 2>&1 || echo "no nvidia-smi" > "$LOG"
status=0
step() {  # step SECONDS NAME COMMAND...: run with a time limit, log it, and go on when it fails
  local limit=$1 name=$2 t0=$SECONDS rc; shift 2
  echo "== $name (limit ${limit} s): $*" | tee -a "$LOG"
  timeout --signal=INT --kill-after=10 "$limit" "$@" 2>&1 | tee -a "$LOG"
  rc=${PIPESTATUS[0]}
  [ "$rc" = 0 ] || status=1
  echo "== $name: rc $rc, $((SECONDS - t0)) s" | tee -a "$LOG"
}
# A save half-way as well as the last one: far more often than the default cadence (30 minutes), so the loop's
# goodput errs low, and the stall of a save at the cadence (the copy to host memory) is measured.
step 300 "train_bench $PRESETS" "$PY" bench/train_bench.py --preset "$PRESETS" --seq-len "$SEQ_LEN" --steps "$STEPS" \
  --checkpoint-every $((STEPS / 2)) --json-out "$FIGURES/train_bench_$gpu.json"
small="${PRESETS%%,*}"  # the smallest preset, forced to ZeRO-1: how much ZeRO-0 saves where overhead weighs most
step 90 "train_bench $small ZeRO-1" "$PY" bench/train_bench.py --preset "$small" --seq-len "$SEQ_LEN" --steps "$STEPS" \
  --zero-stage 1 --no-reference --json-out "$FIGURES/train_bench_${small}_zero1_$gpu.json"
step 120 "GPU tests" "$PY" -m pytest -q -m gpu -p no:cacheprovider tests/training_jobs
big="${PRESETS##*,}"  # the largest preset, forced to ZeRO-3
step 200 "train_bench $big ZeRO-3" "$PY" bench/train_bench.py --preset "$big" --seq-len "$SEQ_LEN" --steps "$STEPS" \
  --zero-stage 3 --no-reference --json-out "$FIGURES/train_bench_${big}_zero3_$gpu.json"
exit $status
