"""A worker the served policy was not trained with, added to a running stack's configuration and
the router restarted (the executors and the synthesizer read the changed file themselves), end to
end: it gets traffic among the first requests, it gets the configured share of the requests where
only its upper bound beats the policy's choice (checked on the propensities in the episodes), its
graded rewards reach the routers, and taking it out of the configuration (the router restarted)
takes its traffic away."""

from __future__ import annotations

import csv
import sys
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import yaml
from testbed import MMLU_PRO, default_config_data, episodes, running_stack, wait_for

from baton_policy.fastpolicy import Policy
from baton_policy.matrix import load_matrix, without
from baton_policy.templates import candidate_workflows

NEW_MODEL = "Qwen1.5-110B"
ROUND = 20  # requests sent at once, between waits for the router to learn their rewards


def test_a_worker_added_to_a_running_stack_serves_at_once_learns_and_is_gone_once_removed(kafka_bootstrap, tmp_path):
    data = default_config_data()
    served = {w["sim"]["column"] if w["sim"].get("column") else w["model"] for w in data["workers"]}
    # The policy knows the three sim workers of the default pool only (a small singles-only fit).
    matrix = load_matrix(MMLU_PRO)
    known = without(matrix.subset(range(400)), [m for m in matrix.models if m not in served])
    flows = candidate_workflows(known, vote_sizes=(), panel_sizes=(), escalate=())
    policy_dir = Policy.fit_matrix(known, flows, tune_trust_folds=0).save(tmp_path / "policy")
    newcomer = {"name": "qwen-110b", "provider": "sim", "model": NEW_MODEL,
                "sim": {"dataset": str(MMLU_PRO), "latency_ms": 20},
                "price": {"input_per_mtok": 0.9, "output_per_mtok": 0.9},
                "card": "Strengths: open weights. Weaknesses: untested here. Price: medium."}
    data["conductor"] = {"backend": "policy", "policy": {"path": str(policy_dir), "version": "v0", "epsilon": 0.0,
                                                         "new_worker_share": 0.2}}
    data["kafka"] = {"partitions": 2}
    data["reward_logger"] = {**data["reward_logger"], "flush_interval_s": 0.5}

    csv.field_size_limit(sys.maxsize)
    with MMLU_PRO.open(newline="") as f:
        every = list(csv.DictReader(f))
    rows, later = every[400:600], every[600:700]
    with running_stack(data, tmp_path, kafka_bootstrap) as stack:

        def reconfigure(*services: str) -> None:
            """What a user of `make up` does: edit the configuration, restart those services."""
            stack.config_file.write_text(yaml.safe_dump(data))
            for svc in services:
                stack.restart(svc)

        # Added to the running stack's configuration, only the router restarted: it chooses the new
        # worker; the synthesizer and the sim executors, started without it, read the file again
        # when a step names it.
        data["workers"].append(newcomer)
        started = {s.name: s.pid for s in stack.services}
        reconfigure("router")
        client = openai.OpenAI(base_url=stack.base_url, api_key="unused", max_retries=0, timeout=60)

        def ask(row):
            raw = client.chat.completions.with_raw_response.create(
                model="baton", messages=[{"role": "user", "content": row["prompt"]}],
                metadata={"baton_eval": f"mmlu_pro:{row['sample_id']}"})
            return raw.headers["x-baton-request-id"]

        ids: set[str] = set()
        first: set[str] = set()  # the first round's requests, chosen before any reward was learned

        def ours() -> list[dict]:
            return episodes(stack.dataset_dir, ids)

        router = next(s for s in stack.services if s.name == "router")

        def learned() -> float:
            text = httpx.get(f"http://127.0.0.1:{router.port}/metrics", timeout=5).text
            return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith("baton_rewards_learned_total"))

        def caught_up() -> bool:
            """Every request so far is logged, and every graded reward of the new worker's is learned."""
            logged = ours()
            graded = sum(r["plan_action"] == NEW_MODEL and r["quality"] is not None for r in logged)
            return len(logged) >= len(ids) and learned() >= graded > 0

        # In rounds, each chosen by heads that have learned every reward of the rounds before, as a
        # stream slower than its rewards would be: the new worker's head first wins outright, then,
        # as it learns, is offered only at its share (and learns five times slower), then not at all.
        # A burst of 200 would all be chosen by the unlearned head, and the share never tried.
        for start in range(0, len(rows), ROUND):
            with ThreadPoolExecutor(8) as pool:
                ids |= set(pool.map(ask, rows[start:start + ROUND]))
            first = first or set(ids)
            wait_for(caught_up, 60, 0.5)
        logged, taught = ours(), learned()
        same = {s.name for s in stack.services if s.name != "router" and started[s.name] == s.pid}

        # Taken out of the configuration, the router restarted: the new worker and two of the known
        # ones get no more traffic, though the executors, started with them, could still serve them,
        # and the policy now explores (it would send the known ones a third of the queries each).
        kept = data["workers"][0]
        removed = {w["name"] for w in data["workers"]} - {kept["name"]}
        data["workers"] = [kept]
        data["conductor"]["policy"]["epsilon"] = 1.0
        reconfigure("router")
        with ThreadPoolExecutor(8) as pool:
            ids = set(pool.map(ask, later))
        wait_for(lambda: len(ours()) >= len(ids), 60, 0.5)
        after_removal = ours()
    assert same == set(started) - {"router"}, "only the router was restarted"
    assert len(logged) == len(rows)
    assert all(r["error_code"] in (None, "") for r in logged), {r["error_code"] for r in logged}
    new = [r for r in logged if r["plan_action"] == NEW_MODEL]
    assert any(r["request_id"] in first for r in new), f"the new worker got traffic among the first {ROUND} requests"
    assert all(r["steps"][0]["worker"] == "qwen-110b" for r in new)
    assert_the_new_worker_gets_its_share(logged, data["conductor"]["policy"]["new_worker_share"])
    assert all(r["plan_policy_version"] == "v0" for r in logged)
    graded_new = [r for r in new if r["quality"] is not None]
    assert graded_new and taught >= 1, "graded rewards of its episodes reached the router over baton.rewards"
    assert len(after_removal) == 100 and "qwen-110b" in removed and len(removed) == 3
    assert {r["plan_action"] for r in after_removal} == {kept["model"]}, "removed workers get no traffic"
    assert {step["worker"] for r in after_removal for step in r["steps"]} == {kept["name"]}


