"""The "resume is exactly once" property suites (issue 24): cases, data and one trial.

Shared by tests/data/test_resume_properties.py (one process) and
tests/data/test_resume_properties_distributed.py (gloo ranks, which import this module
by name, ``tests.support.resume_properties``).

A trial: loader A reads one epoch uninterrupted (the reference) and saves its state twice
on the way; loader B loads one of those states, takes some batches, saves again and is
interrupted (break, an exception in the loop body, KeyboardInterrupt, or an exception
inside ``next(it)``); loader C loads B's state and finishes the epoch. The epoch's
instances (A's head, B's, C's) must be exactly one epoch's, and where nothing changed
that decides the batches (the same slots), the very batches of the reference.

A streamed case (text, jsonl, csv) reads the same files as URLs served over HTTP on
127.0.0.1 (`published`): the loader fetches them into a cache folder in the trial's
folder, within a drawn `cache_limit`, `prefetch` ahead, in an order shuffled per epoch.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import torch

from framework.data.collate import DefaultDataCollator
from framework.data.multiprocess import MultiProcessDataLoader
from framework.data.reader import DatasetReader
from framework.data.sampler import BatchSampler
from tests.support.compression import compress
from tests.support.download import FaultServer, serving

Key = Any  # an instance's identity: an id (int) or a line of text (str)
Batches = list[list[Key]]

SOURCES = ("plain", "sharded", "text", "jsonl", "csv")
INTERRUPTS = ("break", "raise", "keyboard", "hold", "close", "in_next")


# -- readers ---------------------------------------------------------------------------------


def make_instance(i: int) -> dict[str, Any]:
    # Two fields of lengths that take turns being the longest: guessed sorting keys
    # depend on which instances the guess sees.
    return {"id": i, "tokens": torch.arange(i % 5 + 1), "tags": torch.arange(tags_length(i))}


def tags_length(i: int) -> int:
    # Each slot's first chunk holds one of the first 6 records (up to 6 slots): guessed
    # sorting keys are "tags" there and "tokens" in later chunks.
    return 8 if i < 6 else 1


class PlainReader(DatasetReader):
    """Not seekable; the loader shards its output (one instance per item)."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.n = n

    def _read(self, file_path: Any) -> Iterator[dict[str, Any]]:
        for i in range(self.n):
            yield make_instance(i)


class SkippingReader(DatasetReader):
    """Not seekable; shards its records itself and yields nothing for those in `skip`
    (at most one instance per record: fewer instances than records)."""

    def __init__(self, n: int, skip: Sequence[int] = ()) -> None:
        super().__init__(manual_distributed_sharding=True, manual_multiprocess_sharding=True)
        self.n = n
        self.skip = frozenset(skip)

    def _read(self, file_path: Any) -> Iterator[dict[str, Any]]:
        for i in self.shard_iterable(range(self.n)):
            if i not in self.skip:
                yield make_instance(i)


class FailingCollator(DefaultDataCollator):
    """Raises `error` on its `fail_at`-th call (from 1): an exception inside ``next(it)``
    where collation runs in this process (eager mode, or lazy with no workers)."""

    def __init__(self, fail_at: int, error: type[BaseException]) -> None:
        super().__init__()
        self.fail_at = fail_at
        self.error = error
        self.calls = 0

    def __call__(self, instances: list[Any]) -> Any:
        self.calls += 1
        if self.calls == self.fail_at:
            raise self.error(f"interrupted inside next(it), collate call {self.calls}")
        return super().__call__(instances)


# -- cases -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class FileSpec:
    records: int  # lines after the header (csv)
    blank: tuple[int, ...] = ()  # records that are blank lines: skipped by every reader
    newline: str = "\n"
    final_newline: bool = True
    bom: bool = False


