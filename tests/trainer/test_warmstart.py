"""The conductor's warm start: targets from an outcome matrix, and a real (tiny) fine-tuning run on the CPU
whose adapter then chooses, on questions it never saw, the worker each question's group is best served by."""

from __future__ import annotations

import csv
import json

import pytest
import yaml
from test_grpo import COLUMNS, NAMES, config_data
from testbed import MMLU_PRO

from baton_conductor import Prompter
from baton_platform.config import BatonConfig, load_config
from baton_policy.matrix import COST_TOTAL, from_rows, read_rows
from baton_trainer.warmstart import INSTRUCTION, examples, group_targets

# Two groups a word tells apart: worker 0 is right on every fruit question, worker 1 on every planet one.
# Questions name their group's word, so a question about an unseen fruit still says it is one.
FRUITS = ["apple", "pear", "plum", "cherry", "mango", "lemon", "peach", "grape", "melon", "kiwi"]
PLANETS = ["mars", "venus", "saturn", "jupiter", "mercury", "neptune", "uranus", "pluto", "earth", "ceres"]


def matrix_rows(words: list[str], group: str, right: int, start: int) -> list[dict[str, str]]:
    rows = []
    for i, word in enumerate(words):
        row = {"sample_id": str(start + i), "eval_name": group, "prompt": question(word, group)}
        for j, column in enumerate(COLUMNS):
            row[column] = "1" if j == right else "0"
            row[f"{column}|{COST_TOTAL}"] = "0.001"
        rows.append(row)
    return rows


def question(word: str, group: str) -> str:
    return f"Tell me about the {group} called {word}, please."


def header() -> list[str]:
    return ["sample_id", "eval_name", "prompt", *COLUMNS, *(f"{c}|{COST_TOTAL}" for c in COLUMNS)]


def test_a_groups_target_is_its_best_worker_and_the_cost_weight_prefers_the_cheaper_of_two_close_ones():
    rows = [{"sample_id": str(i), "eval_name": "g", "prompt": f"q{i}",
             COLUMNS[0]: "1" if i < 9 else "0", COLUMNS[1]: "1" if i < 8 else "0", COLUMNS[2]: "0",
             f"{COLUMNS[0]}|{COST_TOTAL}": "0.01", f"{COLUMNS[1]}|{COST_TOTAL}": "0.001",
             f"{COLUMNS[2]}|{COST_TOTAL}": "0.0001"} for i in range(10)]
    matrix = from_rows(header(), rows)
    assert group_targets(matrix, cost_weight=0.0) == {"g": COLUMNS[0]}  # 0.9 right against 0.8
    # W = 0.5: 0.9 - 0.5 * 1 < 0.8 - 0.5 * 0.1; the cheapest worker is never right, so never the target.
    assert group_targets(matrix, cost_weight=0.5) == {"g": COLUMNS[1]}


def test_examples_are_the_routers_prompts_with_a_one_step_plan_on_the_groups_target():
    config = BatonConfig(**config_data())
    matrix = from_rows(header(), matrix_rows(FRUITS, "fruit", 0, 0) + matrix_rows(PLANETS, "planet", 1, 100))
    prompter, items, targets, fitted = examples(config, matrix, cost_weight=0.0, limit=None, seed=0)
    assert fitted is None
    assert targets == {"fruit": NAMES[0], "planet": NAMES[1]}
    assert len(items) == 20 and prompter.worker_names == NAMES
    for item in items:
        assert item.messages[0]["role"] == "system" and "Model 0:" in item.messages[0]["content"]
        want = 0 if any(w in item.messages[1]["content"] for w in FRUITS) else 1
        assert json.loads(item.target) == {"model_id": [want], "subtasks": [INSTRUCTION], "access_list": [[]]}
    # Rows are taken from each target worker in turn, whatever the groups' sizes.
    uneven = from_rows(header(), matrix_rows(FRUITS, "fruit", 0, 0) + matrix_rows(PLANETS[:2], "planet", 1, 100))
    assert [e.worker for e in examples(config, uneven, cost_weight=0.0, limit=4, seed=0)[1]].count(NAMES[1]) == 2
    assert len(examples(config, uneven, cost_weight=0.0, limit=None, seed=0)[1]) == 12


