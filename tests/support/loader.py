"""Readers and collators for the loader tests, importable by spawned workers.

"Spawn" children inherit sys.path (with the repository root on it), so they unpickle
these classes by module name, ``tests.support.loader``.
"""

from __future__ import annotations

import ctypes
import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Optional

import numpy.random
import torch

from framework.data.reader import DatasetReader


class CountingReader(DatasetReader):
    """Instances ``{"id": i, "tokens": arange(i % 5 + 1), "text": "item i"}`` for i < n."""

    def __init__(self, n: int = 50, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.n = n

    def _read(self, file_path: Any) -> Iterator[dict[str, Any]]:
        for i in range(self.n):
            yield make_instance(i)


def make_instance(i: int) -> dict[str, Any]:
    return {"id": i, "tokens": torch.arange(i % 5 + 1), "text": f"item {i}"}


class FileReader(DatasetReader):
    """One instance per line of a text file: ``{"id": line number, "tokens": ...}``."""

    def _read(self, file_path: Any) -> Iterator[dict[str, Any]]:
        with open(file_path) as handle:
            for number, line in enumerate(handle):
                words = line.split()
                yield {"id": number, "tokens": torch.tensor([len(w) for w in words])}


class ShardingReader(DatasetReader):
    """Shards by itself with `shard_iterable` (both manual flags set)."""

    def __init__(self, n: int = 50, **kwargs: Any) -> None:
        super().__init__(manual_distributed_sharding=True, manual_multiprocess_sharding=True, **kwargs)
        self.n = n

    def _read(self, file_path: Any) -> Iterator[dict[str, Any]]:
        for i in self.shard_iterable(range(self.n)):
            yield make_instance(i)


class RandomReader(CountingReader):
    """Uses the global RNGs inside the worker: seeds must make this reproducible."""

    def _read(self, file_path: Any) -> Iterator[dict[str, Any]]:
        for i in range(self.n):
            instance = make_instance(i)
            instance["noise"] = random.random() + float(torch.rand(())) + numpy.random.random()
            yield instance


class OwnShardRandomReader(DatasetReader):
    """As `RandomReader`, but each worker draws only for its own records (it shards
    before it draws), so workers seeded alike would give alike noise."""

    def __init__(self, n: int = 16) -> None:
        super().__init__(manual_distributed_sharding=True, manual_multiprocess_sharding=True)
        self.n = n

    def _read(self, file_path: Any) -> Iterator[dict[str, Any]]:
        for i in self.shard_iterable(range(self.n)):
            instance = make_instance(i)
            instance["noise"] = random.random() + float(torch.rand(())) + numpy.random.random()
            yield instance


class FailingReader(CountingReader):
    """Raises after `fail_after` instances (in every worker)."""

    def __init__(self, n: int = 50, fail_after: int = 3, **kwargs: Any) -> None:
        super().__init__(n, **kwargs)
        self.fail_after = fail_after

    def _read(self, file_path: Any) -> Iterator[dict[str, Any]]:
        for i, instance in enumerate(super()._read(file_path)):
            if i == self.fail_after:
                raise RuntimeError(f"reader broke on purpose at instance {i}")
            yield instance


class DyingReader(CountingReader):
    """Worker `victim` dies by `how` ("SIGKILL", "SIGSEGV", "abort", "exit") mid-read."""

    def __init__(self, how: str, victim: int = 1, n: int = 400, **kwargs: Any) -> None:
        super().__init__(n, **kwargs)
        self.how = how
        self.victim = victim

    def _read(self, file_path: Any) -> Iterator[dict[str, Any]]:
        info = self.get_worker_info()
        for i, instance in enumerate(super()._read(file_path)):
            if info is not None and info.id == self.victim and i == 20:
                import faulthandler

                faulthandler.disable()  # keep pytest's crash dump out of the test output
                if self.how == "SIGKILL":
                    os.kill(os.getpid(), signal.SIGKILL)
                elif self.how == "SIGSEGV":
                    ctypes.string_at(0)
                elif self.how == "abort":
                    os.abort()
                else:
                    os._exit(3)
            yield instance


class SlowReader(CountingReader):
    """Endless unless `n` given; sleeps `delay` seconds per instance."""

    def __init__(self, n: int = 10**9, delay: float = 0.01, **kwargs: Any) -> None:
        super().__init__(n, **kwargs)
        self.delay = delay

    def _read(self, file_path: Any) -> Iterator[dict[str, Any]]:
        for instance in super()._read(file_path):
            time.sleep(self.delay)
            yield instance


class Vocab:
    """Stands for a heavy, unpicklable object: it holds a lock."""

    def __init__(self) -> None:
        import threading

        self.lock = threading.Lock()

    def index(self, token: int) -> int:
        return token + 100


class HookReader(CountingReader):
    """Attaches the vocabulary in the main process via apply_token_indexers."""

    def __init__(self, n: int = 50, **kwargs: Any) -> None:
        super().__init__(n, **kwargs)
        self.hook_pids: list[int] = []

    def apply_token_indexers(self, instance: Any) -> None:
        instance["indexed"] = torch.tensor([Vocab().index(int(t)) for t in instance["tokens"]])
        instance["hook_pid"] = os.getpid()


class LeakyReader(HookReader):
    """Wrongly attaches the unpicklable vocabulary inside _read (in the worker)."""

    def _read(self, file_path: Any) -> Iterator[dict[str, Any]]:
        for instance in super()._read(file_path):
            instance["vocab"] = Vocab()
            yield instance


class EmptyReader(DatasetReader):
    def _read(self, file_path: Any) -> Iterator[dict[str, Any]]:
        return iter(())


class PidCollator:
    """Not registered: records which process collated (as a batch field)."""

    def __call__(self, instances: list[Any]) -> dict[str, Any]:
        return {"id": torch.tensor([x["id"] for x in instances]), "pid": os.getpid()}


SHM_PREFIXES = ("torch_", "psm_", "sem.mp-", "wnsm_")


def shm_entries() -> set[str]:
    """Shared-memory segments of the kinds torch and multiprocessing create."""
    try:
        return {name for name in os.listdir("/dev/shm") if name.startswith(SHM_PREFIXES)}
    except FileNotFoundError:
        return set()


def new_shm_entries(before: set[str], wait: float = 3.0) -> set[str]:
    """Segments not in `before` that are present now and stay for `wait` seconds.

    multiprocessing unlinks a named semaphore right after creating it, so a
    `sem.mp-*` entry of any other process on the machine can show up for an
    instant (and, with tests running side by side, another one at every look); a
    leaked segment stays, so it is in every look.
    """
    import time

    deadline = time.monotonic() + wait
    extra = {name for name in shm_entries() - before if not _of_another_live_process(name)}
    while extra and time.monotonic() < deadline:
        time.sleep(0.05)
        extra &= shm_entries()
    return extra


def _of_another_live_process(name: str) -> bool:
    """Whether `name` is a torch segment (`torch_<pid>_...`) of a live process outside this
    one's tree: another test running side by side holds it, and frees it itself."""
    parts = name.split("_")
    if parts[0] != "torch" or len(parts) < 3 or not parts[1].isdigit():
        return False
    pid, me = int(parts[1]), os.getpid()
    while pid > 1 and alive(pid):
        if pid == me:
            return False
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return False
    return pid == 1 and pid != me


def child_pids(pid: Optional[int] = None) -> set[int]:
    """Live (non-zombie) children of `pid` (default: this process), from /proc."""
    parent = os.getpid() if pid is None else pid
    found = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[1]) == parent and fields[0] != "Z":
            found.add(int(entry))
    return found


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def flat(lists: Any) -> list[Any]:
    """Concatenate an iterable of lists."""
    return [item for sub in lists for item in sub]


