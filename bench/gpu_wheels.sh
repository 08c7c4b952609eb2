#!/usr/bin/env bash
# The wheels bench/gpu_suite.sh needs on a GPU machine that has PyTorch but cannot reach a package index (Python
# 3.12, x86-64, as the lent H100/H200 machines): DeepSpeed and pydantic with their small dependencies, and what the
# GPU tests' fixtures import beyond the machine's own packages (pandas, pyarrow, sentencepiece, pytest, hypothesis
# and transformers are there; kiln's text modules need phonenumbers, py3langid, ftfy and zstandard), into .whl/
# (git-ignored through .git/info/exclude). Run here, once, before carrying .whl to the GPU machine.
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
mkdir -p .whl
PIP="${PIP:-.venv/bin/python -m pip}"
version() { .venv/bin/python -c "import importlib.metadata as m; print(m.version('$1'))"; }
# DeepSpeed ships an sdist only: build its pure-Python wheel here (no ops are compiled at install time).
$PIP wheel -q --no-deps --no-build-isolation -w .whl "deepspeed==$(version deepspeed)"
for pkg in hjson pydantic pydantic-core annotated-types typing-inspection typing-extensions \
           dill einops msgpack psutil tabulate tqdm wcwidth dagster-pipes safetensors \
           phonenumbers py3langid ftfy zstandard; do
  $PIP download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .whl "$pkg==$(version "$pkg")"
done
ls -1 .whl