@dataclass(frozen=True)
class Case:
    source: str
    files: tuple[FileSpec, ...] = ()  # text, jsonl, csv
    compression: str = ""  # their files as they are (""), or ".gz", ".zst"
    n: int = 0  # plain, sharded
    skip: tuple[int, ...] = ()  # sharded
    lazy: Optional[int] = None  # max_instances_in_memory
    bucket: bool = False
    sorting_keys: bool = True
    batch_size: int = 2
    drop_last: bool = False
    shuffle: bool = True
    batches_per_epoch: Optional[int] = None
    seed: int = 0
    workers: tuple[int, int, int] = (0, 0, 0)  # loaders A, B, C
    world: tuple[int, int, int] = (1, 1, 1)  # ranks of A, B, C (the distributed suite)
    even_batches: bool = True
    saves: tuple[int, int] = (1, 2)  # A saves after this many batches (per rank) ...
    resume_from: int = 1  # ... and B loads the first (0) or the second (1) of them
    in_place: bool = False  # B is A itself (A's workers/cache reused), when the topology allows
    take: int = 1  # B's batches before its state is saved and it is interrupted
    interrupt: str = "break"
    save_after_exit: bool = False  # B saves after the loop has exited, not inside it
    next_epoch: bool = False  # C also reads the epoch after
    streamed: bool = False  # text, jsonl, csv: the files served over HTTP, given as URLs
    brace: bool = False  # streamed: as one brace range, not a list of URLs
    cache_limit: Optional[int] = None  # streamed: bytes beyond the least limit the loader takes
    prefetch: int = 2  # streamed


@dataclass
class Data:
    case: Case
    folder: Path
    base: str = ""  # a streamed case's server (`FaultServer.base`)
    paths: list[str] = field(default_factory=list)
    expected: list[Key] = field(default_factory=list)  # every instance's key, in read order

    @property
    def data_path(self) -> Any:
        if self.case.source in ("plain", "sharded"):
            return "unused"
        if self.case.streamed:
            return self.shard_spec()
        return self.paths[0] if len(self.paths) == 1 else list(self.paths)

    def route(self, path: str) -> str:
        """The URL path a streamed case's file is served at (the trial's folder names
        it: unique on a shared server)."""
        return f"/resume/{self.folder.name}/{Path(path).name}"

    def shard_spec(self) -> Any:
        """A streamed case's `data_path`: its files' URLs, or one brace range naming them."""
        if not self.base:
            raise ValueError("a streamed case needs a server: run it with one")
        if self.case.brace:
            ending = f".{self.case.source}{self.case.compression}"
            return self.base + self.route(f"data{{0..{len(self.paths) - 1}}}{ending}")
        urls = [self.base + self.route(path) for path in self.paths]
        return urls[0] if len(urls) == 1 else urls

    def least_cache_limit(self) -> int:
        """The smallest `cache_limit` the loader takes: the `prefetch` + 1 largest files."""
        sizes = sorted((os.path.getsize(path) for path in self.paths), reverse=True)
        return sum(sizes[: self.case.prefetch + 1])


def write_data(case: Case, folder: Path, write: bool = True, base: str = "") -> Data:
    if case.streamed and case.source in ("plain", "sharded"):
        raise ValueError(f"a {case.source!r} case has no files to stream")
    data = Data(case, folder, base)
    if case.source == "plain":
        data.expected = list(range(case.n))
        return data
    if case.source == "sharded":
        data.expected = [i for i in range(case.n) if i not in case.skip]
        return data
    for number, spec in enumerate(case.files):
        lines: list[str] = ["id,text"] if case.source == "csv" else []
        for i in range(spec.records):
            key = 100 * number + i
            length = (key * 7 + number) % 4 + 1
            if i in spec.blank:
                lines.append("")
            elif case.source == "text":
                lines.append(f"f{number}r{i} " + "w " * length)
                data.expected.append(lines[-1])
            elif case.source == "jsonl":
                tags = ["t"] * tags_length(key)
                lines.append(json.dumps({"id": key, "tokens": ["w"] * length, "tags": tags}))
                data.expected.append(key)
            else:
                lines.append(f"{key},{'w' * length}")
                data.expected.append(key)
        body = spec.newline.join(lines) + (spec.newline if spec.final_newline and lines else "")
        raw = body.encode("utf-8")
        if spec.bom:
            raw = b"\xef\xbb\xbf" + raw
        path = folder / f"data{number}.{case.source}{case.compression}"
        if write:
            path.write_bytes(compress(raw, case.compression))
        data.paths.append(str(path))
    return data


