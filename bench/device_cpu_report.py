"""Reads what bench/device_cpu.sh wrote (DIR/device) and prints issue 21's figures from it:
troupe against PyTorch at each thread count (bench/pytorch/report.py), one process's scaling
with threads and where the step's time went at the fewest and the most threads, and the
multi-process jobs against one process of the same run.

    python3 bench/device_cpu_report.py DIR
"""
import glob
import json
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "pytorch"))
import report  # noqa: E402  (bench/pytorch/report.py)


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def main(root):
    d = os.path.join(root, "device")
    host = open(os.path.join(d, "host.txt")).read()
    for line in host.splitlines():
        if re.match(r"(Model name|CPU\(s\)|Thread|Core|Socket|BLAS|torch )", line.strip()):
            print(line.strip()[:160])

    for t in sorted(glob.glob(os.path.join(d, "t*")), key=lambda p: int(p.rsplit("t", 1)[1])):
        print(f"\n## troupe against PyTorch, {os.path.basename(t)[1:]} threads")
        try:
            report.main(t)
        except (OSError, KeyError, ValueError) as e:
            print(f"incomplete: {e}")

    for model in ("dlrm", "mlp", "dlrm1024"):
        runs = {}
        for p in glob.glob(os.path.join(d, "scaling", f"{model}-t*.json")):
            s = load(p)
            if s:
                runs[int(p.rsplit("-t", 1)[1][:-5])] = s
        if not runs:
            continue
        ts = sorted(runs)
        base = runs[ts[0]]["samples_per_sec"]
        two = runs.get(2, runs[ts[0]])["samples_per_sec"]
        print(f"\n## {model}: one process, profiled")
        print(f"| threads | samples/s | x {ts[0]} thread{'s' if ts[0] > 1 else ''} | x 2 threads | in kernels s | train s |")
        print("|---:|---:|---:|---:|---:|---:|")
        for t in ts:
            s = runs[t]
            print(f"| {t} | {s['samples_per_sec']:.0f} | {s['samples_per_sec'] / base:.2f} | "
                  f"{s['samples_per_sec'] / two:.2f} | {s.get('kernel_seconds', 0):.2f} | {s['train_seconds']:.2f} |")
        lo, hi = runs[ts[0]], runs[ts[-1]]
        ph_lo = {e["kernel"]: e["seconds"] for e in lo.get("kernel_profile", [])}
        ph_hi = {e["kernel"]: e["seconds"] for e in hi.get("kernel_profile", [])}
        ph_lo["(not in a kernel)"] = max(0.0, lo["train_seconds"] - sum(ph_lo.values()))
        ph_hi["(not in a kernel)"] = max(0.0, hi["train_seconds"] - sum(ph_hi.values()))
        print(f"\n| phase | {ts[0]} thread{'s' if ts[0] > 1 else ''} s | {ts[-1]} threads s | speedup | share at {ts[-1]} |")
        print("|---|---:|---:|---:|---:|")
        for k in sorted(ph_hi, key=lambda k: -ph_hi[k])[:12]:
            a, b = ph_lo.get(k, 0.0), ph_hi[k]
            print(f"| {k} | {a:.3f} | {b:.3f} | {a / b if b else float('nan'):.2f}x | "
                  f"{100 * b / hi['train_seconds']:.1f}% |")

    ab = {}
    for p in glob.glob(os.path.join(d, "ab", "dlrm-*-t*.json")):
        s = load(p)
        if s:
            _, v, t = os.path.basename(p)[:-5].split("-")
            ab.setdefault(int(t[1:]), {})[v] = s["samples_per_sec"]
    if ab:
        print("\n## DLRM, one process: this bundle (new) against the earlier one (old), alternating")
        print("| threads | old samples/s | new samples/s | new / old |")
        print("|---:|---:|---:|---:|")
        for t in sorted(ab):
            o, n = ab[t].get("old"), ab[t].get("new")
            print(f"| {t} | {o or 0:.0f} | {n or 0:.0f} | {n / o if o and n else float('nan'):.2f} |")

    for name in ("bench-transport", "bench-ps"):
        log = os.path.join(d, name + ".log")
        if os.path.exists(log):
            print(f"\n## troupe {name.replace('-', ' ')} (its own table)")
            print("".join(l for l in open(log) if not l.startswith("[")))

    jobs = {os.path.basename(p)[:-5]: load(p) for p in glob.glob(os.path.join(d, "jobs", "*.json"))}
    ones = [j["samples_per_sec"] for n, j in jobs.items() if j and n in ("one-process", "one-process-again")]
    if jobs and ones:
        one = sum(ones) / len(ones)
        print(f"\n## DLRM jobs (one process on all the cores: mean of {len(ones)} runs, {one:.0f} samples/s)")
        print("| job | samples/s | x one process | test AUC |")
        print("|---|---:|---:|---:|")
        for n in sorted(jobs):
            j = jobs[n]
            if j:
                print(f"| {n} | {j['samples_per_sec']:.0f} | {j['samples_per_sec'] / one:.2f} | {j['test_auc']:.5f} |")
            else:
                print(f"| {n} | failed | | |")
    steps = os.path.join(d, "steps.log")
    if os.path.exists(steps):
        failed = [l.strip() for l in open(steps) if l.startswith("FAILED")]
        if failed:
            print("\n" + "\n".join(failed))


if __name__ == "__main__":
    main(sys.argv[1])
