#!/usr/bin/env python3
"""Idle request rate of strata brokers (docs/BENCHMARKS.md "Idle cost"): start N brokers on STORAGE, settle, then diff /metrics
over WINDOW seconds. Prints per broker-1 requests/s by op and (if reported) by area."""
import os, re, subprocess, sys, time, urllib.request, collections, tempfile, shutil

binary, storage, n, window, label = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
base = int(sys.argv[6]) if len(sys.argv) > 6 else 19100
procs = []
logs = tempfile.mkdtemp(prefix="idle-")
def scrape(port):
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    ops, areas = collections.Counter(), collections.Counter()
    for line in text.splitlines():
        m = re.match(r'strata_storage_requests_total\{.*op="([^"]+)"\} (\S+)', line)
        if m: ops[m.group(1)] += float(m.group(2))
        m = re.match(r'strata_storage_requests_by_area_total\{.*area="([^"]+)",op="([^"]+)"\} (\S+)', line)
        if m: areas[(m.group(1), m.group(2))] += float(m.group(3))
    return ops, areas
try:
    for i in range(1, n + 1):
        args = [binary, "serve", "--storage", storage, "--node-id", str(i),
                "--listen", f"127.0.0.1:{base + i}", "--metrics-listen", f"127.0.0.1:{base + 100 + i}",
                "--cluster", "true"]
        procs.append(subprocess.Popen(args, stdout=open(f"{logs}/b{i}.log", "w"), stderr=subprocess.STDOUT))
    # settle: until every broker answers /metrics and has been up a while
    deadline = time.time() + 60
    while time.time() < deadline:
        try:
            for i in range(1, n + 1): scrape(base + 100 + i)
            break
        except Exception:
            time.sleep(0.5)
    time.sleep(12)
    before = [scrape(base + 100 + i) for i in range(1, n + 1)]
    time.sleep(window)
    after = [scrape(base + 100 + i) for i in range(1, n + 1)]
    for i in range(n):
        ops = {k: (after[i][0][k] - before[i][0][k]) / window for k in after[i][0]}
        total = sum(ops.values())
        print(f"{label} broker {i+1}: total {total:.2f}/s  " + "  ".join(f"{k} {v:.2f}" for k, v in sorted(ops.items()) if v))
        if i == 0 and after[i][1]:
            for k in sorted(after[i][1]):
                v = (after[i][1][k] - before[i][1].get(k, 0)) / window
                if v: print(f"    {k[0]:<18} {k[1]:<10} {v:.2f}/s")
finally:
    for p in procs: p.terminate()
    for p in procs:
        try: p.wait(10)
        except Exception: p.kill()
    print("logs in", logs)