def make_reader(data: Data) -> DatasetReader:
    case = data.case
    if case.source == "plain":
        return PlainReader(case.n)
    if case.source == "sharded":
        return SkippingReader(case.n, case.skip)
    if case.source == "csv":
        return DatasetReader.by_name("csv")(field_types={"id": "int"})
    if case.source == "text":
        return DatasetReader.by_name("text")(keep_text=True)
    return DatasetReader.by_name("jsonl")()


def make_loader(
    data: Data, workers: int, collate_fn: Optional[Callable[[list[Any]], Any]] = None
) -> MultiProcessDataLoader:
    case = data.case
    options: dict[str, Any] = {}
    if case.bucket:
        keys = None
        if case.sorting_keys or case.source == "csv":  # csv fields are strings: nothing to guess
            keys = ["text"] if case.source == "csv" else ["tokens"]
        sampler = BatchSampler.by_name("bucket")(
            batch_size=case.batch_size, sorting_keys=keys, drop_last=case.drop_last, shuffle=case.shuffle
        )
        options["batch_sampler"] = sampler
    else:
        options.update(batch_size=case.batch_size, drop_last=case.drop_last, shuffle=case.shuffle)
    if collate_fn is not None:
        options["collate_fn"] = collate_fn
    if case.streamed:
        options.update(cache_dir=str(data.folder / "cache"), prefetch=case.prefetch)
        if case.cache_limit is not None:
            options["cache_limit"] = data.least_cache_limit() + case.cache_limit
    return MultiProcessDataLoader(
        make_reader(data),
        data.data_path,
        num_workers=workers,
        max_instances_in_memory=case.lazy,
        batches_per_epoch=case.batches_per_epoch,
        quiet=True,
        seed=case.seed,
        even_batches=case.even_batches,
        **options,
    )


def keys(batch: Any) -> list[Key]:
    if "id" in batch:
        return [int(x) for x in batch["id"].tolist()]
    # A byte-order mark is no part of a line's identity (the text reader may keep it).
    return [text.lstrip("\ufeff") for text in batch["text"]]


def roundtrip(state: dict[str, Any]) -> dict[str, Any]:
    """A state as a checkpoint gives it back: through JSON (plain data, a copy)."""
    copy: dict[str, Any] = json.loads(json.dumps(state))
    return copy


# -- one trial (one rank's part of it) ---------------------------------------------------------


def run_reference(
    loader: MultiProcessDataLoader, saves: Sequence[int], continuous: bool = False
) -> tuple[Batches, list[dict[str, Any]]]:
    """A's uninterrupted epoch, and the states after 0, 1, ... max(`saves`) batches.

    `continuous`: as a training loop does, a rank whose epoch ended goes on into the next
    one (uneven ranks: it is in its next epoch when the others save)."""
    batches: Batches = []
    states: dict[int, dict[str, Any]] = {}
    iterator = iter(loader)
    step, first, last = 0, True, max(saves)
    while True:
        if step <= last and step not in states:
            states[step] = roundtrip(loader.state_dict())
        try:
            batch = next(iterator)
        except StopIteration:
            if continuous and first and step < last:
                first, iterator = False, iter(loader)
                continue
            break
        step += 1
        if first:
            batches.append(keys(batch))
        elif step > last:
            break
    # Under torch.distributed state_dict() is a collective: a rank whose epoch ended
    # (even_batches=False) goes on calling it as often as the others.
    for point in range(step + 1, last + 1):
        states[point] = roundtrip(loader.state_dict())
    return batches, [states[point] for point in range(last + 1)]


