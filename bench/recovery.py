#!/usr/bin/env python3
"""Seconds to detect and to recover a lost worker, per mode.

Runs the DLRM of configs/dlrm-synthetic.toml as local jobs of 2 workers (and
2 shards in ps and hybrid mode: ps mode in each consistency model BSP, SSP,
ASP; allreduce; hybrid) and, while they train, kills a worker (SIGKILL) every
--interval seconds, alternating ranks, until --kills kills per model are done
(jobs are started again as needed); then stops one (SIGSTOP: found by the
heartbeat timeout) --stops times in BSP and allreduce. Mode "shrink" is
allreduce with supervision.on_worker_loss = shrink: jobs of 4 workers, each
losing ranks 1, 2, 3 in turn (not replaced: the group goes on smaller and
divides what is left of the data); "hybrid-shrink" likewise in hybrid mode
with 2 BSP shards, which first undo every step from the one the group goes
on from (the number of steps a shard really undid, because a lost rank's
push had reached it and not every shard, is counted). Mode "ps-shrink" is ps mode (BSP) with
shrink: jobs of 4 workers losing ranks 1 and 2 in turn, each rank moving into
the live worker process that runs the fewest ranks (no new process; recovered
once it is ready there). In BSP and hybrid mode it also kills a
parameter server --shard-losses times in jobs with a checkpoint every
--ckpt-steps steps (each loss rolls the job back). For each loss:
  detect  = the coordinator's lost_at_unix - the moment this script sent the
            signal (both wall clocks of this machine)
  recover = seconds_to_recover from summary.json (loss -> replacement ready;
            in allreduce, hybrid and shrink mode -> the group formed again trains;
            in ps-shrink -> the rank is ready in its new process)
Each job's test AUC and final dense weights are set beside a fault-free run
of the same config (same bits expected in BSP, ps-shrink, allreduce and hybrid; not
after a shrink, whose later steps average fewer gradients), and
its ledger (every sample applied once, per shard or over the workers) is
checked.

Usage (from the repository root, after a build):
  bench/recovery.py [--kills 20] [--stops 10] [--shard-losses 5] [--ckpt-steps 150] [--rows 600000]
                    [--interval 1.5] [--modes bsp,ssp,asp,allreduce,hybrid,shrink,hybrid-shrink,ps-shrink] [--json out.json]
"""
import argparse
import json
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time

BIN = "build/bin/troupe"


