"""`make train-demo`: the learning loop, end to end, on sim workers.

1. Traffic with exploration: the `policy` conductor starts with no policy and picks a worker
   uniformly at random (logging each choice's propensity); the reward logger grades every answer.
2. Training: the fast policy learns from those episodes; the gate compares it with the uniform
   policy off-policy on held-back episodes and publishes it only if it is better.
3. Rollout: the routers load it from baton.policy without restarting.
4. Fresh traffic (questions never seen in training) shows how the new policy does, against uniform
   routing on the same fresh questions. That is computed exactly rather than sent: a sim worker
   answers as its model column of the matrix records, so uniform routing gets a fresh question
   right with probability the mean of the workers' recorded scores on it. The report checks that
   claim on the fresh answers themselves (each one-worker answer graded as that worker's score).
"""

from __future__ import annotations

import csv
import hashlib
import shutil
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import yaml
from tqdm import tqdm

from baton_tools.procs import free_port
from baton_tools.stack import REPO_ROOT, Stack

# One strong, dear model and three small cheap ones: the policy has to learn which to trust.
WORKERS = [  # name, matrix column, price per Mtok (in, out)
    ("gemini-pro", "gemini-1.5-pro-002", 1.25, 5.0),
    ("yi-6b", "Yi-6B", 0.05, 0.1),
    ("llama2-13b", "Llama-2-13b-hf", 0.1, 0.2),
    ("llama2-7b", "Llama-2-7b-hf", 0.05, 0.1),
]


EVAL_SET = "mmlu_pro"


def demo_config(dataset: Path, data_dir: Path) -> dict:
    return {
        "workers": [{"name": n, "provider": "sim", "model": m, "sim": {"dataset": str(dataset), "latency_ms": 5},
                     "limits": {"concurrency": 32}, "price": {"input_per_mtok": pi, "output_per_mtok": po}}
                    for n, m, pi, po in WORKERS],
        "conductor": {"backend": "policy", "policy": {"epsilon": 0.1}},
        "kafka": {"partitions": 4, "session_timeout_ms": 6000, "heartbeat_interval_ms": 1000},
        # The matrix is also the evaluation set: requests name an item, the reward logger grades it.
        "reward_logger": {"flush_interval_s": 0.5, "reward_scheme": "quality_minus_cost",
                          "eval_sets": {EVAL_SET: {"path": str(dataset), "grader": "choice"}}},
        "gateway": {"auth": "none"},  # local, on loopback
    }


def questions(dataset: Path) -> tuple[list[dict], list[dict]]:
    """Training and fresh questions, split by a hash of the question so the split never moves."""
    csv.field_size_limit(sys.maxsize)
    with dataset.open(newline="", encoding="utf-8") as f:
        rows = [r for r in csv.DictReader(f) if r.get("answer")]
    train: list[dict[str, str]] = []
    fresh: list[dict[str, str]] = []
    for r in rows:
        h = int.from_bytes(hashlib.blake2b(r["prompt"].encode(), digest_size=8).digest(), "big") / 2**64
        (fresh if h < 0.3 else train).append(r)
    return train, fresh


def ask_all(client: openai.OpenAI, rows: list[dict], label: str, workers: int = 8) -> list[dict]:
    from baton_graders import grade

    def ask(r):
        c = client.chat.completions.create(
            model="baton", messages=[{"role": "user", "content": r["prompt"]}],
            metadata={"baton_eval": f"{EVAL_SET}:{r['sample_id']}", "eval_name": r["eval_name"]})
        info = c.model_extra["baton"]
        return {"right": grade("choice", c.choices[0].message.content, r["answer"]).score,
                "cost": info["cost_usd"], "calls": info["calls"], "version": info["plan"]["policy_version"],
                "workers": [s["worker"] for s in info["plan"]["steps"]]}

    with ThreadPoolExecutor(workers) as pool:
        return list(tqdm(pool.map(ask, rows), total=len(rows), desc=label, unit="q", file=sys.stderr))