def resume_point(case: Case, saved: int, length: int) -> int:
    """Where the state saved after `saved` batches stands in an epoch of `length`
    batches (the longest rank's): after the epoch's end it describes the next epoch, and
    with batches_per_epoch already after its last batch (the pass carries over)."""
    if case.batches_per_epoch is not None:
        return min(saved, case.batches_per_epoch - 1)
    return min(saved, length)


class Unsuitable(Exception):
    """A case the loader rightly refuses (not a trial)."""


class Interrupted(Exception):
    """The trial's own exception, raised in the loop body."""


def run_interrupted(
    loader: MultiProcessDataLoader, case: Case, collator: Optional[FailingCollator]
) -> tuple[Batches, dict[str, Any], bool]:
    """B's part: `case.take` batches, a saved state (inside the loop, or after it with
    `save_after_exit`), then the interruption. Returns the batches, the state and whether
    the epoch ended before the interruption came."""
    batches: Batches = []
    state: Optional[dict[str, Any]] = None
    ended = False
    if case.take == 0 and not case.save_after_exit and case.interrupt != "in_next":
        state = roundtrip(loader.state_dict())  # loaded, before the first batch
    if case.interrupt in ("hold", "close"):
        iterator = iter(loader)  # as the docs show: `it = iter(loader)`, held until saved
        while len(batches) < case.take:
            try:
                batch = next(iterator)
            except StopIteration:
                ended = True
                break
            batches.append(keys(batch))
            if len(batches) == case.take and not case.save_after_exit:
                state = roundtrip(loader.state_dict())
        if case.interrupt == "close":
            iterator.close()  # type: ignore[attr-defined]
        if state is None:
            state = roundtrip(loader.state_dict())
        del iterator
        return batches, state, ended
    try:
        if case.take > 0 or case.interrupt == "in_next":
            for batch in loader:  # a plain for loop: leaving it drops (closes) the iterator
                batches.append(keys(batch))
                if case.interrupt != "in_next" and len(batches) == case.take:
                    if not case.save_after_exit:
                        state = roundtrip(loader.state_dict())
                    if case.interrupt == "raise":
                        raise Interrupted("an exception in the training loop")
                    if case.interrupt == "keyboard":
                        raise KeyboardInterrupt
                    break
            else:
                ended = True
    except (Interrupted, KeyboardInterrupt):
        pass
    if collator is not None and collator.calls < collator.fail_at:
        collator.fail_at = -1  # the epoch ended first: never fail later
    if state is None:
        state = roundtrip(loader.state_dict())  # after the loop: the state a new user takes
    return batches, state, ended


def read_rest(loader: MultiProcessDataLoader) -> Batches:
    return [keys(batch) for batch in loader]


def flat(batches: Batches) -> list[Key]:
    return [key for batch in batches for key in batch]


def check_epoch(
    case: Case,
    data: Data,
    reference: Batches,
    head: Batches,
    middle: Batches,
    tail: Batches,
    same_slots: bool,
) -> None:
    """The interrupted epoch (`head` from A, `middle` from B, `tail` from C) against the
    uninterrupted `reference`."""
    got = flat(head + middle + tail)
    expected = data.expected
    if same_slots:
        assert head + middle + tail == reference, "the same topology must give the very same batches"
    if case.batches_per_epoch is not None:
        assert len(head + middle + tail) == case.batches_per_epoch, "batches_per_epoch batches an epoch"
        assert set(got) <= set(expected), "an instance that the data does not hold"
        return
    duplicated = [key for key, count in Counter(got).items() if count > 1]
    assert not duplicated, f"instances yielded twice in one epoch: {duplicated}"
    if case.drop_last:
        assert set(got) <= set(expected), "an instance that the data does not hold"
        return
    lost = sorted(map(str, Counter(expected) - Counter(got)))
    extra = sorted(map(str, Counter(got) - Counter(expected)))
    assert not lost and not extra, f"lost: {lost}, never in the data: {extra}"


