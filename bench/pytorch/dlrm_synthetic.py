"""PyTorch reference for troupe's DLRM on the synthetic Criteo data
(bench/compare_pytorch.sh).

Same model: one embedding table per categorical column (sum-pooled bags of
one), bottom MLP with ReLU after every layer, pairwise dot-product
interaction of {bottom output, embeddings}, the embeddings themselves also fed
to the top MLP (troupe's model.concat_embeddings), top MLP, sigmoid + BCE.
Same optimizers: sparse Adagrad on the embedding rows (same learning rate and
initial accumulator), Adam on dense weights, same batch size and threads. Categorical tokens are mapped to row
numbers per table with a dictionary built while reading (not timed); test
tokens never seen in training share one row per table, which, like troupe's
fresh rows, was never trained. Times the training loop only. Prints one JSON
line.
"""
import argparse
import json
import time

import numpy as np
import torch


def load(path, tables, vocab, grow, max_rows):
    labels, dense, cats = [], [], []
    with open(path, "r") as f:
        for i, line in enumerate(f):
            if max_rows >= 0 and i >= max_rows:
                break
            fields = line.rstrip("\n").split("\t")
            labels.append(float(fields[0]))
            dense.append([np.log1p(max(int(v), 0)) if v else 0.0 for v in fields[1:14]])
            row = []
            for t in range(tables):
                tok = fields[14 + t]
                d = vocab[t]
                idx = d.get(tok)
                if idx is None:
                    if grow:
                        idx = len(d) + 1  # 0 is the shared unseen row
                        d[tok] = idx
                    else:
                        idx = 0
                row.append(idx)
            cats.append(row)
    return (torch.tensor(labels, dtype=torch.float32), torch.tensor(dense, dtype=torch.float32),
            torch.tensor(cats, dtype=torch.int64))


def mlp(widths, relu_last):
    layers = []
    for i in range(len(widths) - 1):
        layers.append(torch.nn.Linear(widths[i], widths[i + 1]))
        if i + 2 < len(widths) or relu_last:
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers)


class Dlrm(torch.nn.Module):
    def __init__(self, sizes, dim, bottom, top, concat):
        super().__init__()
        self.concat = concat
        self.emb = torch.nn.ModuleList([torch.nn.EmbeddingBag(n, dim, mode="sum", sparse=True) for n in sizes])
        for e in self.emb:
            torch.nn.init.uniform_(e.weight, -1 / dim ** 0.5, 1 / dim ** 0.5)
        self.bottom = mlp([13] + bottom, True)
        f = len(sizes) + 1
        width = dim + f * (f - 1) // 2 + (len(sizes) * dim if concat else 0)
        self.top = mlp([width] + top + [1], False)
        self.li, self.lj = torch.tril_indices(f, f, offset=-1)

    def forward(self, dense, cats):
        x = self.bottom(dense)
        b = dense.shape[0]
        offsets = torch.arange(b)
        embs = [e(cats[:, t], offsets) for t, e in enumerate(self.emb)]
        z = torch.stack([x] + embs, dim=1)
        inter = torch.bmm(z, z.transpose(1, 2))[:, self.li, self.lj]
        parts = [x, inter] + (embs if self.concat else [])
        return self.top(torch.cat(parts, dim=1)).squeeze(1)


def auc(scores, labels):
    order = np.argsort(scores, kind="mergesort")
    s = scores[order]
    ranks = np.empty(len(s))
    i = 0
    while i < len(s):
        j = i
        while j + 1 < len(s) and s[j + 1] == s[i]:
            j += 1
        ranks[i:j + 1] = (i + j) / 2 + 1
        i = j + 1
    pos = labels[order] > 0.5
    npos = pos.sum()
    nneg = len(s) - npos
    return (ranks[pos].sum() - npos * (npos + 1) / 2) / (npos * nneg)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--dir", required=True)
    p.add_argument("--tables", type=int, default=26)
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--bottom", default="64,16")
    p.add_argument("--top", default="128,64")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--dense-lr", type=float, default=1e-3)
    p.add_argument("--embedding-lr", type=float, default=0.5)
    p.add_argument("--adagrad-initial-accumulator", type=float, default=1e-3)
    p.add_argument("--no-concat-embeddings", action="store_true")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--max-rows", type=int, default=-1)
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    vocab = [dict() for _ in range(a.tables)]
    t0 = time.perf_counter()
    y, xd, xc = load(f"{a.dir}/train.tsv", a.tables, vocab, True, a.max_rows)
    ty, txd, txc = load(f"{a.dir}/test.tsv", a.tables, vocab, False, -1)
    load_seconds = time.perf_counter() - t0
    model = Dlrm([len(v) + 1 for v in vocab], a.dim, [int(w) for w in a.bottom.split(",")],
                 [int(w) for w in a.top.split(",")], not a.no_concat_embeddings)
    sparse = torch.optim.Adagrad([e.weight for e in model.emb], lr=a.embedding_lr,
                                 initial_accumulator_value=a.adagrad_initial_accumulator, eps=1e-8)
    dense = torch.optim.Adam(list(model.bottom.parameters()) + list(model.top.parameters()), lr=a.dense_lr)
    loss_fn = torch.nn.BCEWithLogitsLoss()
    n = y.shape[0]
    start = time.perf_counter()
    for i in range(0, n, a.batch):
        sparse.zero_grad()
        dense.zero_grad()
        loss = loss_fn(model(xd[i:i + a.batch], xc[i:i + a.batch]), y[i:i + a.batch])
        loss.backward()
        sparse.step()
        dense.step()
    train_seconds = time.perf_counter() - start
    with torch.no_grad():
        p = torch.sigmoid(torch.cat([model(txd[i:i + 4096], txc[i:i + 4096]) for i in range(0, ty.shape[0], 4096)]))
    pn, yn = p.numpy().astype(np.float64), ty.numpy()
    pc = np.clip(pn, 1e-7, 1 - 1e-7)
    logloss = float(-(yn * np.log(pc) + (1 - yn) * np.log(1 - pc)).mean())
    print(json.dumps({"peer": "pytorch", "torch": torch.__version__, "model": "dlrm", "test_auc": float(auc(pn, yn)),
                      "test_logloss": logloss, "samples_per_sec": n / train_seconds, "train_seconds": train_seconds,
                      "load_seconds": load_seconds, "rows": n, "batch_size": a.batch, "threads": a.threads}))


if __name__ == "__main__":
    main()