def assert_the_new_worker_gets_its_share(logged: list[dict], share: float) -> None:
    """The configured share, checked on the logged propensities (baton_policy.newcomers).

    With one new worker, a singles-only policy and epsilon 0, each request's chance of going to the
    new worker is exact and known from its episode: the logged propensity where the new worker was
    chosen, one less the propensity of the policy's (greedy) choice where it was not. That chance is
    0 where the new worker's upper bound is below the policy's choice, 1 where its optimistic
    quality beats it, and the configured share where only its upper bound does. So every logged
    propensity is 1, the share or one less the share, and on the requests offered at the share the
    new worker's count is a Binomial(requests, share) draw."""
    from scipy.stats import binomtest

    def near(x: float, y: float) -> bool:
        return abs(x - y) < 1e-6

    chance = [r["plan_propensity"] if r["plan_action"] == NEW_MODEL else 1 - r["plan_propensity"] for r in logged]
    assert all(near(c, 0) or near(c, share) or near(c, 1) for c in chance), (
        f"the new worker's chance of each request is none, the configured share {share} or all of it: "
        f"{sorted({round(c, 4) for c in chance})}")
    offered = [r for r, c in zip(logged, chance) if near(c, share)]
    taken = sum(r["plan_action"] == NEW_MODEL for r in offered)
    won = sum(near(c, 1) for c in chance)
    print(f"new worker: {sum(r['plan_action'] == NEW_MODEL for r in logged)} of {len(logged)} requests; "
          f"{won} where its optimistic quality won, {taken} of {len(offered)} offered at the share {share}, "
          f"{sum(near(c, 0) for c in chance)} not offered; expected {won + share * len(offered):.1f}")
    # A share ignored (the new worker only where it wins) offers none at the share.
    assert offered, "some requests were offered to the new worker at the configured share"
    # Drawn at the share: a two-sided exact binomial test, failing one correct run in 10,000.
    p = binomtest(taken, len(offered), share).pvalue
    assert p > 1e-4, f"{taken} of {len(offered)} requests offered at the share {share} went to the new worker (p={p:.2g})"
