#!/usr/bin/env python3
"""Prints the JSON reports of a run-suite.sh directory as one Markdown table (one row per phase),
the form the tables in docs/BENCHMARKS.md take.

Usage: bench/scripts/summarize.py DIR
"""
import json
import pathlib
import sys


def number(value, digits=0):
    if value is None:
        return "-"
    return f"{value:,.{digits}f}"


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    print("| run | phase | records/s | MB/s | p50 ms | p99 ms | p99.9 ms | max ms "
          "| bench cpu | broker cpu | load before |")
    print("|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
    for path in sorted(pathlib.Path(sys.argv[1]).glob("*.json")):
        report = json.loads(path.read_text())
        load = report["environment"].get("load_average_before") or [None]
        for phase in report["phases"]:
            latency = phase.get("latency") or {}
            cpu = phase.get("cpu") or {}
            print(f"| {path.stem} | {phase['name']} | {number(phase['records_per_second'])} "
                  f"| {number(phase['megabytes_per_second'], 1)} "
                  f"| {number(latency.get('p50_ms'), 2)} | {number(latency.get('p99_ms'), 2)} "
                  f"| {number(latency.get('p999_ms'), 2)} | {number(latency.get('max_ms'), 2)} "
                  f"| {number(cpu.get('bench_percent'))}% | {number(cpu.get('broker_percent'))}% "
                  f"| {number(load[0], 2)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
