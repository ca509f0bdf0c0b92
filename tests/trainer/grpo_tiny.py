"""A tiny randomly initialised Qwen2 conductor and its tokenizer, for GRPO tests on a CPU.

A random model never writes a parseable plan, so every sample of a group would score 0 and GRPO would
have nothing to learn from. The model is therefore first taught, in a few supervised steps, to answer
every prompt with a one-step plan naming any of the pool's workers: it then behaves like a small
instruct conductor, valid most of the time and undecided about the worker, which is where GRPO starts.
The tokenizer is a byte-level BPE with Qwen2's pre-tokenization, trained on the prompts, with the plan's fixed text as two tokens so
that those few steps suffice.
"""

from __future__ import annotations

import torch
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM
from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

from baton_conductor import render_plan

SUBTASK = "Answer the question."
PLAN_HEAD = '{"model_id": ['
PLAN_TAIL = render_plan([0], [SUBTASK], [[]])[len(PLAN_HEAD) + 1:]
# Qwen's chat layout, so prompts are rendered the way a real Qwen conductor sees them.
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def one_step_plan(worker: int) -> str:
    return render_plan([worker], [SUBTASK], [[]])


def tiny_tokenizer(texts: list[str], vocab_size: int = 1024) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    # Qwen2's own normaliser and pre-tokenizer: a directory holding a Qwen2 model reloads its tokenizer
    # as Qwen2Tokenizer, which installs these, so any other split would tokenize differently on reload.
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer)
    tok.add_tokens([PLAN_HEAD, PLAN_TAIL])
    out = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    out.chat_template = CHATML
    return out


def tiny_qwen2(tokenizer: PreTrainedTokenizerFast, seed: int = 0) -> Qwen2ForCausalLM:
    torch.manual_seed(seed)
    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                         tie_word_embeddings=True, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id, bos_token_id=None)
    model = Qwen2ForCausalLM(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


def prompt_ids(tokenizer, messages: list[dict]) -> list[int]:
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def warm_start(model, tokenizer, prompts: list[list[dict]], workers: int, *, steps: int = 30,
               lr: float = 1e-2) -> float:
    """Teach the model to answer each prompt with a one-step plan on any worker; return the last loss."""
    pairs = []
    for messages in prompts:
        head = prompt_ids(tokenizer, messages)
        for w in range(workers):
            plan = tokenizer(one_step_plan(w) + tokenizer.eos_token, add_special_tokens=False)["input_ids"]
            pairs.append((head, plan))
    width = max(len(a) + len(b) for a, b in pairs)
    ids = torch.full((len(pairs), width), tokenizer.pad_token_id)
    labels = torch.full((len(pairs), width), -100)
    mask = torch.zeros((len(pairs), width), dtype=torch.long)
    for k, (a, b) in enumerate(pairs):
        ids[k, :len(a) + len(b)] = torch.tensor(a + b)
        labels[k, len(a):len(a) + len(b)] = torch.tensor(b)
        mask[k, :len(a) + len(b)] = 1
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    loss = None
    for _ in range(steps):
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
    return float(loss.detach())


@torch.no_grad()
def worker_probabilities(model, tokenizer, messages: list[dict], workers: int) -> list[float]:
    """The model's probability of naming each worker, given the prompt and the plan's opening."""
    ids = prompt_ids(tokenizer, messages) + tokenizer(PLAN_HEAD, add_special_tokens=False)["input_ids"]
    logits = model(input_ids=torch.tensor([ids])).logits[0, -1]
    probs = torch.softmax(logits.float(), dim=-1)
    return [float(probs[tokenizer.convert_tokens_to_ids(str(w))]) for w in range(workers)]