def check_whole_epoch(case: Case, data: Data, batches: Batches) -> None:
    got = flat(batches)
    if case.batches_per_epoch is not None:
        assert len(batches) == case.batches_per_epoch
        return
    assert len(got) == len(set(got)), "an instance twice in one epoch"
    if not case.drop_last:
        assert Counter(got) == Counter(data.expected), "a whole epoch holds every instance once"


# -- streamed cases: their files over HTTP ------------------------------------------------------


@contextmanager
def shard_server() -> Iterator[FaultServer]:
    """The server of a suite's streamed cases (a module's: one for every trial)."""
    with serving(FaultServer()) as server:
        yield server


@contextmanager
def published(server: Optional[FaultServer], data: Data) -> Iterator[None]:
    """A streamed case's files served while the block runs. Then, with no `cache_limit`
    (nothing evicted), no file's bytes were sent twice: one fetch per cache folder, across
    loaders, workers and ranks (counted in bytes: an empty file takes two GETs, as a
    ranged GET of it is answered 416)."""
    if not data.case.streamed:
        yield
        return
    if server is None:
        raise ValueError("a streamed case needs a server: run it with one")
    routes = [data.route(path) for path in data.paths]
    for route, path in zip(routes, data.paths):
        server.add(route, Path(path).read_bytes())
    try:
        yield
        assert sum(server.routes[route].gets for route in routes), "nothing was fetched: not streamed"
        if data.case.cache_limit is None:
            sent = {route: server.routes[route].body_bytes for route in routes}
            again = {route: sent[route] for route in routes if sent[route] > len(server.routes[route].data)}
            assert not again, f"files fetched more than once into one cache folder (bytes sent): {again}"
    finally:
        for route in routes:
            server.routes.pop(route, None)


def run_case(case: Case, folder: Path, server: Optional[FaultServer] = None) -> None:
    """One trial in this process (world size 1); a streamed case's files on `server`."""
    data = write_data(case, folder, base=server.base if server is not None else "")
    with published(server, data):
        try:
            run_loaders(case, data)
        except ValueError as error:
            if "can never be met" in str(error):  # drop_last, batches_per_epoch: refused, rightly
                raise Unsuitable(str(error)) from error
            raise


def run_loaders(case: Case, data: Data) -> None:
    w0, w1, w2 = case.workers
    a = make_loader(data, w0)
    try:
        reference, states = run_reference(a, case.saves)
        check_whole_epoch(case, data, reference)
        start = resume_point(case, case.saves[case.resume_from], len(reference))
        collator: Optional[FailingCollator] = None
        if case.interrupt == "in_next":
            collator = FailingCollator(case.take + 1, KeyboardInterrupt)
        if case.in_place and w1 == w0 and collator is None:
            b = a
        else:
            b = make_loader(data, w1, collator)
        b.load_state_dict(states[start])
        middle, state, ended = run_interrupted(b, case, collator)
        if case.batches_per_epoch is not None and start + len(middle) == case.batches_per_epoch:
            ended = True  # B took the epoch's last batch: its state is the next epoch's
        if b is not a:
            b.close()
        c = make_loader(data, w2)
        try:
            c.load_state_dict(state)
            tail = read_rest(c)
            same = slots(case, w0) == slots(case, w1) == slots(case, w2)
            if ended:
                check_epoch(case, data, reference, reference[:start], middle, [], same)
                check_whole_epoch(case, data, tail)  # B's state is the next epoch's start
            else:
                check_epoch(case, data, reference, reference[:start], middle, tail, same)
                if case.next_epoch:
                    check_whole_epoch(case, data, read_rest(c))
        finally:
            c.close()
    finally:
        a.close()


