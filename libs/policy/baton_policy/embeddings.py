"""Static sentence embeddings for the policy's query features, from weights inside a PyPI wheel.

WordLlama (MIT) ships its ``l2_supercat`` token-embedding table (256 dimensions) and tokenizer in
its wheel, so an embedding costs a tokenizer pass and an average, runs on CPU, and needs no model
hub: both the trainer and the router read the same files from the installed package. Loading is
pointed at the package's own folder with downloads disabled, so a missing file is an error, never
a network call.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import lru_cache
from pathlib import Path

import numpy as np

# name -> (WordLlama config, dimension); the name is what a saved policy records.
EMBEDDERS = {"wordllama-l2_supercat-256": ("l2_supercat", 256)}


@lru_cache(maxsize=4)
def load_embedder(name: str) -> Callable[[Sequence[str]], np.ndarray]:
    """A function from texts to L2-normalised float32 embeddings [n, dim]."""
    if name not in EMBEDDERS:
        raise ValueError(f"unknown query embedding {name!r}; known: {sorted(EMBEDDERS)}")
    try:
        import wordllama
        from wordllama import WordLlama
    except ImportError as exc:  # pragma: no cover - the dependency is declared; this names the fix
        raise RuntimeError(f"query embedding {name!r} needs the wordllama package (pip install wordllama)") from exc
    config, dim = EMBEDDERS[name]
    model = WordLlama.load(config=config, dim=dim, cache_dir=Path(wordllama.__file__).parent, disable_download=True)

    def embed(texts: Sequence[str]) -> np.ndarray:
        if len(texts) == 0:
            return np.zeros((0, dim), dtype=np.float32)
        out = np.asarray(model.embed([t or " " for t in texts], norm=True), dtype=np.float32)
        return out.reshape(len(texts), dim)

    return embed
