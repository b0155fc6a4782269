"""Reads what bench/device_cpu.sh wrote (DIR/device) and prints issue 21's figures from it:
troupe against PyTorch at each thread count (bench/pytorch/report.py), one process's scaling
with threads and where the step's time went at the fewest and the most threads, and the
multi-process jobs against one process of the same run.

    python3 bench/device_cpu_report.py DIR
"""
import glob
import statistics
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
        print(f"| threads | samples/s | x {ts[0]} thread{'s' if ts[0] > 1 else ''} | x 2 threads | in kernels s (wall) | train s |")
        print("|---:|---:|---:|---:|---:|---:|")
        for t in ts:
            s = runs[t]
            inside = s.get("kernel_wall_seconds", s.get("kernel_seconds", 0))
            print(f"| {t} | {s['samples_per_sec']:.0f} | {s['samples_per_sec'] / base:.2f} | "
                  f"{s['samples_per_sec'] / two:.2f} | {inside:.2f} | {s['train_seconds']:.2f} |")

        def phases(s):
            # Wall time per phase (calls side by side counted once) where the run has it, else summed.
            wall = "kernel_wall_seconds" in s
            ph = {e["kernel"]: e.get("wall_seconds", e["seconds"]) for e in s.get("kernel_profile", [])}
            if wall and s.get("side_by_side", {}).get("calls"):
                ph["forEachIndependent (per-table pieces)"] = s["side_by_side"]["wall_seconds"]
            inside = s["kernel_wall_seconds"] if wall else sum(ph.values())
            ph["(not in a kernel)"] = max(0.0, s["train_seconds"] - inside)
            return ph

        per = {t: phases(runs[t]) for t in ts}
        hi = runs[ts[-1]]
        wall = "kernel_wall_seconds" in hi
        print(f"\nPer phase, seconds of {'wall' if wall else 'summed'} time "
              "(kernels inside forEachIndependent are also in its row):")
        print("| phase | " + " | ".join(f"{t} thr" for t in ts) + f" | speedup {ts[0]}->{ts[-1]} | share at {ts[-1]} |")
        print("|---|" + "---:|" * (len(ts) + 2))
        for k in sorted(per[ts[-1]], key=lambda k: -per[ts[-1]][k]):
            a, b = per[ts[0]].get(k, 0.0), per[ts[-1]][k]
            cells = " | ".join(f"{per[t].get(k, 0.0):.3f}" for t in ts)
            print(f"| {k} | {cells} | {a / b if b else float('nan'):.2f}x | {100 * b / hi['train_seconds']:.1f}% |")

    def median(xs):  # 0 for none
        return statistics.median(xs) if xs else 0

    ab = {}  # threads -> old/new -> [samples/s of each round]
    dense = {}  # threads -> old/new -> [wall seconds of denseForward + denseBackward] (AB_PROFILE runs)
    for p in glob.glob(os.path.join(d, "ab", "dlrm-*-t*.json")):
        s = load(p)
        if s:
            parts = os.path.basename(p)[:-5].split("-")
            t, v = int(parts[2][1:]), parts[1]
            ab.setdefault(t, {}).setdefault(v, []).append(s["samples_per_sec"])
            walls = [k["wall_seconds"] for k in s.get("kernel_profile", [])
                     if k["kernel"] in ("denseForward", "denseBackward")]
            if len(walls) == 2:
                dense.setdefault(t, {}).setdefault(v, []).append(sum(walls))
    if ab:
        print("\n## DLRM, one process: this bundle (new) against the earlier one (old), alternating")
        print("| threads | rounds | old samples/s (median) | new samples/s (median) | new / old |")
        print("|---:|---:|---:|---:|---:|")
        for t in sorted(ab):
            o, n = ab[t].get("old", []), ab[t].get("new", [])
            om, nm = median(o), median(n)
            rounds = min(len(o), len(n))
            print(f"| {t} | {rounds} | {om:.0f} | {nm:.0f} | {nm / om if om and nm else float('nan'):.2f} |")
    if dense:
        print("\n## The dense layers (denseForward + denseBackward, wall seconds, medians), new against old")
        print("| threads | old s | new s | old / new |")
        print("|---:|---:|---:|---:|")
        for t in sorted(dense):
            o, n = dense[t].get("old", []), dense[t].get("new", [])
            om, nm = median(o), median(n)
            print(f"| {t} | {om:.3f} | {nm:.3f} | {om / nm if om and nm else float('nan'):.2f} |")

    cores = {}  # (model, cores) -> threads -> [samples/s of each round]
    for p in glob.glob(os.path.join(d, "cores", "*-c*-t*-r*.json")):
        s = load(p)
        if s:
            m, c, t, _ = os.path.basename(p)[:-5].split("-")
            cores.setdefault((m, int(c[1:])), {}).setdefault(int(t[1:]), []).append(s["samples_per_sec"])
    if cores:
        print("\n## One process on C cores (taskset): C compute threads against C - 1, alternating")
        print("| model | cores | rounds | C - 1 threads (median) | C threads (median) | C - 1 / C |")
        print("|---|---:|---:|---:|---:|---:|")
        for (m, c) in sorted(cores):
            less, every = cores[(m, c)].get(c - 1, []), cores[(m, c)].get(c, [])
            lm, em = median(less), median(every)
            print(f"| {m} | {c} | {min(len(less), len(every))} | {lm:.0f} | {em:.0f} | "
                  f"{lm / em if lm and em else float('nan'):.2f} |")

    for name in ("bench-transport", "bench-ps"):
        log = os.path.join(d, name + ".log")
        if os.path.exists(log):
            print(f"\n## troupe {name.replace('-', ' ')} (its own table)")
            print("".join(l for l in open(log) if not l.startswith("[")))

    jobs = {os.path.basename(p)[:-5]: load(p) for p in glob.glob(os.path.join(d, "jobs", "*.json"))}
    ones = [j["samples_per_sec"] for n, j in jobs.items() if j and n in ("one-process", "one-process-again")]
    if jobs and ones:
        one = sum(ones) / len(ones)
        threads = sorted({str(j.get("threads", "?")) for n, j in jobs.items()
                          if j and n in ("one-process", "one-process-again")})
        print(f"\n## DLRM jobs (one process as run.threads = 0 runs it, {', '.join(threads)} compute threads: mean of "
              f"{len(ones)} runs, {one:.0f} samples/s)")
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