def percentile(xs, p):
    xs = sorted(xs)
    if not xs:
        return float("nan")
    k = (len(xs) - 1) * p / 100.0
    lo = int(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


SYNC = ("allreduce", "hybrid", "shrink", "hybrid-shrink")


def workers_of(mode):
    return 4 if "shrink" in mode else 2


def job_args(out, rows, mode, name):
    train_mode = {"shrink": "allreduce", "hybrid-shrink": "hybrid"}.get(mode, mode if mode in SYNC else "ps")
    consistency = "bsp" if train_mode != "ps" or mode == "ps-shrink" else mode
    servers = 0 if train_mode == "allreduce" else 2
    # (hybrid-shrink: BSP shards, as consistency is bsp for every sync mode)
    return [BIN, "train", "--config", "configs/dlrm-synthetic.toml",
            "--set", f"data.synthetic.rows={rows}", "--set", f"run.dir={out}/runs", "--set", f"run.name={name}",
            "--set", f"cluster.workers={workers_of(mode)}", "--set", f"cluster.servers={servers}",
            "--set", f"train.mode={train_mode}", "--set", f"ps.consistency={consistency}",
            "--set", "supervision.max_restarts=1000", "--set", "supervision.restart_window_s=1",
            "--set", f"supervision.on_worker_loss={'shrink' if 'shrink' in mode else 'restart'}",
            "--summary-json", f"{out}/{name}.json"]


def dense_hash(s):
    return s["worker_reports"][0]["dense_hash"]


def read(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def worker_pid(out, name, rank):
    pids = re.findall(rf"worker {rank} \(pid (\d+)\)", read(f"{out}/runs/{name}/worker-{rank}.log"))
    return int(pids[-1]) if pids else None


def progress(log):
    pcts = re.findall(r"train +(\d+)%", log)
    return int(pcts[-1]) if pcts else 0


def faulty_run(out, rows, mode, name, sig, wanted, interval):
    """One job; signals workers while it trains. Returns (signal times, summary)."""
    log_path = f"{out}/{name}.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(job_args(out, rows, mode, name), stdout=log, stderr=subprocess.STDOUT)
    sent = []
    # Ranks to signal, in turn (shrink: each once, rank 0 stays; ps-shrink:
    # two, each in a process of its own, so one signal is one loss).
    ranks = [1, 2, 3] if mode in ("shrink", "hybrid-shrink") else [1, 2] if mode == "ps-shrink" else [0, 1]
    once = "shrink" in mode
    deadline = time.time() + 600
    while proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
        text = read(log_path)
        if "training starts" not in text:
            continue
        # Recovered: the replacement is ready (ps mode), the group trains again (sync modes).
        ready = text.count("trains again from step" if mode in SYNC else "it replaces the lost process")
        if len(sent) > ready or len(sent) >= wanted or (once and len(sent) >= len(ranks)):
            continue  # a replacement is still coming, or enough were sent
        if progress(text) >= 85:
            continue  # leave the end of training alone
        if sent and time.time() - sent[-1] < interval:
            continue
        rank = ranks[len(sent) % len(ranks)]
        pid = worker_pid(out, name, rank)
        if pid is None:
            continue
        try:
            t = time.time()
            os.kill(pid, sig)
            sent.append(t)
        except ProcessLookupError:
            pass
    rc = proc.wait(timeout=max(1, deadline - time.time()))
    if rc != 0:
        sys.exit(f"{name}: the job failed (exit {rc}); see {log_path}")
    return sent, json.load(open(f"{out}/{name}.json"))


def measure(out, rows, mode, sig, count, interval, free_auc, free_hash):
    detect, recover, aucs, ledgers, same = [], [], [], [], []
    undone = 0  # steps a shard undid (hybrid-shrink)
    n = 0
    while len(detect) < count:
        name = f"{mode}-{'kill' if sig == signal.SIGKILL else 'stop'}-{n}"
        n += 1
        sent, s = faulty_run(out, rows, mode, name, sig, count - len(detect), interval)
        events = s["recovery"]
        if len(events) != len(sent):
            sys.exit(f"{name}: {len(sent)} signals but {len(events)} losses recorded")
        for t, e in zip(sent, events):
            action = {"shrink": "went on without it", "hybrid-shrink": "went on without it",
                      "ps-shrink": "moved to the process of worker"}.get(mode, "replaced")
            if not e["action"].startswith(action) or e["seconds_to_recover"] is None:
                sys.exit(f"{name}: a loss was not recovered: {e}")
            detect.append(e["lost_at_unix"] - t)
            recover.append(e["seconds_to_recover"])
        undone += sum(len(re.findall(r"undid step", read(p)))
                      for p in (f"{out}/runs/{name}/ps-{i}.log" for i in range(2)))
        aucs.append(s["test_auc"] - free_auc)
        ledgers.append(s["ledger"]["exact"])
        same.append(dense_hash(s) == free_hash)
    return {"losses": len(detect), "jobs": n,
            "detect_s": {"p50": percentile(detect, 50), "p99": percentile(detect, 99), "max": max(detect)},
            "recover_s": {"p50": percentile(recover, 50), "p99": percentile(recover, 99), "max": max(recover)},
            "auc_change": {"min": min(aucs), "max": max(aucs)}, "ledger_exact": all(ledgers),
            "same_bits": f"{sum(same)}/{len(same)}", "steps_undone_at_shards": undone}


def ps_pid(out, name, rank):
    pids = re.findall(rf"ps {rank} \(pid (\d+)\)", read(f"{out}/runs/{name}/ps-{rank}.log"))
    return int(pids[-1]) if pids else None


def shard_losses(out, rows, count, ckpt_steps, free_auc, mode="bsp"):
    """Kills parameter servers of BSP (or hybrid) jobs with checkpoints; each loss rolls the job back."""
    detect, recover, redone, aucs, ledgers = [], [], [], [], []
    rng = random.Random(7)
    n = 0
    while len(detect) < count:
        name = f"{mode}-shard-{n}"
        n += 1
        args = job_args(out, rows, mode, name) + ["--set", f"checkpoint.every_steps={ckpt_steps}"]
        log_path = f"{out}/{name}.log"
        with open(log_path, "w") as log:
            proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        sent, rank, seen_ckpts = [], 0, 0
        deadline = time.time() + 900
        while proc.poll() is None and time.time() < deadline:
            time.sleep(0.05)
            text = read(log_path)
            written = text.count("written: ")
            rolled = text.count("rolls back to checkpoint")
            if len(sent) >= count - len(detect) or progress(text) >= 85:
                continue
            # Once the last rollback is over and a newer checkpoint exists.
            if rolled < len(sent) or written <= seen_ckpts or text.count("it replaces the lost process") < 3 * len(sent):
                continue
            pid = ps_pid(out, name, rank)
            if pid is None:
                continue
            time.sleep(rng.uniform(0.0, 1.5))  # somewhere between two checkpoints
            t = time.time()
            os.kill(pid, signal.SIGKILL)
            sent.append(t)
            seen_ckpts = written
            rank = 1 - rank
        rc = proc.wait(timeout=max(1, deadline - time.time()))
        if rc != 0:
            sys.exit(f"{name}: the job failed (exit {rc}); see {log_path}")
        s = json.load(open(f"{out}/{name}.json"))
        losses = [e for e in s["recovery"] if e["what"].startswith("ps ")]
        if len(losses) != len(sent) or len(s["rollbacks"]) != len(sent):
            sys.exit(f"{name}: {len(sent)} kills but {len(losses)} shard losses, {len(s['rollbacks'])} rollbacks")
        for t, e, r in zip(sent, losses, s["rollbacks"]):
            # Recovered once the shard and every restarted worker are back.
            back = [x["recovered_at_s"] for x in s["recovery"]
                    if x["lost_at_s"] >= e["lost_at_s"] - 0.5 and x["lost_at_s"] <= e["lost_at_s"] + 0.5]
            if None in back:
                sys.exit(f"{name}: a rollback did not recover: {e}")
            detect.append(e["lost_at_unix"] - t)
            recover.append(max(back) - e["lost_at_s"])
            redone.append(r["steps_redone"])
        aucs.append(s["test_auc"] - free_auc)
        ledgers.append(s["ledger"]["exact"])
    return {"losses": len(detect), "jobs": n, "checkpoint_every_steps": ckpt_steps,
            "detect_s": {"p50": percentile(detect, 50), "p99": percentile(detect, 99), "max": max(detect)},
            "recover_s": {"p50": percentile(recover, 50), "p99": percentile(recover, 99), "max": max(recover)},
            "steps_redone": {"p50": percentile(redone, 50), "max": max(redone)},
            "auc_change": {"min": min(aucs), "max": max(aucs)}, "ledger_exact": all(ledgers)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kills", type=int, default=20)
    ap.add_argument("--stops", type=int, default=10)
    ap.add_argument("--rows", type=int, default=600000)
    ap.add_argument("--interval", type=float, default=1.5)
    ap.add_argument("--shard-losses", type=int, default=5)
    ap.add_argument("--ckpt-steps", type=int, default=150)
    ap.add_argument("--only-shards", action="store_true", help="skip the worker kills")
    ap.add_argument("--modes", default="bsp,ssp,asp,allreduce,hybrid")
    ap.add_argument("--json")
    ap.add_argument("--keep", action="store_true", help="keep the jobs' run directories")
    a = ap.parse_args()
    out = tempfile.mkdtemp(prefix="troupe-recovery-")
    results = {"rows": a.rows, "workers": 2, "servers": 2, "shrink_workers": 4, "interval_s": a.interval}
    for mode in a.modes.split(","):
        if a.only_shards and mode not in ("bsp", "hybrid"):
            continue
        free = f"{mode}-free"
        subprocess.run(job_args(out, a.rows, mode, free), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       check=True)
        free_summary = json.load(open(f"{out}/{free}.json"))
        free_auc, free_hash = free_summary["test_auc"], dense_hash(free_summary)
        if mode in ("bsp", "hybrid") and a.shard_losses > 0:
            r = shard_losses(out, a.rows, a.shard_losses, a.ckpt_steps, free_auc, mode)
            results[f"{mode} ps SIGKILL"] = r
            print(f"{mode} ps SIGKILL x{r['losses']}: detect p50 {r['detect_s']['p50']:.3f} s  p99 {r['detect_s']['p99']:.3f} s"
                  f"  | recover p50 {r['recover_s']['p50']:.3f} s  p99 {r['recover_s']['p99']:.3f} s"
                  f"  | steps redone p50 {r['steps_redone']['p50']:.0f}  max {r['steps_redone']['max']}"
                  f"  | AUC change {r['auc_change']['min']:+.5f} .. {r['auc_change']['max']:+.5f}"
                  f"  | ledger exact: {r['ledger_exact']}", flush=True)
        if a.only_shards:
            continue
        r = measure(out, a.rows, mode, signal.SIGKILL, a.kills, a.interval, free_auc, free_hash)
        r["free_auc"] = free_auc
        results[f"{mode} SIGKILL"] = r
        print(f"{mode} SIGKILL x{r['losses']}: detect p50 {r['detect_s']['p50']:.3f} s  p99 {r['detect_s']['p99']:.3f} s"
              f"  | recover p50 {r['recover_s']['p50']:.3f} s  p99 {r['recover_s']['p99']:.3f} s"
              f"  | AUC change {r['auc_change']['min']:+.5f} .. {r['auc_change']['max']:+.5f}"
              f"  | ledger exact: {r['ledger_exact']}  | same bits as fault-free: {r['same_bits']}"
              f"  | steps undone at shards: {r['steps_undone_at_shards']}", flush=True)
        if mode in ("bsp", "allreduce") and a.stops > 0:
            r = measure(out, a.rows, mode, signal.SIGSTOP, a.stops, max(a.interval, 4.0), free_auc, free_hash)
            results[f"{mode} SIGSTOP"] = r
            print(f"{mode} SIGSTOP x{r['losses']}: detect p50 {r['detect_s']['p50']:.3f} s  p99 {r['detect_s']['p99']:.3f} s"
                  f"  | recover p50 {r['recover_s']['p50']:.3f} s  p99 {r['recover_s']['p99']:.3f} s"
                  f"  | AUC change {r['auc_change']['min']:+.5f} .. {r['auc_change']['max']:+.5f}"
                  f"  | ledger exact: {r['ledger_exact']}  | same bits as fault-free: {r['same_bits']}", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=2)
    if a.keep:
        print(f"run directories kept in {out}")
    else:
        subprocess.run(["rm", "-rf", out])


if __name__ == "__main__":
    main()