def test_with_the_estimate_a_questions_target_is_the_worker_it_puts_first_and_its_prompt_shows_it():
    config = BatonConfig(**config_data())
    words = [f"{w}{k}" for k in range(3) for w in FRUITS]
    stars = [f"{w}{k}" for k in range(3) for w in PLANETS]
    matrix = from_rows(header(), matrix_rows(words, "fruit", 0, 0) + matrix_rows(stars, "planet", 1, 100))
    prompter, items, groups, fitted = examples(config, matrix, cost_weight=0.0, limit=None, seed=0, evidence=True)
    assert groups is None and fitted.workers == NAMES
    assert len(items) == 60
    first = 0
    for item in items:
        user = item.messages[1]["content"]
        shown = user.split("The router's estimate of each model's chance to answer right: ")[1]
        assert shown.startswith(f"Model {prompter.worker_names.index(item.worker)} ")
        want = 0 if any(w in user for w in FRUITS) else 1
        first += json.loads(item.target)["model_id"] == [want]
    # Out of fold, from the text alone, the estimate puts each group's worker first.
    assert first >= 54, first


@pytest.mark.slow
def test_the_warm_start_cli_trains_an_adapter_on_the_shared_prefix_as_the_whole_model_computes_it(tmp_path):
    pytest.importorskip("peft")
    import torch
    from grpo_tiny import SUBTASK, tiny_qwen2, tiny_tokenizer
    from grpo_tiny import warm_start as format_warm_start
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from baton_trainer.__main__ import main
    from baton_trainer.warmstart import _Stack, _tokenize

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the tiny model gains nothing from threads and the machine is shared
    try:
        config = BatonConfig(**config_data())
        seen, unseen = (FRUITS[:7], PLANETS[:7]), (FRUITS[7:], PLANETS[7:])
        train_rows = matrix_rows(seen[0], "fruit", 0, 0) + matrix_rows(seen[1], "planet", 1, 100)
        test_rows = matrix_rows(unseen[0], "fruit", 0, 200) + matrix_rows(unseen[1], "planet", 1, 300)
        # The instruction the tiny tokenizer keeps as one token (see grpo_tiny), so a few steps suffice.
        _, items, _, _ = examples(config, from_rows(header(), train_rows + test_rows), cost_weight=0.0, limit=None, seed=0,
                               instruction=SUBTASK)
        tokenizer = tiny_tokenizer([m["content"] for e in items for m in e.messages] + [e.target for e in items])
        base = tiny_qwen2(tokenizer, seed=0)
        # Like an instruct model, the base writes one-step plans and has no preference among the workers.
        assert format_warm_start(base, tokenizer, [e.messages for e in items], workers=3, steps=60) < 0.35
        base_dir = tmp_path / "base"
        base.save_pretrained(base_dir)
        tokenizer.save_pretrained(base_dir)

        # The hand-run layers with the shared prefix cached compute what the whole model computes.
        prefix, rest, _, _ = _tokenize(tokenizer, items[:3])
        stack = _Stack(base)
        with torch.inference_mode():
            _, cache = stack.prefix_cache(stack.decoder.layers, stack.decoder.embed_tokens(torch.tensor([prefix])))
            ids = torch.tensor([rest[0]])
            out = stack.run(stack.decoder.layers, stack.decoder.embed_tokens(ids), torch.ones_like(ids),
                            stack.expanded(cache, range(len(stack.decoder.layers)), 1), len(prefix))
            want = base(input_ids=torch.tensor([prefix + rest[0]])).logits[0, len(prefix):]
        assert torch.allclose(stack.head(stack.decoder.norm(out))[0], want, atol=1e-4)

        with (tmp_path / "train.csv").open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=header())
            writer.writeheader()
            writer.writerows(train_rows)
        cfg_path = tmp_path / "baton.yaml"
        cfg_path.write_text(yaml.safe_dump(config_data()))
        out_dir = tmp_path / "warm"
        code = main(["warm-start", "--config", str(cfg_path), "--matrix", str(tmp_path / "train.csv"),
                     "--model", str(base_dir), "--out", str(out_dir), "--layers", "2", "--epochs", "10",
                     "--batch-size", "7", "--learning-rate", "0.01", "--lora-r", "8", "--seed", "0",
                     "--instruction", SUBTASK])
        assert code == 0
        adapter = out_dir / "adapter"
        manifest = json.loads((adapter / "baton_grpo.json").read_text())
        assert manifest["method"] == "warm-start" and manifest["worker_names"] == NAMES
        assert manifest["group_targets"] == {"fruit": NAMES[0], "planet": NAMES[1]}
        assert manifest["train_loss"][-1] < manifest["train_loss"][0]

        tuned = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32), adapter)
        tuned.eval()
        served = load_config(cfg_path)
        messages = Prompter(served.conductor, served.workers).chat_messages(question(unseen[0][0], "fruit"))
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
        generated = tuned.generate(**ids, max_new_tokens=6, do_sample=False)
        text = tokenizer.decode(generated[0, ids["input_ids"].shape[1]:], skip_special_tokens=True)
        assert json.loads(text)["subtasks"] == [SUBTASK]  # the adapted model still writes the target's plans
    finally:
        torch.set_num_threads(threads)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_real_conductor_learns_to_route_unseen_questions_by_their_subject():
    """SmolLM2-135M, warm-started on 32 MMLU-Pro questions whose target is gemini-flash for math and
    gemini-pro for law, then asked 16 questions it never saw: it names each subject's worker."""
    pytest.importorskip("peft")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from baton_router.conductor.transformers_backend import packaged_gguf
    from baton_trainer.warmstart import train

    header_, rows = read_rows(MMLU_PRO)
    pick = {subject: [r for r in rows if r["eval_name"] == f"mmlu-pro.{subject}" and len(r["prompt"]) < 500][:24]
            for subject in ("math", "law")}
    right = {"math": 1, "law": 0}  # gemini-flash, gemini-pro (the pool's order)

    def as_rows(subject: str, part: slice) -> list[dict[str, str]]:
        return [{**r, **{c: "1" if j == right[subject] else "0" for j, c in enumerate(COLUMNS)}}
                for r in pick[subject][part]]

    data = config_data()
    data["conductor"]["max_query_chars"] = 300
    config = BatonConfig(**data)
    train_matrix = from_rows(header_, as_rows("math", slice(16)) + as_rows("law", slice(16)), models=COLUMNS)
    prompter, items, targets, _ = examples(config, train_matrix, cost_weight=0.0, limit=None, seed=0)
    assert targets == {"mmlu-pro.math": NAMES[1], "mmlu-pro.law": NAMES[0]}
    directory, gguf = packaged_gguf()
    tokenizer = AutoTokenizer.from_pretrained(str(directory), gguf_file=gguf)
    model = AutoModelForCausalLM.from_pretrained(str(directory), gguf_file=gguf, dtype=torch.float32)
    digits = [tokenizer.convert_tokens_to_ids(str(w)) for w in range(3)]

    @torch.no_grad()
    def choices(m) -> list[int]:
        out = []
        for subject in ("math", "law"):
            for r in pick[subject][16:]:
                text = tokenizer.apply_chat_template(prompter.chat_messages(r["prompt"]), tokenize=False,
                                                     add_generation_prompt=True) + '{"model_id": ['
                logits = m(**tokenizer(text, return_tensors="pt", add_special_tokens=False)).logits[0, -1]
                out.append(int(torch.argmax(logits[digits])) == right[subject])
        return out

    before = choices(model)
    tuned, losses = train(model, tokenizer, items, layers=4, epochs=4, batch_size=8, learning_rate=1e-3, seed=0)
    after = choices(tuned)
    assert losses[-1] < losses[0]
    # Unseen questions of both subjects go to their subject's worker; the untrained model guessed.
    assert sum(after) >= 14 and sum(after[:8]) >= 6 and sum(after[8:]) >= 6, (before, after)
    assert sum(after) > sum(before)
