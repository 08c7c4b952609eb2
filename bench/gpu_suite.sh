#!/usr/bin/env bash
# The whole GPU measurement in one prepared script, on one H100/H200, in parts taken in the order of issue 34's
# "Done means" (PARTS, default all four; the device tool allows 600 s a call and about 900 s a session, the machine's
# start included, so on a lent machine run two calls: PARTS=bench BUDGET_S=595 with timeout_s 600, then
# PARTS="zero3 tests zero1" with BUDGET_S 5 s under the timeout_s that is left; BUDGET_S caps every part's limit to
# what remains of it, skips a part that would get under 30 s, and keeps time for a cut run's stop and the table):
#   bench  bench/train_bench.py at seq_len 2048 for PRESETS (default 125m,350m,1b): Kiln's trainer with its default
#          settings against the reference loop, in one invocation (ratio, MFU, goodput at the default cadence, a
#          save's stall, peak memory against the layout's estimate), two steps of each profiled (the GPU's busy
#          fraction; operator tables in profile_<gpu>/);
#   zero3  $ZERO3_PRESET (default 1b) forced to ZeRO-3, against the stage the layout chose for it in bench;
#   tests  the GPU tests (tests/training_jobs/test_gpu.py: bf16, compile, the layout, the chunked loss, pinned input
#          and background checkpoint writes on CUDA, HF export), that file alone: collecting the others needs more of
#          Kiln's stack (mlflow, dagster) than the lent machines have;
#   zero1  $ZERO1_PRESET (default 125m) forced to ZeRO-1, the layout's choice on one GPU before ZeRO-0 and several
#          GPUs' default, with a profile of two steps (a diagnosis, not a goal: last).
# Each part has a time limit and goes on when one fails; each bench run is written to its JSON after Kiln's run and
# again after the reference, so a part cut short keeps what it measured, and a preset that fails is recorded with its
# error while the next one runs (Kiln's output in train_bench_*_<preset>_torchrun.log beside the JSON); a part's
# time limit stops every rank of the run it cut (bench/train_bench.py: stop_tree) before the next part starts.
# Last, bench/gpu_goals.py prints the goals against every figure in $FIGURES.
# Figures go to $FIGURES (default docs/bench; $OUT when the device tool runs it) as train_bench_<gpu>.json,
# train_bench_<preset>_zero3_<gpu>.json and train_bench_<preset>_zero1_<gpu>.json, each with the machine, the
# command and the date; logs beside them. A dry run on CPU: PRESETS=tiny SEQ_LEN=128 STEPS=6 ZERO1_PRESET=tiny
# ZERO3_PRESET=tiny.
#
# On a machine without a package index (the lent GPU machines: PyTorch and Triton installed, Python 3.12), first
# run bench/gpu_wheels.sh here and carry .whl; this script installs it into /tmp/site. Elsewhere it uses the
# Python it finds ($PYTHON, else .venv/bin/python, else python3).
set -uo pipefail
cd "$(dirname "$0")/.."
FIGURES="${FIGURES:-${OUT:-docs/bench}}"
mkdir -p "$FIGURES"
PY="${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}"
if ! "$PY" -c "import deepspeed, pydantic, phonenumbers, py3langid, ftfy, zstandard" 2>/dev/null; then
  if [ ! -d .whl ]; then
    echo "gpu_suite: $PY lacks DeepSpeed or Kiln's text dependencies, and there is no .whl/ to install them from: run" \
      "bash bench/gpu_wheels.sh on a machine with a package index and carry .whl (the device tool: carry [\".whl\"])" >&2
    exit 1
  fi
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
PARTS="${PARTS:-bench zero3 tests zero1}"
for part in $PARTS; do
  case $part in bench | zero3 | tests | zero1) ;;
    *) echo "PARTS: unknown part '$part'; expected some of: bench zero3 tests zero1" >&2; exit 2 ;; esac
