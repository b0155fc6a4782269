#!/usr/bin/env python3
"""The accuracy each gradient codec costs (issue 15): every codec in every
mode, on the DLRM (synthetic Criteo-format data with a planted model) and on
the MLP (Fashion-MNIST), each beside the uncompressed run of the same mode
and seed. Two workers; two parameter servers in ps and hybrid modes.

  ps bsp / ps asp   compression.push = CODEC (pulls whole)
  allreduce         compression.allreduce = CODEC
  hybrid (DLRM)     compression.push = compression.allreduce = CODEC

TROUPE_BIN names the binary (default build/bin/troupe; a copy keeps a long
sweep on one build). Writes one JSON line per run to $OUT/quality.jsonl (resumable: runs already
there are not run again) and prints the markdown table of bench/RESULTS.md.

  bench/compression_quality.py [--dlrm-rows 1000000] [--mlp-epochs 10]
                               [--codecs none,fp16,...] [--models dlrm,mlp]
                               [--warmup 0] [--out runs/compression-quality]
"""
import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CODECS = ["none", "fp16", "bf16", "int8", "onebit", "topk", "randomk"]
MODES = {"dlrm": ["bsp", "asp", "allreduce", "hybrid"], "mlp": ["bsp", "asp", "allreduce"]}


def settings(model, mode, codec, args):
    s = ["cluster.workers=2", "compression.warmup_steps=%d" % args.warmup, "run.seed=%d" % args.seed]
    if model == "dlrm":
        s += ["data.synthetic.rows=%d" % args.dlrm_rows]
    else:
        s += ["train.epochs=%d" % args.mlp_epochs]
    if mode in ("bsp", "asp"):
        s += ["train.mode=ps", "cluster.servers=2", "ps.consistency=" + mode, "compression.push=" + codec]
    elif mode == "allreduce":
        s += ["train.mode=allreduce", "compression.allreduce=" + codec]
    else:
        s += ["train.mode=hybrid", "cluster.servers=2", "ps.consistency=bsp", "compression.push=" + codec,
              "compression.allreduce=" + codec]
    return s


def run(model, mode, codec, args):
    config = "configs/dlrm-synthetic.toml" if model == "dlrm" else "configs/mlp-fashion-mnist.toml"
    name = "%s-%s-%s-w%d" % (model, mode, codec, args.warmup)
    summary = os.path.join(args.out, name + ".json")
    cmd = [os.environ.get("TROUPE_BIN", os.path.join(HERE, "build/bin/troupe")), "train", "--config", config, "--summary-json", summary,
           "--set", "run.dir=" + os.path.join(args.out, "runs"), "--set", "run.name=" + name]
    for s in settings(model, mode, codec, args):
        cmd += ["--set", s]
    start = time.time()
    try:
        p = subprocess.run(cmd, cwd=HERE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                           timeout=3600)
    except subprocess.TimeoutExpired:
        return {"model": model, "mode": mode, "codec": codec, "warmup": args.warmup, "seed": args.seed,
                "error": "no end in an hour"}
    if p.returncode != 0:
        sys.stderr.write(p.stderr[-2000:])
        return {"model": model, "mode": mode, "codec": codec, "warmup": args.warmup, "error": p.returncode}
    with open(summary) as f:
        s = json.load(f)
    wire = {w["path"]: {"bytes": w["wire_bytes"], "ratio": w["ratio"]} for w in s.get("wire", [])}
    return {"model": model, "mode": mode, "codec": codec, "warmup": args.warmup, "seed": args.seed,
            "auc": s.get("test_auc"), "accuracy": s.get("test_accuracy"), "wall_s": time.time() - start,
            "steps": s.get("steps"), "wire": wire}