def distributed_rank(rank: int, world: int, port: int, out_dir: str) -> None:
    """One rank of a real gloo group: records what each loader variant yields."""
    import json

    import torch.distributed as dist

    from framework.data.multiprocess import MultiProcessDataLoader

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", world_size=world, rank=rank)
    try:
        results: dict[str, Any] = {}
        for name, options in {
            "lazy_even": {"max_instances_in_memory": 8},
            "lazy_uneven": {"max_instances_in_memory": 8, "even_batches": False},
            "eager_even": {},
            "eager_uneven": {"even_batches": False},
            "sharding_reader": {"max_instances_in_memory": 8, "even_batches": False},
        }.items():
            reader = ShardingReader(50) if name == "sharding_reader" else CountingReader(50)
            data = MultiProcessDataLoader(
                reader, "x", batch_size=4, num_workers=2, quiet=True, seed=0, **options
            )
            results[name] = [batch["id"].tolist() for batch in data]
            dist.barrier()
        with open(f"{out_dir}/rank{rank}.json", "w") as handle:
            json.dump(results, handle)
    finally:
        dist.destroy_process_group()


class ProgressReader(CountingReader):
    """Endless; records in `log` (per worker) how many instances it has produced."""

    def __init__(self, log: str, **kwargs: Any) -> None:
        super().__init__(10**9, **kwargs)
        self.log = log

    def _read(self, file_path: Any) -> Iterator[dict[str, Any]]:
        info = self.get_worker_info()
        path = f"{self.log}.{info.id if info else 0}"
        for count, instance in enumerate(super()._read(file_path), 1):
            Path(path).write_text(str(count))
            yield instance


