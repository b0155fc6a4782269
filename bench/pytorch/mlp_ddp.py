"""PyTorch DistributedDataParallel peer of troupe's sync mode (bench/sync_vs_ddp.sh).

Same model (784-256-128-10), data, per-worker batch, optimizer (Adam) and
learning rate as `troupe train --config configs/mlp-fashion-mnist.toml
--set cluster.workers=W --set train.mode=allreduce`: W processes on
loopback, gloo backend, each training every W-th batch of a shuffled epoch
with gradients averaged by DDP's bucketed all-reduce. Times the training
loop only. Rank 0 prints one JSON line (samples/s of all workers together).
"""
import argparse
import json
import os
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from mlp_fashion_mnist import load_fashion_mnist, make_mlp


def run(rank, a):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(a.port)
    torch.set_num_threads(a.threads)
    dist.init_process_group("gloo", rank=rank, world_size=a.workers)
    torch.manual_seed(a.seed)
    x, y, tx, ty = load_fashion_mnist(a.dir)
    model = make_mlp()
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.Adam(ddp.parameters(), lr=a.lr)
    loss_fn = torch.nn.CrossEntropyLoss()
    n = x.shape[0]
    steps = n // (a.batch * a.workers)  # every rank takes the same number of steps
    train_seconds = 0.0
    samples = 0
    for epoch in range(a.epochs):
        g = torch.Generator().manual_seed(a.seed * 1000 + epoch)
        order = torch.randperm(n, generator=g)
        dist.barrier()
        start = time.perf_counter()
        for s in range(steps):
            i = (s * a.workers + rank) * a.batch
            idx = order[i:i + a.batch]
            opt.zero_grad()
            loss = loss_fn(ddp(x[idx]), y[idx])
            loss.backward()
            opt.step()
            samples += idx.shape[0]
        dist.barrier()
        train_seconds += time.perf_counter() - start
    if rank == 0:
        with torch.no_grad():
            acc = (model(tx).argmax(1) == ty).float().mean().item()
        print(json.dumps({"peer": "pytorch-ddp", "torch": torch.__version__, "workers": a.workers,
                          "test_accuracy": acc, "samples_per_sec": samples * a.workers / train_seconds,
                          "train_seconds": train_seconds, "epochs": a.epochs, "batch_size": a.batch,
                          "threads_per_worker": a.threads}), flush=True)
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--dir", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--port", type=int, default=29517)
    a = p.parse_args()
    mp.spawn(run, args=(a,), nprocs=a.workers, join=True)


if __name__ == "__main__":
    main()