def summary(results: list[dict]) -> dict:
    n = len(results)
    return {"questions": n, "accuracy": sum(r["right"] for r in results) / n,
            "cost_per_query": sum(r["cost"] for r in results) / n, "calls_per_query": sum(r["calls"] for r in results) / n}


def best_single(dataset: Path, rows: list[dict]) -> dict:
    """Each worker's accuracy on the same fresh questions, from the matrix: the bar to clear."""
    return {name: sum(float(r[col] or 0) for r in rows) / len(rows) for name, col, *_ in WORKERS}


def uniform_chances(rows: list[dict]) -> list[float]:
    """Per question, the chance that uniform routing (one worker, each with 1/K) answers it right:
    the mean of the workers' recorded scores, which the sim workers answer by."""
    return [sum(float(r[col] or 0) for _, col, *_ in WORKERS) / len(WORKERS) for r in rows]


def chance_uniform_does_as_well(chances: list[float], right: float) -> float:
    """P(uniform routing gets at least ``right`` of these questions right): the upper tail of the
    sum of independent Bernoulli(chance) draws, computed exactly."""
    import numpy as np

    dist = np.ones(1)  # dist[k]: P(k right among the questions so far)
    for p in chances:
        dist = np.append(dist * (1 - p), 0.0) + np.append(0.0, dist * p)
    return float(min(1.0, dist[int(np.ceil(right - 1e-9)):].sum()))


def matrix_agreement(rows: list[dict], results: list[dict]) -> tuple[int, int]:
    """Of the answers given by one worker alone, how many were graded as the matrix records that
    worker's score on the question: (agreeing, one-worker answers)."""
    column = {name: col for name, col, *_ in WORKERS}
    alone = [(r, res) for r, res in zip(rows, results) if len(set(res["workers"])) == 1]
    return sum(res["right"] == float(r[column[res["workers"][0]]] or 0) for r, res in alone), len(alone)


