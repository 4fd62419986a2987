"""Train a tiny model with DistributedDataParallel, fed by framework's loader.

Run on CPU with two processes (gloo):

    torchrun --nproc-per-node 2 examples/ddp_train.py
    torchrun --nproc-per-node 2 examples/ddp_train.py --data https://host/corpus.txt

Every rank asks the download manager for the data; exactly one process fetches it
and the others wait for the published file. Every rank then reads a disjoint shard
of it (the reader shards by rank, and by worker inside each rank), and the loader
gives every rank the same number of batches, so DDP's collective calls line up.

The task: predict whether a line has more than `--long` tokens, from a bag of hashed
token embeddings. ``--report-dir`` writes one JSON file per rank (batches seen,
losses), which the tests read.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any, Optional

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from framework import DatasetReader, MultiProcessDataLoader, cached_path

BUNDLED_CORPUS = Path(__file__).resolve().parent.parent / "framework" / "examples" / "corpus.txt"


class BagOfTokens(nn.Module):
    def __init__(self, num_buckets: int, dim: int = 32) -> None:
        super().__init__()
        self.embed = nn.Embedding(num_buckets, dim, padding_idx=0)
        self.out = nn.Linear(dim, 2)

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        # sum (not mean) over tokens keeps the length signal; padding embeds to 0
        logits: torch.Tensor = self.out(self.embed(token_ids).sum(dim=1) / 8.0)
        return logits


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default=str(BUNDLED_CORPUS), help="URL or path of a text file")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--num-buckets", type=int, default=5000)
    parser.add_argument("--long", type=int, default=20, help="the class boundary, in tokens")
    parser.add_argument("--max-instances", type=int, default=None)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--report-dir", type=Path, default=None)
    return parser.parse_args(argv)


def main(argv: Optional[list[str]] = None) -> None:
    args = parse_args(argv)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)  # the same initial weights on every rank

    # One process downloads; the others wait for the atomically published file.
    path = cached_path(args.data, progress=rank == 0)

    reader = DatasetReader.from_config(
        {
            "type": "text",
            "num_buckets": args.num_buckets,
            "keep_text": False,
            "max_instances": args.max_instances,
        }
    )
    loader = MultiProcessDataLoader(
        reader, str(path), batch_size=args.batch_size, num_workers=args.num_workers, quiet=True
    )
    model = DistributedDataParallel(BagOfTokens(args.num_buckets))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    loss_fn = nn.CrossEntropyLoss()

    batches_per_epoch: list[int] = []
    losses: list[float] = []
    start = time.perf_counter()
    for epoch in range(args.epochs):
        seen, total_loss = 0, 0.0
        for batch in loader:
            token_ids = batch["token_ids"]
            labels = ((token_ids != 0).sum(dim=1) > args.long).long()
            optimizer.zero_grad()
            loss = loss_fn(model(token_ids), labels)
            loss.backward()  # DDP all-reduces the gradients: every rank must get here
            optimizer.step()
            seen += 1
            total_loss += loss.item()
        batches_per_epoch.append(seen)
        losses.append(total_loss / max(seen, 1))
        if rank == 0:
            print(f"epoch {epoch + 1}: {seen} batches per rank, mean loss {losses[-1]:.4f}")

    counts = [None] * world
    dist.all_gather_object(counts, batches_per_epoch)
    if rank == 0:
        print(f"batches per rank and epoch: {counts}; {time.perf_counter() - start:.1f}s")
    if args.report_dir is not None:
        args.report_dir.mkdir(parents=True, exist_ok=True)
        report: dict[str, Any] = {
            "rank": rank,
            "world_size": world,
            "pid": os.getpid(),
            "data": str(path),
            "batches_per_epoch": batches_per_epoch,
            "losses": losses,
        }
        (args.report_dir / f"rank{rank}.json").write_text(json.dumps(report), encoding="utf-8")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