class StallThenDie(CountingReader):
    """Worker 0 stalls for a long time; worker 1 is killed soon after starting."""

    def _read(self, file_path: Any) -> Iterator[dict[str, Any]]:
        info = self.get_worker_info()
        for instance in super()._read(file_path):
            if info is not None and info.id == 0:
                time.sleep(60)
            elif info is not None:
                time.sleep(0.2)
                os.kill(os.getpid(), signal.SIGKILL)
            yield instance


class LockHolder(threading.Thread):
    """A thread that holds `lock` from its start, as a thread busy with it while the
    loader forks its workers would, until this process has `workers` more live children
    or `release()` is called (at most 30 s). `timed_out`: it let go on its own, so the
    workers may have forked after."""

    def __init__(self, lock: Any, workers: int) -> None:
        super().__init__(daemon=True)
        self.lock, self.workers, self.before = lock, workers, child_pids()
        self.timed_out = False
        self.held, self.done = threading.Event(), threading.Event()
        self.start()
        self.held.wait()

    def run(self) -> None:
        with self.lock:
            self.held.set()
            deadline = time.monotonic() + 30
            while not (self.done.is_set() or len(child_pids() - self.before) >= self.workers):
                if time.monotonic() > deadline:
                    self.timed_out = True
                    return
                time.sleep(0.01)

    def release(self) -> None:
        self.done.set()
        self.join()


REPO_ROOT = Path(__file__).resolve().parents[2]


def make(reader: Any, **kwargs: Any) -> Any:
    """A quiet `MultiProcessDataLoader` of `reader`, batches of 4 unless told."""
    from framework.data.multiprocess import MultiProcessDataLoader

    kwargs.setdefault("quiet", True)
    kwargs.setdefault("batch_size", 4)
    return MultiProcessDataLoader(reader, "unused", **kwargs)


def run_script(tmp_path: Path, body: str, timeout: float = 60) -> str:
    """Run `body` in a fresh interpreter; a hang fails the test after `timeout` s."""
    script = tmp_path / "main.py"
    script.write_text(f"import sys\nsys.path.insert(0, {str(REPO_ROOT)!r})\n" + textwrap.dedent(body))
    try:
        done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as hung:
        raise AssertionError(f"the script hung:\n{hung.stdout}\n{hung.stderr}") from None
    assert done.returncode == 0, done.stderr
    return done.stdout