def wait_for_version(router_port: int, version: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = httpx.get(f"http://127.0.0.1:{router_port}/metrics", timeout=2).text
        if f'version="{version}"' in text:
            return
        time.sleep(0.3)
    raise TimeoutError(f"the router did not load policy {version}")


def run_train_demo(run_dir: Path, n_train: int = 500, n_fresh: int = 200, out=print) -> dict:
    dataset = REPO_ROOT / "data" / "routing" / "mmlu_pro_dev.csv"
    shutil.rmtree(run_dir, ignore_errors=True)  # each run starts from no policy and no episodes
    run_dir.mkdir(parents=True)
    cfg = run_dir / "baton.yaml"
    cfg.write_text(yaml.safe_dump(demo_config(dataset, run_dir / "data")))
    train_rows, fresh_rows = questions(dataset)
    train_rows, fresh_rows = train_rows[:n_train], fresh_rows[:n_fresh]
    stack = Stack(run_dir / "stack", config_file=cfg, gateway_port=free_port(), console_port=free_port(),
                  gateway_metrics_port=free_port())
    stack.start(echo=lambda m: out(m))
    try:
        client = openai.OpenAI(base_url=stack.base_url, api_key="unused", max_retries=0, timeout=120)
        out(f"1/4 traffic: {len(train_rows)} questions; the conductor has no policy yet and explores uniformly")
        explore = summary(ask_all(client, train_rows, "explore"))
        # Train on every episode of that traffic: a loaded machine's reward logger can lag the
        # answers by seconds, and a gate on fewer episodes is too unsure to publish.
        from baton_trainer.cluster import count_episodes

        deadline = time.monotonic() + 60
        while count_episodes(str(stack.dataset_dir / "episodes")) < len(train_rows) and time.monotonic() < deadline:
            time.sleep(0.5)
        out("2/4 training the fast policy on the logged episodes and gating it off-policy")
        from baton_trainer.train_fast import parse_args, train_fast

        version = time.strftime("v%H%M%S")
        # The CLI's own parser: every option the command has gets its default.
        trained = train_fast(parse_args([
            "--config", str(cfg), "--store", str(run_dir / "policies"), "--name", "baton",
            "--episodes", str(stack.dataset_dir / "episodes"), "--feedback", str(stack.dataset_dir / "feedback"),
            "--holdout", "0.3", "--min-episodes", "50", "--cost-weight", "0", "--version", version, "--publish",
            "--bootstrap-servers", str(stack.bootstrap_servers)]))
        gate = trained["gate"]
        out(f"   gate: candidate {gate['candidate']:.3f} vs current {gate['current']:.3f} "
            f"(difference {gate['difference']:+.3f}, 95% lower bound {gate['lower']:+.3f}) -> "
            f"{'published ' + version if trained['published'] else 'not published: ' + trained['reason']}")
        after, agreement = None, (0, 0)
        if trained["published"]:
            router = next(s for s in stack.services if s.name == "router")
            wait_for_version(router.port, version)
            out(f"3/4 rollout: the router serves {version} (no restart)")
            out(f"4/4 fresh traffic: {len(fresh_rows)} questions never seen in training")
            results = ask_all(client, fresh_rows, "fresh")
            assert all(r["version"] == version for r in results), "every fresh answer came from the new policy"
            after = summary(results)
            agreement = matrix_agreement(fresh_rows, results)
    finally:
        stack.stop()
    singles = best_single(dataset, fresh_rows)
    chances = uniform_chances(fresh_rows)
    # "before" and "after" are on the same fresh questions: uniform routing (exact, from the matrix)
    # and the learned policy (served). "explore" is the served exploration traffic, on the training ones.
    before = {"questions": len(fresh_rows), "accuracy": sum(chances) / len(chances),
              "source": "exact: per fresh question, the mean of the workers' recorded scores in the matrix"}
    report = {"explore": explore, "before": before, "after": after, "gate": trained["gate"],
              "published": trained["published"], "version": version, "single_workers_on_fresh": singles}
    out(f"\nexploration traffic, uniform routing ({len(train_rows)} training questions, served): "
        f"accuracy {explore['accuracy']:.1%}")
    out(f"uniform routing on the {len(fresh_rows)} fresh questions (exact, from the matrix the sim workers "
        f"answer by): accuracy {before['accuracy']:.1%}")
    if after:
        top = max(singles, key=lambda name: singles[name])
        report["p_uniform_as_good"] = chance_uniform_does_as_well(chances, after["accuracy"] * after["questions"])
        report["matrix_agreement"] = {"agreeing": agreement[0], "one_worker_answers": agreement[1]}
        out(f"learned policy {version} on the same fresh questions (served):  accuracy {after['accuracy']:.1%}, "
            f"${after['cost_per_query']:.6f} per query; chance uniform routing does as well: "
            f"{report['p_uniform_as_good']:.2g}")
        out(f"   its one-worker answers graded as the matrix records: {agreement[0]} of {agreement[1]}")
        out(f"best single worker on the fresh questions ({top}): {singles[top]:.1%}")
        report["plot"] = str(plot(report, run_dir / "train_demo.png"))
        out(f"plot: {report['plot']}")
    return report


def plot(report: dict, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = ["uniform (exact)", f"learned {report['version']}"] + [f"{k} alone" for k in report["single_workers_on_fresh"]]
    values = [report["before"]["accuracy"], report["after"]["accuracy"], *report["single_workers_on_fresh"].values()]
    fig, ax = plt.subplots(figsize=(8, 4))
    bars = ax.bar(labels, values, color=["#999999", "#2b7bb9"] + ["#cccccc"] * len(report["single_workers_on_fresh"]))
    ax.bar_label(bars, labels=[f"{v:.1%}" for v in values])
    ax.set_ylabel("accuracy")
    ax.set_title("Baton learning loop: uniform routing and the learned policy on the same fresh questions")
    ax.set_ylim(0, 1)
    plt.setp(ax.get_xticklabels(), rotation=20, ha="right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
