#!/usr/bin/env python3
"""Fails when a crate of the workspace depends on a crate of its own or a higher layer.

The layers are the architecture (docs/ARCHITECTURE.md, "Layers"): dependencies point down only,
so the wire codec never learns about storage, storage never about Kafka, and only the broker
converts wire types to domain types. A new crate must be given a layer here, or this check
fails and says so. Reads `cargo metadata`, so it sees [dependencies] and [dev-dependencies]
alike: a test-only dependency upwards is still a layering violation.
"""
import json
import subprocess
import sys

# Lower numbers are lower layers. Crates on one layer may not depend on each other.
LAYERS = {
    "strata-core": 0,
    "strata-wire": 1,
    "strata-storage": 2,
    "strata-storage-s3": 3,
    "strata-storage-rados": 3,
    "strata-layout": 3,
    "strata-cluster": 4,
    "strata-log": 5,
    "strata-groups": 5,
    "strata-txn": 5,
    "strata-client": 5,
    "strata-broker": 6,
    "strata": 7,
    # Drivers of the whole system: they may use any crate, and nothing may use them (the
    # harness drives brokers through the end-to-end tests' helpers, so it sits above them).
    "strata-tests": 8,
    "strata-bench": 8,
    "strata-harness": 9,
}


def main() -> int:
    metadata = json.loads(
        subprocess.run(
            ["cargo", "metadata", "--no-deps", "--format-version", "1", "--offline"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    )
    members = {p["name"]: p for p in metadata["packages"]}
    problems = []
    for name in sorted(members):
        if name not in LAYERS:
            problems.append(f"{name}: not given a layer in scripts/check-layers.py")
            continue
        for dep in members[name]["dependencies"]:
            target = dep["name"]
            if target not in members:
                continue
            if target not in LAYERS:
                continue  # reported above as a crate without a layer
            if LAYERS[target] >= LAYERS[name]:
                kind = dep.get("kind") or "normal"
                problems.append(
                    f"{name} (layer {LAYERS[name]}) depends on {target} "
                    f"(layer {LAYERS[target]}) [{kind}]: dependencies must point down"
                )
    for problem in problems:
        print(f"layering: {problem}", file=sys.stderr)
    if problems:
        return 1
    print(f"layering: {len(members)} crates, every dependency points down")
    return 0


if __name__ == "__main__":
    sys.exit(main())
