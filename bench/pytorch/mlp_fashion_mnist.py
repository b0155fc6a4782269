"""PyTorch reference for troupe's MLP on Fashion-MNIST (bench/compare_pytorch.sh).

Same model (784-256-128-10, ReLU, softmax cross-entropy), same data files,
same batch size, optimizer (Adam), learning rate and per-epoch decay, same
thread count. Times
the training loop only (evaluation excluded), as troupe's samples_per_sec does.
Prints one JSON line.
"""
import argparse
import gzip
import json
import time

import numpy as np
import torch


def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    magic = int.from_bytes(data[0:4], "big")
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(magic & 0xFF)]
    offset = 4 + 4 * len(dims)
    return np.frombuffer(data, dtype=np.uint8, offset=offset).reshape(dims)


def load_fashion_mnist(directory):
    """Training images, labels, test images, labels; pixels scaled to [0, 1]."""
    def images(name):
        return torch.from_numpy(read_idx(f"{directory}/{name}").reshape(-1, 784).astype(np.float32) / 255.0)

    def labels(name):
        return torch.from_numpy(read_idx(f"{directory}/{name}").astype(np.int64))

    return (images("train-images-idx3-ubyte.gz"), labels("train-labels-idx1-ubyte.gz"),
            images("t10k-images-idx3-ubyte.gz"), labels("t10k-labels-idx1-ubyte.gz"))


def make_mlp():
    """troupe's MLP: 784-256-128-10 with ReLU between the layers."""
    return torch.nn.Sequential(torch.nn.Linear(784, 256), torch.nn.ReLU(), torch.nn.Linear(256, 128),
                               torch.nn.ReLU(), torch.nn.Linear(128, 10))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--dir", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--lr-decay", type=float, default=0.9, help="learning rate x this after every epoch")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    x, y, tx, ty = load_fashion_mnist(a.dir)
    model = make_mlp()
    opt = torch.optim.Adam(model.parameters(), lr=a.lr)
    sched = torch.optim.lr_scheduler.ExponentialLR(opt, gamma=a.lr_decay)
    loss_fn = torch.nn.CrossEntropyLoss()
    n = x.shape[0]
    train_seconds = 0.0
    samples = 0
    for epoch in range(a.epochs):
        g = torch.Generator().manual_seed(a.seed * 1000 + epoch)
        order = torch.randperm(n, generator=g)
        start = time.perf_counter()
        for i in range(0, n, a.batch):
            idx = order[i:i + a.batch]
            opt.zero_grad()
            loss = loss_fn(model(x[idx]), y[idx])
            loss.backward()
            opt.step()
            samples += idx.shape[0]
        train_seconds += time.perf_counter() - start
        sched.step()
    with torch.no_grad():
        acc = (model(tx).argmax(1) == ty).float().mean().item()
    weights = sum(p.numel() for p in model.parameters())
    print(json.dumps({"peer": "pytorch", "torch": torch.__version__, "model": "mlp", "test_accuracy": acc,
                      "samples_per_sec": samples / train_seconds, "train_seconds": train_seconds,
                      "epochs": a.epochs, "batch_size": a.batch, "threads": a.threads,
                      "dense_parameters": weights}))


if __name__ == "__main__":
    main()
