"""The JSON schema of Baton's configuration file, from the model that validates it (BatonConfig).

The Helm chart passes its `config` value verbatim into the services' configuration file, so its
values.schema.json checks that value against this schema; a test fails when the copy there is stale.

    python -m baton_platform.config_schema                      # print the schema
    python -m baton_platform.config_schema VALUES_SCHEMA_JSON   # refresh `config` in a chart's values schema
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from baton_platform.config import BatonConfig

# The chart's schema has definitions of its own; the model's get this prefix so none collide.
DEFS_PREFIX = "config."


def config_json_schema() -> dict:
    """The configuration's schema, its definitions referred to as `#/$defs/config.<Model>`."""
    schema = BatonConfig.model_json_schema(ref_template="#/$defs/" + DEFS_PREFIX + "{model}")
    defs = schema.pop("$defs", {})
    return {"config": schema, "$defs": {DEFS_PREFIX + name: body for name, body in sorted(defs.items())}}


def with_config_schema(values_schema: dict) -> dict:
    """`values_schema` with `properties.config` and the model's definitions replaced by the current ones."""
    generated = config_json_schema()
    defs = {k: v for k, v in values_schema.get("$defs", {}).items() if not k.startswith(DEFS_PREFIX)}
    properties = {**values_schema["properties"], "config": generated["config"]}
    return {**values_schema, "$defs": {**defs, **generated["$defs"]}, "properties": properties}


def render(values_schema: dict) -> str:
    return json.dumps(values_schema, indent=2) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args:
        print(render(config_json_schema()), end="")
        return 0
    path = Path(args[0])
    path.write_text(render(with_config_schema(json.loads(path.read_text()))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