def slots(case: Case, workers: int) -> int:
    """What decides the batches: eager mode batches one cache whatever num_workers."""
    return 1 if case.lazy is None else max(1, workers)


def property_examples(default: int) -> int:
    return int(os.environ.get("FRAMEWORK_PROPERTY_EXAMPLES", str(default)))


def property_settings(examples: int) -> Any:
    """The suites' hypothesis settings: `examples` trials, no deadline (a trial starts
    processes), the failing case printed as a blob to replay."""
    from hypothesis import HealthCheck, settings

    return settings(
        max_examples=examples,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        print_blob=True,
    )


def print_trials(request: Any, label: str, count: int, streamed: int = 0) -> None:
    """Say how many trials a suite ran, and how many streamed, past pytest's capture
    (read in long runs)."""
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    if capture is not None and count:
        with capture.global_and_fixture_disabled():
            print(f"\n{label}: {count} trials run ({streamed} streamed)")


# -- torch.distributed: ranks that serve many trials -------------------------------------------


def serve(connection: Any) -> None:
    """A rank process kept for the whole suite (starting torch per trial costs seconds):
    each message is one phase of a trial, in a process group made for that phase."""
    import traceback

    while True:
        message = connection.recv()
        if message is None:
            return
        try:
            connection.send(("ok", run_phase(*message)))
        except BaseException:  # reported to the test, which fails
            connection.send(("error", traceback.format_exc()))


def run_phase(
    phase: str, rank: int, world: int, store: str, case: Case, folder: str, base: str, state: Any
) -> Any:
    """One rank's part of phase "A" (the reference epoch and its states), "B" (resume,
    take, save, interrupt) or "C" (resume, read the rest)."""
    from datetime import timedelta

    import torch.distributed as dist

    dist.init_process_group(
        "gloo", init_method=f"file://{store}", world_size=world, rank=rank, timeout=timedelta(seconds=20)
    )
    try:
        data = write_data(case, Path(folder), write=False, base=base)
        workers = case.workers["ABC".index(phase)]
        loader = make_loader(data, workers)
        try:
            if phase == "A":
                return run_reference(loader, case.saves, continuous=not case.even_batches)
            loader.load_state_dict(state)
            if phase == "B":
                return run_interrupted(loader, case, None)
            tail = read_rest(loader)
            return tail, read_rest(loader) if case.next_epoch else None
        finally:
            loader.close()
            dist.barrier()
    finally:
        dist.destroy_process_group()


NEVER_MET = "can never be met"  # drop_last and batches_per_epoch: a pass with no batch, refused


class Ranks:
    """The rank processes of the distributed suite (started once, again after a failure)."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.phases = 0
        self.start()

    def start(self) -> None:
        import multiprocessing

        # Forked: a spawned rank pays seconds to import torch; these hold no threads yet.
        context = multiprocessing.get_context("fork")
        self.connections: list[Any] = []
        self.processes: list[Any] = []
        for _ in range(self.count):
            here, there = context.Pipe()
            process = context.Process(target=serve, args=(there,))  # not daemonic: it starts workers
            process.start()
            self.connections.append(here)
            self.processes.append(process)

    def run(self, phase: str, world: int, data: Data, state: Any = None, timeout: float = 120) -> list[Any]:
        self.phases += 1
        store = str(data.folder / f"store{self.phases}")
        for rank in range(world):
            message = (phase, rank, world, store, data.case, str(data.folder), data.base, state)
            self.connections[rank].send(message)
        results = []
        errors = []
        for rank in range(world):
            if not self.connections[rank].poll(timeout):
                errors.append(f"rank {rank} of {world}, phase {phase}: no answer in {timeout} s")
                break
            status, result = self.connections[rank].recv()
            if status == "error":
                errors.append(f"rank {rank} of {world}, phase {phase}:\n{result}")
            results.append(result)
        if errors:
            self.close()  # a rank may still wait in a collective: fresh ones for the next trial
            self.start()
            raise AssertionError("\n".join(errors))
        return results

    def close(self) -> None:
        for connection in self.connections:
            try:
                connection.send(None)
            except OSError:
                pass
        for process in self.processes:
            process.join(5)
            if process.is_alive():
                process.kill()
                process.join()


def run_distributed_case(
    ranks: Ranks, case: Case, folder: Path, server: Optional[FaultServer] = None
) -> None:
    """One trial over gloo ranks: A, B and C each with their world size and num_workers;
    a streamed case's files on `server` (in this process: the ranks fetch by URL)."""
    data = write_data(case, folder, base=server.base if server is not None else "")
    with published(server, data):
        try:
            run_ranks(ranks, case, data)
        except AssertionError as error:
            if NEVER_MET in str(error):
                raise Unsuitable(str(error)) from error
            raise


