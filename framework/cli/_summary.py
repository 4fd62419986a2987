"""What `framework run` reports: one rank's figures, a torchrun job's, and their print.

Under torchrun every rank counts its own batches; rank 0 prints the job's summary
(`combined`): counts summed over the ranks, the time and memory of the slowest and
largest rank, and each rank's counts beside them.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import Any, Optional

__all__ = ["batch_size", "combined", "peak_memory_mib", "print_summary", "rates"]


def batch_size(batch: Any) -> int:
    """How many instances a collated batch holds (the first dimension of its fields)."""
    if isinstance(batch, Mapping):
        for value in batch.values():
            size = batch_size(value)
            if size:
                return size
        return 0
    shape = getattr(batch, "shape", None)
    if shape is not None:
        return int(shape[0]) if len(shape) else 1
    if isinstance(batch, (list, tuple)):
        return len(batch)
    return 1


def peak_memory_mib() -> dict[str, float]:
    """This process's and its largest child's peak resident memory, in MiB."""
    try:
        import resource
    except ImportError:  # Windows
        return {"main_mib": 0.0, "largest_worker_mib": 0.0}
    # ru_maxrss is in KiB on Linux (bytes on macOS).
    scale = 1024 * 1024 if sys.platform == "darwin" else 1024
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale / 2**20
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * scale / 2**20
    return {"main_mib": round(own, 1), "largest_worker_mib": round(children, 1)}


def rates(instances: int, batches: int, seconds: float) -> dict[str, Optional[float]]:
    """Instances and batches per second (None when no time passed)."""
    return {
        "instances_per_s": round(instances / seconds, 1) if seconds > 0 else None,
        "batches_per_s": round(batches / seconds, 1) if seconds > 0 else None,
    }


def combined(per_rank: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The job's summary from each rank's (in rank order): rank 0's paths, counts
    summed, the slowest rank's time (and first batch: the job trains once every rank
    has one), the largest rank's memory, and each rank's counts under `"per_rank"`."""
    job = dict(per_rank[0])
    instances = sum(each["instances"] for each in per_rank)
    batches = sum(each["batches"] for each in per_rank)
    seconds = max(each["seconds"] for each in per_rank)
    firsts = [each["time_to_first_batch_s"] for each in per_rank]
    job.update(instances=instances, batches=batches, seconds=seconds, **rates(instances, batches, seconds))
    job["time_to_first_batch_s"] = None if None in firsts else max(firsts)
    job["peak_memory"] = {
        key: max(each["peak_memory"][key] for each in per_rank) for key in per_rank[0]["peak_memory"]
    }
    job["ranks"] = len(per_rank)
    job["per_rank"] = [
        {key: each[key] for key in ("instances", "batches", "seconds", "time_to_first_batch_s")}
        for each in per_rank
    ]
    return job


def print_summary(summary: Mapping[str, Any]) -> None:
    """`summary` as aligned rows on stdout."""
    memory = summary["peak_memory"]
    memory_text = f"{memory['main_mib']} MiB main, {memory['largest_worker_mib']} MiB largest worker"
    if "cuda_mib" in memory:
        memory_text += f", {memory['cuda_mib']} MiB on {summary['device']}"
    first = summary["time_to_first_batch_s"]
    cached_at = summary["cached_at"]
    rows = [
        ("config", summary["config"]),
        ("data", summary["data_path"]),
        ("cached at", "(a local path, read in place)" if cached_at == summary["data_path"] else cached_at),
        ("epochs", summary["epochs"]),
        ("instances", summary["instances"]),
        ("batches", summary["batches"]),
        ("instances/s", summary["instances_per_s"]),
        ("batches/s", summary["batches_per_s"]),
        ("first batch", f"{first * 1000:.1f} ms" if first is not None else "no batches"),
        ("peak memory", memory_text),
    ]
    if "ranks" in summary:
        counts = ", ".join(str(each["instances"]) for each in summary["per_rank"])
        ranks = f"{summary['ranks']} (counts summed, times and memory the largest rank's; "
        rows.insert(3, ("ranks", f"{ranks}instances per rank: {counts})"))
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"{name.ljust(width)}  {value}")
    sys.stdout.flush()
