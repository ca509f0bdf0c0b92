"""`baton-trainer publish-lora`: put a LoRA adapter of the LLM conductor (what `grpo` writes) into the
policy store and announce it on baton.policy, where every router whose conductor is 'vllm' loads it
and serves it as the default policy. `baton-trainer rollback` returns to an earlier version.

    baton-trainer publish-lora --adapter OUT/adapter --store URI [--version V]   # BATON_CONFIG: Kafka
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

from baton_platform.config import ConfigError, load_config

from .store import PolicyStore, announce_sync, update

KIND = "lora"
ADAPTER_FILES = ("adapter_config.json",)


def publish(adapter: Path, store: PolicyStore, name: str, version: str, kafka) -> str:
    """Copy the adapter into the store and announce it; returns its URI in the store."""
    if not all((adapter / f).is_file() for f in ADAPTER_FILES) or not any(adapter.glob("adapter_model.*")):
        raise ValueError(f"{adapter} is not a LoRA adapter directory (adapter_config.json and adapter_model.*)")
    with tempfile.TemporaryDirectory() as tmp:
        # A copy, so that the store's manifest is not written into the training output.
        staged = Path(shutil.copytree(adapter, Path(tmp) / "adapter"))
        stored = store.put(name, version, staged, {"name": name, "version": version, "kind": KIND,
                                                   "uri": store.uri(name, version),
                                                   "published_unix_ms": int(time.time() * 1000)})
    announce_sync(kafka, update(name, version, stored, kind=KIND))
    return stored.uri


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="baton-trainer publish-lora")
    parser.add_argument("--adapter", required=True, type=Path, help="LoRA adapter directory (grpo's OUT/adapter)")
    parser.add_argument("--store", required=True, help="policy store: a directory or fsspec URL")
    parser.add_argument("--name", default="baton", help="policy name (the key on baton.policy)")
    parser.add_argument("--version", default=None, help="version name (default: lora-<timestamp>)")
    parser.add_argument("--config", default=None, help="Baton configuration (defaults to BATON_CONFIG)")
    parser.add_argument("--bootstrap-servers", default=None, help="overrides kafka.bootstrap_servers")
    args = parser.parse_args(argv)
    try:
        config = load_config(args.config)
        if args.bootstrap_servers:
            config.kafka.bootstrap_servers = args.bootstrap_servers
        version = args.version or time.strftime("lora-%Y%m%d-%H%M%S")
        uri = publish(args.adapter, PolicyStore(args.store), args.name, version, config.kafka)
    except (ConfigError, ValueError, FileExistsError) as e:
        print(json.dumps({"error": str(e)}))
        return 2
    print(json.dumps({"published": True, "version": version, "uri": uri, "kind": KIND}))
    return 0
