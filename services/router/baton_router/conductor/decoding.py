"""Grammar-constrained decoding with jump-forward, for the transformers conductor.

A plan is mostly structure the grammar forces: `{"model_id": [`, `], "subtasks": ["`, the closing
brackets. On a CPU a step of a small model costs the same for one token as for a dozen (it reads every
weight either way), so the tokens the grammar forces are not decoded one by one: after each drawn token
the forced text that follows (xgrammar's jump-forward string) is tokenized and fed with it in the next
forward pass. A one-step plan then takes about half the forward passes.

Under greedy decoding the rest is guessed too: a trained conductor writes much the same instructions
again, so the tokens that followed the same few tokens in a recent plan (`PlanMemory`) are fed as a
draft, and each is kept only if it is the model's own greedy choice at its position; the first that is
not ends the chunk, its positions are masked out of the attention and the matcher rolls back. The plan
is the one token-by-token decoding writes; a repeated plan takes three or four passes.

Forced text is tokenized by the model's own tokenizer, as the conductor was trained on it, and its
last token is left to the model: the grammar may allow a longer token that starts with it (` [` or
` ["`). Every emitted token keeps its three log-probs (see `Sample`): the model's and the masked one
come from the logits at its position, whether it was drawn or forced; its sampling log-prob is 0 when
it was forced, since it was not drawn, so the plan's propensity is the probability of what was drawn.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass
class Sample:
    """One generated plan: its text and three log-probs per token.

    - `token_logprobs` (what the Proposal records; see `llm`): the model's distribution restricted
      to the tokens the grammar allows and renormalised, at temperature 1;
    - `model_logprobs`: the model's own, unconstrained distribution;
    - `sampling_logprobs`: the distribution the token was drawn from (mask, then temperature, top-k,
      top-p), 0 for a token the grammar forced; their sum gives the propensity.
    """

    text: str
    token_ids: list[int]
    token_logprobs: list[float]
    model_logprobs: list[float]
    sampling_logprobs: list[float]
    finished: bool
    forced: list[bool] = field(default_factory=list)  # per token: fed by jump-forward, not drawn

    @property
    def sampling_logprob(self) -> float:
        return math.fsum(self.sampling_logprobs)


@dataclass(frozen=True)
class Sampling:
    """How a token is drawn from the masked logits: greedily at temperature 0."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0


class _Row:
    """One plan being written: its matcher, what it emitted, and the tokens to feed next."""

    def __init__(self, matcher) -> None:
        self.matcher = matcher
        self.sample = Sample(text="", token_ids=[], token_logprobs=[], model_logprobs=[], sampling_logprobs=[],
                             finished=False)
        self.chunk: list[int] = []  # fed in the next forward pass: the drawn token, then forced and drafted ones
        self.drafted: list[bool] = []  # per chunk token after the first: a guess the model must confirm
        self.masks: list = []  # the grammar's mask before each chunk token after the first
        self.done = False

    def context(self) -> list[int]:
        """What the row has written, with the forced and drafted tokens queued so far."""
        return self.sample.token_ids + self.chunk[1:]

    def emit(self, token: int, own: float, allowed: float, drawn: float, forced: bool) -> None:
        s = self.sample
        s.token_ids.append(token)
        s.model_logprobs.append(own)
        s.token_logprobs.append(allowed)
        s.sampling_logprobs.append(drawn)
        s.forced.append(forced)


