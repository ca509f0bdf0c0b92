#!/bin/sh
# containerd's runc for the local node. Pod sandboxes ask for a negative oomScoreAdj, which needs
# CAP_SYS_RESOURCE that this machine withholds; the wrapper lowers it to 0 in the bundle, then runs runc.
bundle=""
previous=""
for arg in "$@"; do
    if [ "$previous" = "--bundle" ] || [ "$previous" = "-b" ]; then bundle="$arg"; fi
    previous="$arg"
done
if [ -n "$bundle" ] && [ -f "$bundle/config.json" ]; then
    python3 - "$bundle/config.json" <<'PY'
import json, sys
path = sys.argv[1]
with open(path) as f:
    spec = json.load(f)
process = spec.get("process") or {}
if process.get("oomScoreAdj", 0) < 0:
    process["oomScoreAdj"] = 0
    with open(path, "w") as f:
        json.dump(spec, f)
PY
fi
exec runc "$@"
