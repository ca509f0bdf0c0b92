"""`baton-trainer train-fast`: learn the fast policy from logged episodes, gate it, roll it out.

    baton-trainer train-fast --episodes DIR|URL --store URI [--publish]   # BATON_CONFIG names the pool
    baton-trainer rollback --store URI [--to VERSION]   # either kind: a fast policy or a LoRA adapter
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
import time
from pathlib import Path

from tqdm import tqdm

from baton_platform.config import ConfigError, load_config
from baton_policy import decisions, local_copy
from baton_policy.embeddings import EMBEDDERS
from baton_policy.fastpolicy import Policy
from baton_policy.templates import single

from .gate import GateResult, compare, greedy, uniform
from .logged import read_episodes, read_feedback
from .store import PolicyStore, Stored, announce_sync, update


def _held_back(request_id: str, share: float) -> bool:
    h = int.from_bytes(hashlib.blake2b(request_id.encode(), digest_size=8).digest(), "big")
    return h / 2**64 < share


def _models(config) -> list[str]:
    return [(w.sim.column if w.sim and w.sim.column else w.model) for w in config.workers]


def _config(args):
    config = load_config(args.config)
    if getattr(args, "bootstrap_servers", None):
        config.kafka.bootstrap_servers = args.bootstrap_servers
    return config


def train_fast(args) -> dict:
    """Fit a candidate on the logged episodes and gate it against the serving version on the held-back
    ones; publish it when the gate passes and --publish is given. The store records the gate's answer
    (published or refused) so that the console can show it."""
    config = _config(args)
    steps = tqdm(total=4, desc="train-fast", unit="step", file=sys.stderr, disable=args.quiet)
    logged = read_episodes(args.episodes, feedback=read_feedback(args.feedback) if args.feedback else None)
    steps.set_postfix_str(f"{len(logged)} episodes")
    steps.update()
    if len(logged) < args.min_episodes:
        steps.close()
        return {"published": False, "reason": f"{len(logged)} graded policy episodes; {args.min_episodes} needed"}
    train = [x.episode for x in logged if not _held_back(x.request_id, args.holdout)]
    held = [x.episode for x in logged if _held_back(x.request_id, args.holdout)]
    # The workers' model names are the actions the logging policy took.
    flows = [single(m) for m in _models(config)]
    candidate = Policy.fit_logged(train, flows, cost_weight=args.cost_weight, embedding=args.embedding)
    candidate.epsilon = config.conductor.policy.epsilon
    steps.update()
    store = PolicyStore(args.store)
    published = store.versions(args.name)
    if published:
        current = Policy.load(local_copy(published[-1]["uri"]))
        current_prob, current_name = greedy(current), published[-1]["version"]
    else:
        current_prob, current_name = uniform(len(flows)), "uniform"
    # The candidate's heads never saw the held-back episodes: they are the gate's reward model.
    predicted = (candidate.quality([e.prompt for e in held], [e.eval_name for e in held])
                 - args.cost_weight * candidate.mean_costs[None, :]) if held else None
    result = compare(held, greedy(candidate), current_prob, actions=candidate.names, predicted=predicted,
                     cost_weight=args.cost_weight)
    steps.update()
    version = args.version or time.strftime("v%Y%m%d-%H%M%S")
    out = {"candidate": version, "current": current_name, "train_episodes": len(train), "gate": result.as_dict()}
    if result.publish and args.publish:
        stored = _publish(config, store, args.name, version, candidate, result, current_name)
        out.update(published=True, uri=stored.uri, decision=_decide(
            args, "published", version, current_name, result,
            f"lower bound {result.lower:+.4f} > 0 over {result.episodes} held-out episodes"))
    elif not result.publish:
        out.update(published=False, reason="the gate said no", decision=_decide(
            args, "refused", version, current_name, result,
            f"lower bound {result.lower:+.4f} <= 0 over {result.episodes} held-out episodes"))
    else:
        out.update(published=False, reason="--publish not given")
    steps.update()
    steps.close()
    return out


def _publish(config, store: PolicyStore, name: str, version: str, candidate: Policy, result: GateResult,
             current: str) -> Stored:
    """Store the candidate (its manifest keeps the gate's numbers) and announce it on baton.policy."""
    with tempfile.TemporaryDirectory() as tmp:
        saved = candidate.save(Path(tmp) / "policy")
        stored = store.put(name, version, saved, {
            "name": name, "version": version, "uri": store.uri(name, version),
            "published_unix_ms": int(time.time() * 1000), "gate": result.as_dict(), "previous": current})
    announce_sync(config.kafka, update(name, version, stored, estimate=result.candidate, lower=result.lower))
    return stored


def _decide(args, kind: str, version: str, previous: str, result: GateResult | None, reason: str) -> str:
    """Record a decision in the store, where the console reads it; returns where it was written."""
    gate = result.as_dict() if result is not None else None
    return decisions.record(args.store, args.name, decisions.decision(kind, version, previous, gate=gate,
                                                                      reason=reason))


def rollback(args) -> dict:
    """Announce an earlier version (--to, or the one before the newest) and record the rollback."""
    config = _config(args)
    versions = PolicyStore(args.store).versions(args.name)
    if len(versions) < 2 and not args.to:
        return {"rolled_back": False, "reason": "no earlier version to roll back to"}
    target = next((v for v in versions if v["version"] == args.to), None) if args.to else versions[-2]
    if target is None:
        return {"rolled_back": False, "reason": f"no version {args.to!r}; have {[v['version'] for v in versions]}"}
    if "digest" not in target:
        return {"rolled_back": False, "reason": f"version {target['version']!r} was stored without a digest: "
                                                "routers would refuse it; publish it again"}
    announce_sync(config.kafka, update(args.name, target["version"], Stored(target["uri"], target["digest"]),
                                       rollback=True, kind=target.get("kind", "fast")))
    where = _decide(args, "rollback", target["version"], versions[-1]["version"], None,
                    f"--to {args.to}" if args.to else "back to the version before the newest")
    return {"rolled_back": True, "version": target["version"], "uri": target["uri"], "decision": where}


def parse_args(argv: list[str] | None, command: str = "train-fast") -> argparse.Namespace:
    """The command line of `command` (train-fast or rollback), with its defaults."""
    parser = argparse.ArgumentParser(prog=f"baton-trainer {command}")
    parser.add_argument("--config", default=None, help="Baton configuration (defaults to BATON_CONFIG)")
    parser.add_argument("--store", required=True, help="policy store: a directory or fsspec URL")
    parser.add_argument("--name", default="baton", help="policy name (the key on baton.policy)")
    parser.add_argument("--bootstrap-servers", default=None, help="overrides kafka.bootstrap_servers")
    if command == "train-fast":
        parser.add_argument("--episodes", required=True,
                            help="the episode dataset (reward logger's episodes/): a directory or a URL "
                            "such as s3://bucket/prefix/episodes")
        parser.add_argument("--feedback", default=None,
                            help="the feedback/ dataset (users' and the judge's scores): the quality of episodes "
                                 "that had no reference answer")
        parser.add_argument("--holdout", type=float, default=0.3, help="share of episodes held back for the gate")
        parser.add_argument("--min-episodes", type=int, default=50)
        parser.add_argument("--cost-weight", type=float, default=0.0)
        parser.add_argument("--embedding", choices=sorted(EMBEDDERS), default=None,
                            help="add this packaged sentence embedding of the query to the policy's features")
        parser.add_argument("--version", default=None)
        parser.add_argument("--publish", action="store_true", help="publish when the gate passes")
        parser.add_argument("--quiet", action="store_true")
    else:
        parser.add_argument("--to", default=None, help="version to return to (default: the one before the latest)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None, command: str = "train-fast") -> int:
    args = parse_args(argv, command)
    try:
        out = train_fast(args) if command == "train-fast" else rollback(args)
    except ConfigError as e:
        print(json.dumps({"error": str(e)}))
        return 2
    print(json.dumps(out))
    return 0