class Decoder:
    """Writes plans for a batch of prompts under per-row grammars (blocking; run it on a worker thread)."""

    def __init__(self, model, tokenizer, eos_ids: set[int], *, jump_forward: bool = True,
                 memory: PlanMemory | None = None) -> None:
        import torch
        import xgrammar

        self.torch, self.xgrammar = torch, xgrammar
        self.model, self.tokenizer, self.eos_ids = model, tokenizer, eos_ids
        self.vocab = model.config.vocab_size
        self.jump_forward = jump_forward
        self.memory = memory  # recent plans to draft from (greedy decoding only)
        self.forward_passes = 0

    def decode(self, input_ids, attention_mask, cache, grammars: Sequence, *, max_new_tokens: int,
               sampling: Sampling, pad_id: int) -> list[Sample]:
        """`input_ids` are the tokens after what `cache` holds (all of them when it is None); the mask
        covers both. Left padding is allowed anywhere: positions follow the mask."""
        torch, xgr = self.torch, self.xgrammar
        rows = [_Row(xgr.GrammarMatcher(g)) for g in grammars]
        bitmask = xgr.allocate_token_bitmask(len(rows), self.vocab)
        mask = attention_mask
        logits = list(self._forward(input_ids, mask, cache, keep=1)[:, -1, :])
        while True:
            self._draw(rows, logits, bitmask, sampling, max_new_tokens)
            if not any(r.chunk for r in rows):
                break
            width = max(len(r.chunk) for r in rows)
            ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
            new = torch.zeros((len(rows), width), dtype=mask.dtype)
            for i, r in enumerate(rows):
                if r.chunk:
                    ids[i, width - len(r.chunk):] = torch.tensor(r.chunk)
                    new[i, width - len(r.chunk):] = 1
            mask = torch.cat([mask, new.to(mask.device)], dim=1)
            out = self._forward(ids.to(mask.device), mask, cache, keep=width)
            for i, r in enumerate(rows):
                if r.chunk:
                    start = width - len(r.chunk)
                    kept = self._check(r, out[i, start:])
                    mask[i, mask.shape[1] - len(r.chunk) + kept:] = 0  # a refused draft is never attended
                    logits[i] = out[i, start + kept - 1]
                    r.chunk, r.drafted, r.masks = [], [], []
        if self.memory is not None:
            for r in rows:
                if r.sample.finished:
                    self.memory.add(r.sample.token_ids[:-1])
        for r in rows:
            ids = [t for t in r.sample.token_ids if t not in self.eos_ids]
            r.sample.text = self.tokenizer.decode(ids, skip_special_tokens=True)
        return [r.sample for r in rows]

    def _forward(self, ids, mask, cache, keep: int):
        """Logits of the last `keep` positions of `ids`, which follow what the cache holds; the cache grows.
        (The output layer is a sixth of the model: a prompt's other positions need none.)"""
        self.forward_passes += 1
        positions = (mask.long().cumsum(-1) - 1).clamp(min=0)[:, -ids.shape[1]:]
        with self.torch.inference_mode():
            out = self.model(input_ids=ids, attention_mask=mask, position_ids=positions, cache=cache, use_cache=True,
                             logits_to_keep=keep)
        return out.logits.float()

    def _draw(self, rows: list[_Row], after: list, bitmask, sampling: Sampling, budget: int) -> None:
        """Draws each live row's next token from the logits `after` its last token, then queues the text the
        grammar forces after it and, when greedy, a draft."""
        torch, xgr = self.torch, self.xgrammar
        live = [i for i, r in enumerate(rows) if not r.done]
        if not live:
            return
        for n, i in enumerate(live):
            rows[i].matcher.fill_next_token_bitmask(bitmask, n)
        logits = torch.stack([after[i] for i in live])  # rows that are done have no mask to apply
        own = torch.log_softmax(logits, dim=-1)
        masked = logits.clone()
        xgr.apply_token_bitmask_inplace(masked, bitmask[:len(live)].to(masked.device))
        allowed = torch.log_softmax(masked, dim=-1)
        if sampling.temperature > 0:
            drawn_lp = torch.log_softmax(_warp(masked, sampling), dim=-1)
            picks = torch.multinomial(drawn_lp.exp(), 1).squeeze(1)
        else:
            drawn_lp, picks = None, masked.argmax(dim=-1)
        for n, i in enumerate(live):
            r, token = rows[i], int(picks[n])
            drawn = float(drawn_lp[n, token]) if drawn_lp is not None else 0.0
            r.emit(token, float(own[n, token]), float(allowed[n, token]), drawn, forced=False)
            r.matcher.accept_token(token)
            if token in self.eos_ids or r.matcher.is_terminated():
                r.done, r.sample.finished = True, True
                continue
            if len(r.sample.token_ids) >= budget:
                r.done = True  # cut off: the text is not a whole plan
                continue
            r.chunk = [token]
            self._extend(r, self._forced(r), budget, drafted=False)
            if sampling.temperature == 0 and self.memory is not None:
                self._extend(r, self.memory.draft(r.context()), budget, drafted=True)

    def _forced(self, row: _Row) -> list[int]:
        """The tokens of the text the grammar forces next; the last token of the text is left to the model."""
        if not self.jump_forward:
            return []
        text = row.matcher.find_jump_forward_string()
        return self.tokenizer.encode(text, add_special_tokens=False)[:-1] if text else []

    def _extend(self, row: _Row, tokens: list[int], budget: int, *, drafted: bool) -> None:
        """Queues `tokens` after the row's chunk while its matcher accepts them and the budget allows,
        keeping the grammar's mask before each."""
        room = budget - len(row.sample.token_ids) - (len(row.chunk) - 1) - 1  # the model draws one more after
        for t in tokens[:max(room, 0)]:
            one = self.xgrammar.allocate_token_bitmask(1, self.vocab)
            row.matcher.fill_next_token_bitmask(one, 0)
            if t in self.eos_ids or not row.matcher.accept_token(t):
                break
            row.chunk.append(t)
            row.drafted.append(drafted)
            row.masks.append(one)

    def _check(self, row: _Row, logits) -> int:
        """Records the chunk's tokens after the first, each scored by the logits before it: a forced token
        is kept; a drafted one only when it is the model's own greedy choice, and the chunk ends before
        the first that is not (the matcher forgets it and what follows). Returns how many were kept."""
        torch = self.torch
        for k, token in enumerate(row.chunk[1:]):
            before = logits[k]
            masked = before.clone().unsqueeze(0)
            self.xgrammar.apply_token_bitmask_inplace(masked, row.masks[k].to(masked.device))
            if row.drafted[k] and int(masked.argmax()) != token:
                row.matcher.rollback(len(row.chunk) - 1 - k)
                return k + 1
            own = float(torch.log_softmax(before, dim=-1)[token])
            allowed = float(torch.log_softmax(masked[0], dim=-1)[token])
            row.emit(token, own, allowed, 0.0, forced=not row.drafted[k])
        return len(row.chunk)


