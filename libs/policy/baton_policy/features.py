"""Query features from the prompt text and the eval name only.

Hashed word unigrams and bigrams (a fixed-size space, so nothing but an IDF vector needs to be
stored), sublinear TF x IDF, L2-normalised, plus a one-hot of the eval name, and optionally a
static sentence embedding of the prompt (:mod:`embeddings`) scaled by ``embedding_scale``: n-grams
see exact wording, the embedding sees topic and paraphrase, which n-grams of a short question
miss. Everything needed to rebuild it is a small JSON config and one float32 array.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import scipy.sparse as sp
from sklearn.feature_extraction.text import HashingVectorizer
from sklearn.preprocessing import normalize

from .embeddings import EMBEDDERS, load_embedder


class TextFeaturizer:
    def __init__(
        self,
        n_features_log2: int = 16,
        eval_scale: float = 1.0,
        eval_names: Sequence[str] = (),
        embedding: str | None = None,
        embedding_scale: float = 1.0,
    ):
        self.n_features_log2 = int(n_features_log2)
        self.eval_scale = float(eval_scale)
        self.eval_names = list(eval_names)
        self.embedding = embedding
        self.embedding_scale = float(embedding_scale)
        self._embed = load_embedder(embedding) if embedding else None
        self._embedding_dim = EMBEDDERS[embedding][1] if embedding else 0
        self.idf: np.ndarray | None = None
        self._hasher = HashingVectorizer(
            n_features=2**self.n_features_log2,
            ngram_range=(1, 2),
            alternate_sign=False,
            norm=None,
            lowercase=True,
            dtype=np.float32,
        )

    @property
    def dim(self) -> int:
        return 2**self.n_features_log2 + len(self.eval_names) + self._embedding_dim

    def _counts(self, prompts: Sequence[str]) -> sp.csr_matrix:
        counts = self._hasher.transform(list(prompts)).tocsr()
        counts.data = 1.0 + np.log(counts.data)
        return counts

    def fit(self, prompts: Sequence[str], eval_names: Sequence[str]) -> TextFeaturizer:
        counts = self._counts(prompts)
        df = np.bincount(counts.indices, minlength=counts.shape[1]).astype(np.float64)
        n = counts.shape[0]
        self.idf = (np.log((1.0 + n) / (1.0 + df)) + 1.0).astype(np.float32)
        self.eval_names = sorted({e for e in eval_names if e})
        return self

    def transform(self, prompts: Sequence[str], eval_names: Sequence[str | None] | None = None) -> sp.csr_matrix:
        if self.idf is None:
            raise RuntimeError("featurizer is not fitted")
        text = normalize(self._counts(prompts).multiply(self.idf).tocsr(), norm="l2", copy=False)
        index = {e: j for j, e in enumerate(self.eval_names)}
        rows, cols = [], []
        for i, name in enumerate(eval_names if eval_names is not None else [None] * len(prompts)):
            j = index.get(name) if name else None
            if j is not None:
                rows.append(i)
                cols.append(j)
        onehot = sp.csr_matrix(
            (np.full(len(rows), self.eval_scale, dtype=np.float32), (rows, cols)),
            shape=(len(prompts), len(self.eval_names)),
        )
        blocks = [text, onehot]
        if self._embed is not None:
            blocks.append(sp.csr_matrix(self.embedding_scale * self._embed(list(prompts))))
        return sp.hstack(blocks, format="csr", dtype=np.float32)

    def config(self) -> dict:
        return {"n_features_log2": self.n_features_log2, "eval_scale": self.eval_scale, "eval_names": self.eval_names,
                "embedding": self.embedding, "embedding_scale": self.embedding_scale}

    def arrays(self) -> dict[str, np.ndarray]:
        assert self.idf is not None
        return {"featurizer_idf": self.idf}

    @classmethod
    def from_saved(cls, config: dict, arrays: dict[str, np.ndarray]) -> TextFeaturizer:
        obj = cls(config["n_features_log2"], config["eval_scale"], config["eval_names"],
                  config.get("embedding"), config.get("embedding_scale", 1.0))
        obj.idf = np.asarray(arrays["featurizer_idf"], dtype=np.float32)
        return obj
