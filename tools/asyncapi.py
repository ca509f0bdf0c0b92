"""Writes docs/asyncapi.yaml: the suite's message flow, as FastStream documents each service's wiring
(its consumers and declared publishers) built from the default configuration.

    python tools/asyncapi.py [PATH]     (`make docs`; tests/repo/test_asyncapi.py checks it is current)
"""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
DOCUMENT = REPO / "docs" / "asyncapi.yaml"


def document() -> str:
    from faststream.specification import AsyncAPI
    from opentelemetry.sdk.trace import TracerProvider

    from baton_executor.main import create_app as executor
    from baton_gateway.main import create_app as gateway
    from baton_platform.config import load_config
    from baton_reward_logger.main import create_app as reward_logger
    from baton_router.main import create_app as router
    from baton_synthesizer.main import create_app as synthesizer

    config = load_config(REPO / "config" / "baton.yaml")
    tracing = TracerProvider()  # not exported: building the apps must not start an exporter
    apps = [gateway(config, tracing).state.service, router(config, tracing), synthesizer(config, tracing),
            reward_logger(config, tracing)]
    apps += [executor(config, p, tracing) for p in sorted({w.provider for w in config.workers})]
    spec = AsyncAPI(*[a.broker for a in apps], title="Baton", version="1",
                    description="Every Kafka topic Baton's services read and write. Payloads are protobuf "
                                "messages of proto/baton/v1 (each channel names its message type).",
                    schema_version="3.0.0")
    # FastStream lists a broker's publishers in no fixed order: sorted, the document is reproducible.
    return yaml.safe_dump(yaml.safe_load(spec.to_specification().to_yaml()), sort_keys=True, width=110)


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else DOCUMENT
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(document())
    print(f"wrote {target}")