done
in_parts() { case " $PARTS " in *" $1 "*) return 0 ;; esac; return 1; }
LOG="$FIGURES/gpu_suite_${gpu}_$(echo $PARTS | tr ' ' -).log"  # one per call, named by its parts
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$LOG" 2>&1 || echo "no nvidia-smi" > "$LOG"
status=0
BUDGET_S="${BUDGET_S:-}"  # seconds for this call in all; unset: each part's own limit
KILL_AFTER=30  # after a limit's SIGINT: the bench stops its run's ranks (up to 15 s) before it is killed
RESERVE=$((KILL_AFTER + 15))  # for the last part's stop and the closing table
step() {  # step SECONDS NAME COMMAND...: run with a time limit, log it, and go on when it fails
  local limit=$1 name=$2 t0=$SECONDS rc left; shift 2
  if [ -n "$BUDGET_S" ]; then
    left=$((BUDGET_S - SECONDS - RESERVE))
    if [ "$left" -lt 30 ]; then
      echo "== $name: skipped, ${left} s of BUDGET_S=$BUDGET_S left" | tee -a "$LOG"; status=1; return
    fi
    [ "$left" -lt "$limit" ] && limit=$left
  fi
  echo "== $name (limit ${limit} s): $*" | tee -a "$LOG"
  timeout --signal=INT --kill-after=$KILL_AFTER "$limit" "$@" 2>&1 | tee -a "$LOG"
  rc=${PIPESTATUS[0]}
  [ "$rc" = 0 ] || status=1
  echo "== $name: rc $rc, $((SECONDS - t0)) s" | tee -a "$LOG"
}
# Each preset's allowance, its launches with compilation included: in stop 58 (H200) a launch took 39 s at 125m and
# 114 s at 1b, and 125m and 350m against the reference about 200 s; the whole-model compilation since (stop 60) adds
# a time no GPU has measured yet. All three presets: 560 s, inside one 600 s call.
limit_for() { local total=0 p; for p in ${1//,/ }; do
  case $p in 125m) total=$((total + 130)) ;; 350m) total=$((total + 150)) ;; 1b) total=$((total + 280)) ;;
    *) total=$((total + 120)) ;; esac; done; echo $total; }
# The default checkpoint cadence (every 30 minutes: no save inside a run this short), which is what issue 34's goodput
# goal is about; the run's last save measures a save's stall (checkpoint_stall: the copy to host memory, pinning its
# buffers the first time), which a long run pays once per 30 minutes.
if in_parts bench; then
  step "$(limit_for "$PRESETS")" "train_bench $PRESETS" "$PY" bench/train_bench.py --preset "$PRESETS" \
    --seq-len "$SEQ_LEN" --steps "$STEPS" --profile "$FIGURES/profile_$gpu" --json-out "$FIGURES/train_bench_$gpu.json"
fi
ZERO1_PRESET="${ZERO1_PRESET:-125m}" ZERO3_PRESET="${ZERO3_PRESET:-1b}"
if in_parts zero3; then  # the throughput ZeRO-3 costs where the model fits without it
  step 200 "train_bench $ZERO3_PRESET ZeRO-3" "$PY" bench/train_bench.py --preset "$ZERO3_PRESET" --seq-len "$SEQ_LEN" \
    --steps "$STEPS" --zero-stage 3 --no-reference --json-out "$FIGURES/train_bench_${ZERO3_PRESET}_zero3_$gpu.json"
fi
if in_parts tests; then
  step 240 "GPU tests" "$PY" -m pytest -q -p no:cacheprovider tests/training_jobs/test_gpu.py
fi
if in_parts zero1; then  # where per-step overhead weighs most: what ZeRO-0 saves; its profile's host waits show
  # whether a step still synchronizes (overlap_comm, off for a compiled model since stop 62)
  step 100 "train_bench $ZERO1_PRESET ZeRO-1" "$PY" bench/train_bench.py --preset "$ZERO1_PRESET" --seq-len "$SEQ_LEN" \
    --steps "$STEPS" --zero-stage 1 --no-reference --profile "$FIGURES/profile_${ZERO1_PRESET}_zero1_$gpu" \
    --json-out "$FIGURES/train_bench_${ZERO1_PRESET}_zero1_$gpu.json"
fi
# The goals against this call's figures, and where this call did not make one, the figures committed under docs/bench
# (a second call reads the first's there once they are copied in; each figure's date and source are printed)
"$PY" bench/gpu_goals.py "$gpu" "$FIGURES" docs/bench | tee -a "$LOG"
exit $status