class PlanMemory:
    """The token ids of recent plans, to draft from: a trained conductor writes much the same
    instructions again. A draft is what followed the longest recent match of the text's last tokens."""

    def __init__(self, size: int = 32, longest: int = 24) -> None:
        self._plans: deque[tuple[int, ...]] = deque(maxlen=size)
        self._longest = longest

    def add(self, token_ids: Sequence[int]) -> None:
        plan = tuple(token_ids)
        if plan and plan not in self._plans:
            self._plans.append(plan)

    def draft(self, context: Sequence[int]) -> list[int]:
        for n in (4, 3, 2):
            if len(context) < n:
                continue
            tail = tuple(context[-n:])
            for plan in reversed(self._plans):
                for at in range(len(plan) - n):
                    if plan[at:at + n] == tail:
                        return list(plan[at + n:at + n + self._longest])
        return []


def _warp(masked, sampling: Sampling):
    """Temperature, then top-k, then top-p (the order Transformers applies them), on masked logits."""
    import torch

    x = masked / sampling.temperature
    if sampling.top_k > 0:
        kth = torch.topk(x, min(sampling.top_k, x.shape[-1]), dim=-1).values[..., -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    if sampling.top_p < 1.0:
        ordered, index = torch.sort(x, dim=-1)
        cumulative = ordered.softmax(dim=-1).cumsum(dim=-1)
        drop = cumulative <= 1 - sampling.top_p
        drop[..., -1] = False  # the most likely token always stays
        x = x.masked_fill(drop.scatter(-1, index, drop), float("-inf"))
    return x