def table(rows):
    out = []
    key = {(r["model"], r["mode"], r["codec"]): r for r in rows if "error" not in r}
    for model in ("dlrm", "mlp"):
        modes = [m for m in MODES[model] if any((model, m, c) in key for c in CODECS)]
        if not modes:
            continue
        metric = "auc" if model == "dlrm" else "accuracy"
        out.append("\n%s: test %s, and its change against the uncompressed run of the same mode "
                   "(%s); in brackets the bytes the compressed path sent against the uncompressed run's\n"
                   % (model.upper(), "AUC" if model == "dlrm" else "accuracy",
                      "x 1000" if model == "dlrm" else "points"))
        out.append("| codec | " + " | ".join(modes) + " |")
        out.append("|---" * (len(modes) + 1) + "|")
        for c in CODECS:
            cells = []
            for m in modes:
                r, base = key.get((model, m, c)), key.get((model, m, "none"))
                if not r:
                    cells.append("")
                    continue
                v = r[metric]
                if c == "none" or not base:
                    cells.append("%.4f" % v)
                    continue
                delta = (v - base[metric]) * (1000 if model == "dlrm" else 100)
                paths = ["push", "allreduce"] if m == "hybrid" else (["allreduce"] if m == "allreduce" else ["push"])
                shares = []
                for p in paths:
                    b, bb = r["wire"].get(p, {}).get("bytes"), base["wire"].get(p, {}).get("bytes")
                    if b and bb:
                        shares.append("%s 1/%.1f" % (p, bb / b))
                cells.append("%.4f (%+.2f) [%s]" % (v, delta, ", ".join(shares)))
            out.append("| %s | %s |" % (c, " | ".join(cells)))
    return "\n".join(out)


def seeds_table(dirs, warmup):
    """The mean over seeds (one --out directory each) of each cell, with the
    seeds' spread (max - min) of the uncompressed runs beside."""
    runs = {}
    for d in dirs:
        with open(os.path.join(d, "quality.jsonl")) as f:
            for l in f:
                r = json.loads(l)
                if "error" in r or r.get("warmup", 0) != warmup:
                    continue
                metric = r["auc"] if r["model"] == "dlrm" else r["accuracy"]
                runs.setdefault((r["model"], r["mode"], r["codec"]), []).append(metric)
    out = []
    for model in ("dlrm", "mlp"):
        modes = [m for m in MODES[model] if (model, m, "none") in runs]
        if not modes:
            continue
        scale = 1000 if model == "dlrm" else 100
        out.append("\n%s, mean of %s seeds: the change against uncompressed (%s); uncompressed: mean and spread\n"
                   % (model.upper(), "/".join(sorted({str(len(v)) for v in runs.values()})),
                      "x 1000 AUC" if model == "dlrm" else "points"))
        out.append("| codec | " + " | ".join(modes) + " |")
        out.append("|---" * (len(modes) + 1) + "|")
        for c in CODECS:
            cells = []
            for m in modes:
                v, base = runs.get((model, m, c)), runs.get((model, m, "none"))
                if not v:
                    cells.append("")
                elif c == "none":
                    cells.append("%.4f (spread %.2f)" % (sum(v) / len(v), (max(v) - min(v)) * scale))
                else:
                    cells.append("%+.2f (n=%d)" % ((sum(v) / len(v) - sum(base) / len(base)) * scale, len(v)))
            out.append("| %s | %s |" % (c, " | ".join(cells)))
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dlrm-rows", type=int, default=1000000)
    ap.add_argument("--mlp-epochs", type=int, default=10)
    ap.add_argument("--codecs", default=",".join(CODECS))
    ap.add_argument("--models", default="dlrm,mlp")
    ap.add_argument("--modes", default="")
    ap.add_argument("--warmup", type=int, default=0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", default=os.path.join(HERE, "runs/compression-quality"))
    ap.add_argument("--table-only", action="store_true")
    ap.add_argument("--seeds", default="", help="DIR,DIR,...: the mean over these runs' directories, one a seed")
    args = ap.parse_args()
    if args.seeds:
        print(seeds_table(args.seeds.split(","), args.warmup))
        return
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "quality.jsonl")
    rows = []
    if os.path.exists(path):
        with open(path) as f:
            rows = [json.loads(l) for l in f if l.strip()]
    done = {(r["model"], r["mode"], r["codec"], r.get("warmup", 0), r.get("seed", 1)) for r in rows
            if "error" not in r}
    if not args.table_only:
        for model in args.models.split(","):
            modes = [m for m in MODES[model] if not args.modes or m in args.modes.split(",")]
            for mode in modes:
                for codec in args.codecs.split(","):
                    if (model, mode, codec, args.warmup, args.seed) in done:
                        continue
                    r = run(model, mode, codec, args)
                    print(json.dumps(r), flush=True)
                    rows.append(r)
                    with open(path, "a") as f:
                        f.write(json.dumps(r) + "\n")
    print(table([r for r in rows if r.get("warmup", 0) == args.warmup and r.get("seed", 1) == args.seed]))


if __name__ == "__main__":
    main()
