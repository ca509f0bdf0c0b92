"""GRPO for the LLM conductor: training data from episodes and replay matrices, the per-plan reward, and
a real (tiny) GRPO run on the CPU that produces a LoRA adapter."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from testbed import MMLU_PRO, default_config_data

from baton.v1 import common_pb2, requests_pb2
from baton_conductor import Prompter, render_plan
from baton_conductor.prompt import example_plan
from baton_platform.config import BatonConfig, load_config
from baton_platform.dataset import EPISODE_SCHEMA
from baton_policy.matrix import from_rows, read_rows
from baton_trainer.grpo_data import (
    OutcomeTable,
    build_prompts,
    load_training_data,
    outcomes_from_episodes,
    outcomes_from_matrix,
    query_key,
    read_episodes,
)
from baton_trainer.grpo_reward import INVALID, RIGHT, UNKNOWN, WRONG, PlanOutcomeReward

# Matrix columns of the default config's workers, in pool order (gemini-pro, gemini-flash, llama-70b).
COLUMNS = ["gemini-1.5-pro-002", "gemini-1.5-flash-002", "Meta-Llama-3_1-70B-Instruct"]
NAMES = ["gemini-pro", "gemini-flash", "llama-70b"]


def config_data(max_depth: int = 0) -> dict:
    data = default_config_data()
    # Short prompts keep the tiny model's sequences short; the prompt is otherwise the router's own.
    # The tiny model is warm-started over the three workers, so the conductor is not in its pool.
    data["conductor"].update(prompt_example=False, max_steps=3, max_subtask_chars=160, max_depth=max_depth)
    # No router's estimate: the tiny model's prompts stay short (GRPO shows the estimate when the config
    # sets one, as the router does; test_grpo_estimate.py).
    data["conductor"].pop("evidence", None)
    return data


@pytest.fixture(scope="module")
def config() -> BatonConfig:
    return BatonConfig(**config_data())


@pytest.fixture(scope="module")
def matrix_slice():
    """A few real MMLU-Pro questions on which only the strongest worker was right (plus recorded answers)."""
    header, rows = read_rows(MMLU_PRO)
    picked = [r for r in rows if len(r["prompt"]) < 400 and all(r[f"{c}|answer"] for c in COLUMNS)
              and [r[c] for c in COLUMNS] == ["1", "0", "0"]][:4]
    assert len(picked) == 4
    return header, picked


def episode(rid: str, query: str, steps: list[tuple[str, str | None, str | None]], *, grader: str | None = "choice",
            reference: str | None = None, quality: float | None = None) -> dict:
    """One logged episode; steps are (worker, output, error)."""
    plan = [{"worker": w, "instruction": "Answer the question."} for w, _, _ in steps]
    return {
        "request_id": rid, "group_id": rid, "candidate": 0, "group_size": 1, "policy": "baton",
        "query": query, "messages_json": json.dumps([{"role": "user", "content": query}]), "metadata_json": "{}",
        "plan_backend": "transformers", "plan_fallback": False, "plan_json": json.dumps(plan),
        "steps": [{"step": i, "worker": w, "model": w, "attempt": 1, "instruction": "Answer the question.",
                   "output": out, "input_tokens": 10, "output_tokens": 5, "cost_usd": 0.001 * (i + 1),
                   "latency_ms": 1.0, "error": err} for i, (w, out, err) in enumerate(steps)],
        "answer": steps[-1][1], "grader": grader if reference else None, "reference": reference, "quality": quality,
        "reward": quality,
    }


def write_episodes(root: Path, rows: list[dict]) -> Path:
    folder = root / "episodes" / "date=2026-11-02"
    folder.mkdir(parents=True)
    names = set(EPISODE_SCHEMA.names)
    table = pa.Table.from_pylist([{k: v for k, v in r.items() if k in names} for r in rows], schema=EPISODE_SCHEMA)
    pq.write_table(table, folder / "baton.responses-p0-000000000000-000000000099.parquet")
    # A file the reward logger is still writing is hidden; the reader must not see it.
    pq.write_table(table.slice(0, 1), folder / ".baton.responses-p0-000000000100-000000000100.parquet.tmp")
    return root


def logged_episodes(picked: list[dict]) -> list[dict]:
    """Each worker answered each question alone (its recorded MMLU-Pro answer), as the sim provider does."""
    rows = []
    for i, r in enumerate(picked):
        for name, col in zip(NAMES, COLUMNS):
            answer = f"The answer is ({r[f'{col}|answer']})."
            rows.append(episode(f"q{i}-{name}", r["prompt"], [(name, answer, None)], reference=r["answer"],
                                quality=float(r[col])))
    return rows


@pytest.fixture(scope="module")
def episodes_dir(tmp_path_factory, matrix_slice) -> Path:
    _, picked = matrix_slice
    return write_episodes(tmp_path_factory.mktemp("data"), logged_episodes(picked))


# ---------------------------------------------------------------- outcomes


def test_episode_outcomes_grade_every_step_and_skip_failures_and_duplicates(tmp_path, matrix_slice):
    _, picked = matrix_slice
    q, ref = picked[0]["prompt"], picked[0]["answer"]
    pro = f"The answer is ({picked[0][f'{COLUMNS[0]}|answer']})."
    flash = f"The answer is ({picked[0][f'{COLUMNS[1]}|answer']})."
    rows = logged_episodes(picked[:1])
    rows += [
        # A draft by the fast worker, checked by the strong one: both outputs are answers to grade.
        episode("two-step", q, [("gemini-flash", flash, None), ("gemini-pro", pro, None)], reference=ref),
        # A provider failure says nothing about what the worker knows.
        episode("failed", q, [("llama-70b", None, "HTTP 503 from the provider")], reference=ref, quality=0.0),
        episode("two-step", q, [("gemini-flash", flash, None), ("gemini-pro", pro, None)], reference=ref),
        # No reference: a one-step plan still credits its worker with the episode's quality ...
        episode("fed-back", "Name a prime number.", [("llama-70b", "7", None)], grader=None, quality=1.0),
        # ... a longer one cannot say which step deserved it.
        episode("fed-back-2", "Name an even prime.", [("llama-70b", "2", None), ("gemini-pro", "2", None)],
                grader=None, quality=1.0),
        # A conductor step's answer depends on the workflow before it: no outcome of its own.
        episode("recursive", q, [("gemini-pro", pro, None), ("conductor", pro, None)], reference=ref),
    ]
    table = outcomes_from_episodes(read_episodes(write_episodes(tmp_path, rows)), NAMES)
    key = query_key(q)
    assert query_key("  " + q.upper() + "\n") == key
    assert table.get(key, "gemini-pro").quality == 1.0 and table.get(key, "gemini-pro").runs == 3
    assert table.get(key, "conductor") is None
    assert table.get(key, "gemini-flash").quality == 0.0 and table.get(key, "gemini-flash").runs == 2
    assert table.get(key, "llama-70b").runs == 1  # the failed run is not counted
    assert table.get(key, "gemini-pro").cost_usd == pytest.approx((0.001 + 0.002 + 0.001) / 3)
    assert table.spread(key)
    assert table.get(query_key("Name a prime number."), "llama-70b").quality == 1.0
    assert table.known(query_key("Name an even prime.")) == {}
    finals = outcomes_from_episodes(read_episodes(tmp_path), NAMES, intermediate=False)
    assert finals.get(key, "gemini-flash").runs == 1 and finals.get(key, "gemini-pro").runs == 3


def test_matrix_outcomes_map_workers_to_columns_and_price_characters(config, matrix_slice):
    header, picked = matrix_slice
    matrix = from_rows(header, picked)
    table = outcomes_from_matrix(matrix, config.workers)
    for r in picked:
        key = query_key(r["prompt"])
        assert [table.get(key, n).quality for n in NAMES] == [1.0, 0.0, 0.0]
        pro = config.worker("gemini-pro").price
        expected = pro.cost(len(r["prompt"]) // 4, int(float(r[f"{COLUMNS[0]}|output_chars"])) // 4)
        assert table.get(key, "gemini-pro").cost_usd == pytest.approx(expected)
    # A sim worker reads the column its config names, not its model's.
    data = config_data()
    data["workers"][2]["sim"]["column"] = "Yi-34B"
    other = outcomes_from_matrix(matrix, BatonConfig(**data).workers)
    assert [other.get(query_key(r["prompt"]), "llama-70b").quality for r in picked] == [float(r["Yi-34B"]) for r in picked]
    pooled = table.merge(table)
    assert pooled.get(query_key(picked[0]["prompt"]), "gemini-pro").runs == 2


# ---------------------------------------------------------------- prompts


def test_prompts_are_the_routers_own_and_only_for_queries_with_outcomes(config, matrix_slice, episodes_dir):
    data = load_training_data(config, episodes=episodes_dir)
    _, picked = matrix_slice
    assert [r["query"] for r in data.prompts.rows] == [r["prompt"] for r in picked]
    assert data.prompts.worker_names == NAMES and data.prompts.bounds.pool_size == 3
    prompter = Prompter(config.conductor, config.workers)
    for row, r in zip(data.prompts.rows, picked):
        request = requests_pb2.ChatRequest(messages=[common_pb2.ChatMessage(role="user", content=r["prompt"])])
        assert row["prompt"] == prompter.messages(request)
        assert row["query_key"] == query_key(r["prompt"])
        text = json.dumps(row["prompt"])
        assert "Model 0: " in text and not any(n in text for n in NAMES)
    # Repeated questions give one prompt; a question no worker has an outcome on gives none.
    convs = [[{"role": "user", "content": picked[0]["prompt"]}]] * 2 + [[{"role": "user", "content": "Unseen?"}]]
    assert [r["query"] for r in build_prompts(convs, config, outcomes=data.outcomes).rows] == [picked[0]["prompt"]]
    assert len(build_prompts(convs, config)) == 2
    # Queries where every worker did the same teach nothing about the choice of worker.
    agreed = OutcomeTable(NAMES)
    for name in NAMES:
        agreed.add("All right here?", name, 1.0)
    merged = data.outcomes.merge(agreed)
    convs = [[{"role": "user", "content": "All right here?"}], [{"role": "user", "content": picked[1]["prompt"]}]]
    assert len(build_prompts(convs, config, outcomes=merged)) == 2
    assert [r["query"] for r in build_prompts(convs, config, outcomes=merged, spread_only=True).rows] == \
        [picked[1]["prompt"]]


# ---------------------------------------------------------------- reward


def test_the_reward_scores_each_plan_by_its_own_logged_outcome(matrix_slice):
    header, picked = matrix_slice
    config = BatonConfig(**config_data(max_depth=1))  # the pool ends with the conductor, index 3
    table = outcomes_from_matrix(from_rows(header, picked), config.workers)
    prompts = build_prompts([[{"role": "user", "content": r["prompt"]}] for r in picked], config, outcomes=table)
    reward = PlanOutcomeReward(table, prompts.worker_names, prompts.bounds)
    key = prompts.rows[0]["query_key"]
    group = [
        render_plan([0], ["Answer."], [[]]),  # the worker that was right
        render_plan([1], ["Answer."], [[]]),  # a worker that was wrong
        render_plan([1, 0], ["Draft.", "Check and answer."], [[], [0]]),  # right worker gives the answer
        render_plan([0, 2], ["Draft.", "Answer."], [[], "all"]),  # wrong worker gives the answer
        "Model 0 should answer this.",  # not JSON
        render_plan([7], ["Answer."], [[]]),  # no such worker
        render_plan([0, 1], ["Answer.", "Answer."], [[1], []]),  # reads a later step
        json.dumps({"model_id": [0, 1], "subtasks": ["Answer."], "access_list": [[]]}),  # unequal lists
        render_plan([0, 3], ["Answer.", "Check."], [[], [0]]),  # then the conductor: scored as keeping it
        render_plan([1, 3], ["Answer.", "Check."], [[], [0]]),
    ]
    scores = reward(completions=group, query_key=[key] * len(group))
    assert scores == [RIGHT, WRONG, RIGHT, WRONG, INVALID, INVALID, INVALID, INVALID, RIGHT, WRONG]
    assert statistics.pstdev(scores) > 0  # the group has spread: GRPO gets advantages
    # The prompt's worked example, copied: its last worker was right on this query, but it would be told
    # to work on the example's arithmetic, so the plan earns what an invalid one does.
    copied = example_plan(3, 3)
    assert json.loads(copied)["model_id"][-1] == 0
    assert reward.judge(copied, key).reason == "copied" and reward(completions=[copied], query_key=[key]) == [INVALID]
    # Chat prompts give chat completions.
    chat = [[{"role": "assistant", "content": group[0]}], [{"role": "assistant", "content": group[1]}]]
    assert reward(completions=chat, query_key=[key, key]) == [RIGHT, WRONG]
    # The same plan scores differently on a query where it was wrong: the reward is per plan AND query.
    unseen = OutcomeTable(NAMES)
    unseen.add(picked[0]["prompt"], "gemini-flash", 1.0, 0.002)
    flipped = PlanOutcomeReward(unseen, prompts.worker_names, prompts.bounds)
    assert flipped(completions=group[:2], query_key=[key, key]) == [UNKNOWN, RIGHT]
    assert WRONG < UNKNOWN < RIGHT
    # Costs: each step priced at its worker's logged cost on this query.
    priced = PlanOutcomeReward(table, prompts.worker_names, prompts.bounds, cost_weight=100.0)
    one, two = priced(completions=[group[0], group[2]], query_key=[key, key])
    pro, flash = table.get(key, "gemini-pro").cost_usd, table.get(key, "gemini-flash").cost_usd
    assert one == pytest.approx(RIGHT - 100.0 * pro)
    assert two == pytest.approx(RIGHT - 100.0 * (pro + flash))
    with pytest.raises(ValueError, match="query_key"):
        reward(completions=group)


# ---------------------------------------------------------------- training


@pytest.mark.slow
def test_grpo_cli_trains_a_lora_adapter_that_loads_and_prefers_the_right_worker(tmp_path, config, episodes_dir):
    pytest.importorskip("trl")
    pytest.importorskip("peft")
    import torch
    from grpo_tiny import tiny_qwen2, tiny_tokenizer, warm_start, worker_probabilities
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from baton_trainer.__main__ import main

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the tiny model gains nothing from threads and the machine is shared
    try:
        data = load_training_data(config, episodes=episodes_dir)
        prompts = [r["prompt"] for r in data.prompts.rows]
        tokenizer = tiny_tokenizer([m["content"] for p in prompts for m in p])
        model = tiny_qwen2(tokenizer, seed=0)
        assert warm_start(model, tokenizer, prompts, workers=3, steps=60) < 0.35
        base_dir = tmp_path / "base"
        model.save_pretrained(base_dir)
        tokenizer.save_pretrained(base_dir)
        tok = AutoTokenizer.from_pretrained(base_dir)
        text = tokenizer.apply_chat_template(prompts[0], add_generation_prompt=True, tokenize=False)
        assert tok(text)["input_ids"] == tokenizer(text)["input_ids"]  # the trainer sees what we trained on
        cfg_path = tmp_path / "baton.yaml"
        cfg_path.write_text(yaml.safe_dump(config_data()))
        assert load_config(cfg_path).conductor.prompt_example is False

        out = tmp_path / "out"
        code = main(["grpo", "--episodes", str(episodes_dir), "--config", str(cfg_path), "--model", str(base_dir),
                     "--out", str(out), "--steps", "3", "--num-generations", "4", "--learning-rate", "0.01",
                     "--lora-r", "8", "--max-completion-length", "6", "--constraint", "none", "--seed", "0",
                     "--cpu"])
        assert code == 0
        adapter = out / "adapter"
        assert (adapter / "adapter_config.json").is_file() and (adapter / "adapter_model.safetensors").is_file()
        manifest = json.loads((adapter / "baton_grpo.json").read_text())
        assert manifest["worker_names"] == NAMES and manifest["steps"] == 3
        assert manifest["reward_std_mean"] > 0  # groups had spread, so the steps had advantages

        base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
        tuned = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32), adapter)
        tuned.eval()

        # Every training question was answered right only by worker 0: GRPO moves the choice toward it.
        def share_of_worker_0(m) -> float:
            probs = [worker_probabilities(m, tok, p, 3) for p in prompts]
            return statistics.mean(p[0] / sum(p) for p in probs)

        before, after = share_of_worker_0(base), share_of_worker_0(tuned)
        assert abs(before - 1 / 3) < 0.1  # the warm start left the choice open
        assert after > before
        # The adapted model still writes plans the router would run.
        ids = tok.apply_chat_template(prompts[0], add_generation_prompt=True, return_tensors="pt", return_dict=True)
        generated = tuned.generate(**ids, max_new_tokens=6, do_sample=False)
        text = tok.decode(generated[0, ids["input_ids"].shape[1]:], skip_special_tokens=True)
        reward = PlanOutcomeReward(data.outcomes, data.prompts.worker_names, data.prompts.bounds)
        assert reward.judge(text, data.prompts.rows[0]["query_key"]).reason == "known", text
        assert math.isfinite(float(tuned(**ids).logits.float().abs().max()))
        serve_the_adapter(config, base_dir, adapter, base, tuned, ids)
        resume_the_adapter(tmp_path, episodes_dir, cfg_path, base_dir, adapter)
        table_with_the_adapter(tmp_path, cfg_path, base_dir, adapter)

        # Sampled under the router's grammar (the default), every sample is a plan the router would run.
        # A time limit ends training after the step that passes it, and the adapter is still saved.
        code = main(["grpo", "--episodes", str(episodes_dir), "--config", str(cfg_path), "--model", str(base_dir),
                     "--out", str(tmp_path / "constrained"), "--steps", "50", "--time-limit", "0.001",
                     "--num-generations", "4", "--lora-r", "8", "--max-completion-length", "96", "--seed", "0",
                     "--cpu", "--quiet"])
        assert code == 0
        manifest = json.loads((tmp_path / "constrained" / "adapter" / "baton_grpo.json").read_text())
        assert manifest["constraint"] == "grammar" and manifest["valid_first"] == 1.0
        assert (manifest["steps"], manifest["step_limit"]) == (1, 50)
    finally:
        torch.set_num_threads(threads)


def resume_the_adapter(tmp_path, episodes_dir, cfg_path, base_dir, adapter) -> None:
    """`--resume` goes on from the saved adapter's weights, and its manifest adds up both runs' steps and
    seconds; an adapter trained on another pool order is refused."""
    import torch
    from safetensors.torch import load_file

    from baton_trainer.__main__ import main

    def resume(source, out, learning_rate: str) -> int:
        return main(["grpo", "--episodes", str(episodes_dir), "--config", str(cfg_path), "--model", str(base_dir),
                     "--out", str(out), "--steps", "1", "--num-generations", "4", "--learning-rate", learning_rate,
                     "--max-completion-length", "6", "--constraint", "none", "--seed", "1", "--cpu", "--quiet",
                     "--resume", str(source)])

    first = json.loads((adapter / "baton_grpo.json").read_text())
    # With a zero learning rate the step moves nothing, so the saved weights are the resumed ones (a fresh
    # adapter starts with random A matrices and zero B matrices).
    assert resume(adapter, tmp_path / "resumed", "0") == 0
    saved, resumed = load_file(adapter / "adapter_model.safetensors"), load_file(
        tmp_path / "resumed" / "adapter" / "adapter_model.safetensors")
    assert saved.keys() == resumed.keys() and any(t.abs().max() > 0 for k, t in saved.items() if "lora_B" in k)
    assert all(torch.equal(saved[k], resumed[k]) for k in saved)
    manifest = json.loads((tmp_path / "resumed" / "adapter" / "baton_grpo.json").read_text())
    assert manifest["steps"] == first["steps"] + 1 and manifest["resumed_from"] == str(adapter)
    assert manifest["train_seconds"] > first["train_seconds"]

    other = tmp_path / "other-pool"
    other.mkdir()
    for f in adapter.iterdir():
        (other / f.name).write_bytes(f.read_bytes())
    (other / "baton_grpo.json").write_text(json.dumps({**first, "worker_names": list(reversed(NAMES))}))
    assert resume(other, tmp_path / "refused", "0") == 2
    assert not (tmp_path / "refused" / "adapter").exists()


def serve_the_adapter(config, base_dir, adapter, base, tuned, ids) -> None:
    """The router's CPU conductor serves the adapter as trained: its model computes what the trained
    model does (the adapter merged into the weights), and a pool in another order is refused."""
    import asyncio

    import torch

    from baton_router.conductor import build_backend
    from baton_router.conductor.llm import ConductorUnavailable

    def served(workers: list[dict]):
        data = config_data()
        data["workers"] = workers
        data["conductor"].update(backend="transformers", transformers={"model_path": str(base_dir), "adapter": str(adapter), "temperature": 0})
        cfg = BatonConfig(**data)
        return build_backend(cfg.conductor, cfg.workers)

    backend = served(config_data()["workers"])
    asyncio.run(backend.start())
    try:
        merged = backend._loaded.model
        assert backend._loaded.version == "base+out"
        with torch.inference_mode():
            want, got, plain = (m(**ids).logits for m in (tuned, merged, base))
        assert torch.allclose(got, want, atol=1e-4)
        assert not torch.allclose(got, plain, atol=1e-4)  # the adapter changed what the model computes
    finally:
        asyncio.run(backend.aclose())
    reordered = served(list(reversed(config_data()["workers"])))
    with pytest.raises(ConductorUnavailable, match="trained for the pool"):
        asyncio.run(reordered.start())


def table_with_the_adapter(tmp_path, cfg_path, base_dir, adapter) -> None:
    """`baton eval table` compares every router on the same held-out rows, the adapter included."""
    import csv
    import io
    from contextlib import redirect_stdout

    from baton_eval.conductor_table import main as table_main

    header, rows = read_rows(MMLU_PRO)
    train, held_out = rows[:300], rows[300:]
    seen = {r["prompt"].strip() for r in train}
    held_out = [r for r in held_out if r["prompt"].strip() not in seen][:6]
    for name, part in (("train.csv", train), ("test.csv", held_out)):
        with (tmp_path / name).open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=header)
            writer.writeheader()
            writer.writerows(part)
    report = tmp_path / "table"
    out = io.StringIO()
    with redirect_stdout(out):
        code = table_main(["--config", str(cfg_path), "--train", str(tmp_path / "train.csv"), "--test",
                           str(tmp_path / "test.csv"), "--rows", "6", "--model", str(base_dir), "--adapter",
                           f"GRPO={adapter}", "--latency-rows", "2", "--report", str(report), "--json"])
    assert code == 0, out.getvalue()
    result = json.loads(out.getvalue())
    table = result["table"]
    names = list(table)
    assert names[0] == "static plan" and names[1].startswith("best single (")
    assert names[2:4] == ["fast policy (W=0)", "fast policy as served (W=0)"]
    assert names[-2:] == ["LLM conductor, untrained", "LLM conductor, GRPO"]
    # The fast policy as served within the best single worker's cost, where some cost weight keeps it there.
    assert all(n.startswith("fast policy as served, at most ") for n in names[4:-2]) and len(names) <= 7
    pro = statistics.mean(float(r["gemini-1.5-pro-002"]) for r in held_out)
    assert table["static plan"]["accuracy"] == pytest.approx(pro, abs=1e-4)  # its last step is gemini-pro
    for name in ("LLM conductor, untrained", "LLM conductor, GRPO"):
        row = table[name]
        assert 0 < row["plan_ms_p50"] <= row["plan_ms_p99"]  # two plans timed, asked one at a time
        assert 0 <= row["own_accuracy"] <= row["accuracy"] <= 1
        assert row["valid_share"] == 1.0  # the router's grammar: every plan parses and passes its rules
        assert row["calls_per_query"] >= 1
    assert {p.name for p in report.iterdir()} == {"result.json", "table.md", "cost_quality.png"}
    # A test file that shares a question with the training file is refused, not scored.
    with redirect_stdout(io.StringIO()) as refused:
        code = table_main(["--config", str(cfg_path), "--train", str(tmp_path / "train.csv"), "--test",
                           str(tmp_path / "train.csv"), "--rows", "2"])
    assert code == 2 and "share" in refused.getvalue()
