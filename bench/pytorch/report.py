"""Prints the troupe / PyTorch comparison of bench/compare_pytorch.sh and
writes DIR/compare.json.

MLP model FLOP utilisation: 6 x dense weights x samples/s (forward 2, backward
4 FLOPs per weight and sample) over the sgemm FLOP/s of the same run.

DLRM roofline efficiency: the lower bound on time per sample, dense FLOPs at
the sgemm rate plus the embedding bytes at the memcpy rate, over the measured
time per sample. Embedding bytes per sample: for each unique row pulled
(embedding_rows_per_sample), the weights read for the pull, the gradient
written, and the weights and optimizer state read and written by the update.
"""
import json
import sys


def load(path):
    with open(path) as f:
        return json.loads(f.read())


def main(out):
    c = load(f"{out}/ceilings.json")
    try:  # measured again at the end of the run: keep the better figure of each
        e = load(f"{out}/ceilings_end.json")
        c = {"threads": c["threads"], "memcpy_gbps": max(c["memcpy_gbps"], e["memcpy_gbps"]),
             "sgemm_gflops": max(c["sgemm_gflops"], e["sgemm_gflops"]), "blas_core": c.get("blas_core", "?")}
    except FileNotFoundError:
        pass
    tm, pm = load(f"{out}/troupe_mlp.json"), load(f"{out}/pytorch_mlp.json")
    td, pd = load(f"{out}/troupe_dlrm.json"), load(f"{out}/pytorch_dlrm.json")
    sgemm = c["sgemm_gflops"] * 1e9
    memcpy = c["memcpy_gbps"] * 1e9

    mlp_flops = 6 * tm["dense_macs_per_sample"]
    mfu_t = mlp_flops * tm["samples_per_sec"] / sgemm
    mfu_p = mlp_flops * pm["samples_per_sec"] / sgemm

    dim = td["embedding_dim"]
    state_slots = {"sgd": 0, "adagrad": 1, "adam": 2, "ftrl": 2}[td["embedding_optimizer"]]
    row_bytes = 4 * dim
    bytes_per_row = row_bytes * (1 + 1 + 2 * (1 + state_slots))
    emb_bytes = td["embedding_rows_per_sample"] * bytes_per_row
    dense_flops = 6 * td["dense_macs_per_sample"]
    bound = dense_flops / sgemm + emb_bytes / memcpy
    roof_t = bound * td["samples_per_sec"]
    roof_p = bound * pd["samples_per_sec"]

    result = {
        "ceilings": c,
        "mlp": {"troupe_samples_per_sec": tm["samples_per_sec"], "pytorch_samples_per_sec": pm["samples_per_sec"],
                "ratio": tm["samples_per_sec"] / pm["samples_per_sec"],
                "troupe_test_accuracy": tm["test_accuracy"], "pytorch_test_accuracy": pm["test_accuracy"],
                "troupe_mfu": mfu_t, "pytorch_mfu": mfu_p},
        "dlrm": {"troupe_samples_per_sec": td["samples_per_sec"], "pytorch_samples_per_sec": pd["samples_per_sec"],
                 "ratio": td["samples_per_sec"] / pd["samples_per_sec"],
                 "troupe_test_auc": td["test_auc"], "pytorch_test_auc": pd["test_auc"],
                 "oracle_auc": td.get("oracle_auc"),
                 "lower_bound_us_per_sample": bound * 1e6, "troupe_roofline": roof_t, "pytorch_roofline": roof_p,
                 "embedding_bytes_per_sample": emb_bytes, "dense_flops_per_sample": dense_flops},
    }
    with open(f"{out}/compare.json", "w") as f:
        json.dump(result, f, indent=2)
    m, d = result["mlp"], result["dlrm"]
    print(f"ceilings: sgemm {c['sgemm_gflops']:.1f} GFLOP/s, memcpy {c['memcpy_gbps']:.1f} GB/s, "
          f"{c['threads']} threads, OpenBLAS core {c.get('blas_core', '?')}")
    print(f"MLP : troupe {m['troupe_samples_per_sec']:9.0f} samples/s (acc {m['troupe_test_accuracy']:.4f}, "
          f"MFU {100 * m['troupe_mfu']:.1f}%)   pytorch {m['pytorch_samples_per_sec']:9.0f} samples/s "
          f"(acc {m['pytorch_test_accuracy']:.4f}, MFU {100 * m['pytorch_mfu']:.1f}%)   ratio {m['ratio']:.2f}x")
    print(f"DLRM: troupe {d['troupe_samples_per_sec']:9.0f} samples/s (AUC {d['troupe_test_auc']:.4f}, "
          f"roofline {100 * d['troupe_roofline']:.1f}%)   pytorch {d['pytorch_samples_per_sec']:9.0f} samples/s "
          f"(AUC {d['pytorch_test_auc']:.4f}, roofline {100 * d['pytorch_roofline']:.1f}%)   "
          f"ratio {d['ratio']:.2f}x   oracle AUC {d['oracle_auc']:.4f}")
    print(f"written: {out}/compare.json")


if __name__ == "__main__":
    main(sys.argv[1])