def run_ranks(ranks: Ranks, case: Case, data: Data) -> None:
    wa, wb, wc = case.world
    reference_parts = ranks.run("A", wa, data)
    references = [batches for batches, _ in reference_parts]
    for point in range(max(case.saves) + 1):
        assert all(states[point] == reference_parts[0][1][point] for _, states in reference_parts), (
            "every rank returns the same whole-job state"
        )
    epoch = flat([batch for batches in references for batch in batches])
    if case.batches_per_epoch is None:  # (else a new pass may begin within the epoch)
        assert len(epoch) == len(set(epoch)), "an instance twice in one epoch"
    if not case.even_batches and not case.drop_last and case.batches_per_epoch is None:
        assert Counter(epoch) == Counter(data.expected), "a whole epoch holds every instance once"
    start = resume_point(case, case.saves[case.resume_from], max(map(len, references)))
    middles = ranks.run("B", wb, data, reference_parts[0][1][start])
    states = [state for _, state, _ in middles]
    assert all(state == states[0] for state in states), "every rank returns the same whole-job state"
    ended = all(done for _, _, done in middles)
    if case.batches_per_epoch is not None and start + len(middles[0][0]) == case.batches_per_epoch:
        ended = True
    tails = ranks.run("C", wc, data, states[0])
    heads = [batches[:start] for batches in references]
    middle = [batch for batches, _, _ in middles for batch in batches]
    tail = [] if ended else [batch for batches, _ in tails for batch in batches]
    got = flat([batch for batches in heads for batch in batches] + middle + tail)
    duplicated = [key for key, count in Counter(got).items() if count > 1]
    if case.batches_per_epoch is None:
        assert not duplicated, f"instances yielded twice in one epoch: {duplicated}"
    assert set(got) <= set(data.expected), "an instance that the data does not hold"
    if not case.even_batches and not case.drop_last and case.batches_per_epoch is None:
        lost = sorted(map(str, Counter(data.expected) - Counter(got)))
        assert not lost, f"lost: {lost}"
    same = wa == wb == wc and slots(case, case.workers[0]) == slots(case, case.workers[1]) == slots(
        case, case.workers[2]
    )
    if same:
        for rank in range(wa):
            mine = heads[rank] + middles[rank][0] + ([] if ended else tails[rank][0])
            assert mine == references[rank], f"rank {rank}: the same topology must give the very same batches"
    if ended:  # B's state is the next epoch's start: C's read is that epoch
        following = [batch for batches, _ in tails for batch in batches]
    elif case.next_epoch:
        following = [batch for _, after in tails for batch in after or []]
    else:
        return
    whole = flat(following)
    if case.batches_per_epoch is None:
        assert len(whole) == len(set(whole)), "an instance twice in the epoch after"
        if not case.even_batches and not case.drop_last:
            assert Counter(whole) == Counter(data.expected), "the epoch after is a whole epoch"
