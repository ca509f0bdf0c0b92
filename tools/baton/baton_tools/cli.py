"""The `baton` command: run the suite locally, and the offline tools."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from baton_platform.config import ConfigError
from baton_tools.stack import REPO_ROOT, Stack, config_path, down

RUN_DIR = Path(os.environ.get("BATON_RUN_DIR") or REPO_ROOT / ".baton" / "run")
# The stack `up` and `demo` start is read by a person: its services log text unless told otherwise.
TERMINAL_LOGS = {"BATON_LOG_FORMAT": os.environ.get("BATON_LOG_FORMAT") or "text"}


def cmd_up(args) -> int:
    if args.only:
        return restart_one(args.only)
    if (RUN_DIR / "stack.json").exists():
        print(f"a stack is already running (see {RUN_DIR / 'stack.json'}); `make down` first", file=sys.stderr)
        return 1
    stack = Stack(RUN_DIR, config_file=config_path(), env=TERMINAL_LOGS, secure=args.secure).start(detach=True)
    print(f"Baton is up: OpenAI-compatible API at {stack.base_url} (model 'baton'); console at {stack.console_url}; "
          f"Kafka at {stack.bootstrap_servers}; logs in {RUN_DIR / 'logs'}")
    return 0


def restart_one(name: str) -> int:
    """Restart one service of the running stack (a crashed one, or one to reload), as `up` started it."""
    try:
        stack = Stack.attach(RUN_DIR)
        stack.extra_env.update(TERMINAL_LOGS)
    except FileNotFoundError:
        print("no stack is running; `baton up` first", file=sys.stderr)
        return 1
    try:
        svc = stack.restart(name, detach=True)
    except KeyError as e:
        print(f"baton: {e.args[0]}", file=sys.stderr)
        return 2
    print(f"{name} restarted (pid {svc.pid}, port {svc.port}); log in {svc.log}")
    return 0


def cmd_down(args) -> int:
    print("stopped" if down(RUN_DIR) else "nothing to stop")
    return 0


def cmd_demo(args) -> int:
    from baton_tools.demo import run_demo

    if (RUN_DIR / "stack.json").exists():
        # A stack `make up` started: ask it, and leave it running, so its console shows the traffic.
        stack = Stack.attach(RUN_DIR)
        run_demo(stack.base_url, stack.config, count=args.questions)
        print(f"\nasked the running stack; its console is at {stack.console_url}")
        return 0
    run_dir = RUN_DIR.parent / "demo"
    stack = Stack(run_dir, config_file=config_path(), env=TERMINAL_LOGS)
    print(f"configuration: {stack.config_file}")
    stack.start()
    try:
        run_demo(stack.base_url, stack.config, count=args.questions)
        print(f"\nepisodes written under {stack.dataset_dir / 'episodes'}")
    finally:
        stack.stop()
        print("stopped Kafka and every service")
    return 0


def cmd_check_config(args) -> int:
    # The check lives with the configuration (`baton-check-config` in every image); this is its alias.
    from baton_platform.config import check_main

    return check_main(["--config", args.config] if args.config else [])


def cmd_train_demo(args) -> int:
    from baton_tools.train_demo import run_train_demo

    report = run_train_demo(RUN_DIR.parent / "train-demo", n_train=args.train, n_fresh=args.fresh)
    return 0 if report["published"] else 1


def cmd_eval(args) -> int:
    # tools/eval, which the development environment installs; baton-tools does not depend on it, so
    # the stand-in image (baton-tools alone) holds neither it nor the router.
    import importlib

    module = {"replay": "replay", "heldout": "heldout", "table": "conductor_table"}[args.mode]
    return importlib.import_module(f"baton_eval.{module}").main(args.rest)


def cmd_keys(args) -> int:
    from baton_platform.apikeys import hash_key, key_entry, mint_key
    from baton_platform.config import SCOPES, TENANT_NAME

    if args.action == "hash":
        # An existing key, read from stdin so it stays out of shell history and process listings.
        key = sys.stdin.readline().strip()
        if not key:
            print("baton: give the key on stdin", file=sys.stderr)
            return 2
        print(hash_key(key))
        return 0
    import re

    scopes = [s for s in args.scopes.split(",") if s]
    if not re.match(TENANT_NAME, args.tenant or "") or not scopes or not set(scopes) <= set(SCOPES):
        print(f"baton: --tenant must match {TENANT_NAME} and --scopes be some of {','.join(SCOPES)}", file=sys.stderr)
        return 2
    key = mint_key()
    digest = hash_key(key)
    print(f"API key for tenant {args.tenant} (shown once; Baton keeps only its hash):\n\n  {key}\n")
    print("Add its hash to the tenant in the configuration file:\n")
    print(f"  tenants:\n    - name: {args.tenant}\n      keys:\n        - {{sha256: {digest}, scopes: [{', '.join(scopes)}]}}\n")
    print(f"or as an entry of BATON_API_KEYS (gateway.keys_env), e.g. in the chart's Secret:\n\n"
          f"  {key_entry(args.tenant, digest, scopes)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="baton", description="Baton: LLM workflows over Kafka")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("up", help="start Kafka and every service in the background")
    p.add_argument("--only", metavar="NAME", help="restart only this service of the running stack "
                   "(a name from .baton/run/stack.json: gateway, router, synthesizer, reward-logger, executor-<provider>-<i>)")
    p.add_argument("--secure", action="store_true", help="run the bus as a secured cluster: SASL_SSL (SCRAM), "
                   "ACLs, each service as its own Kafka user (certificates and passwords in .baton/run/kafka-pki)")
    p.set_defaults(fn=cmd_up)
    sub.add_parser("down", help="stop what `baton up` started").set_defaults(fn=cmd_down)
    p = sub.add_parser("demo", help="start everything, ask real questions, print answers and workflows, stop "
                       "(a stack `baton up` started is asked instead, and left running)")
    p.add_argument("--questions", type=int, default=8)
    p.set_defaults(fn=cmd_demo)
    p = sub.add_parser("check-config", help="validate a configuration file")
    p.add_argument("--config", default=None, help="defaults to BATON_CONFIG")
    p.set_defaults(fn=cmd_check_config)
    p = sub.add_parser("train-demo", help="explore, train, gate, roll out, and measure the learning loop")
    p.add_argument("--train", type=int, default=500)
    p.add_argument("--fresh", type=int, default=200)
    p.set_defaults(fn=cmd_train_demo)
    p = sub.add_parser("eval", help="offline evaluation: `baton eval replay --train A.csv --test B.csv --json` (the "
                       "fast policy), `baton eval heldout --in A.csv --models X,Y --by eval_name` (its gain on "
                       "whole held-out subjects, over seeds), `baton eval table --config C --train A.csv --test "
                       "B.csv` (every router, LLM conductors included, on the same rows)")
    p.add_argument("mode", choices=["replay", "heldout", "table"])
    p.add_argument("rest", nargs=argparse.REMAINDER, help="arguments of the evaluation (see --help)")
    p.set_defaults(fn=cmd_eval)
    p = sub.add_parser("keys", help="gateway API keys: `baton keys create --tenant NAME`, `baton keys hash < KEY`")
    p.add_argument("action", choices=["create", "hash"])
    p.add_argument("--tenant", help="the tenant the new key belongs to (create)")
    p.add_argument("--scopes", default="chat", help="comma-separated: chat, feedback, eval (create; default chat)")
    p.set_defaults(fn=cmd_keys)
    args = parser.parse_args(argv)
    try:
        return args.fn(args)
    except ConfigError as e:
        print(f"baton: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
