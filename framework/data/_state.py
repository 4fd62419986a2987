"""`MultiProcessDataLoader`'s saved state: what `state_dict()` returns and how
`load_state_dict()` reads it back.

Functions of a loader's settings, its iteration progress and its instance cache
(never of the loader itself): the whole-job state (`whole_state`, gathered over ranks
under torch.distributed), each rank's share of it (`rank_part`), the position a
saved state resumes at (`resumed_position`, exact in the same split, otherwise a
new pass over what is left), and the settings a state is valid for (`saved_settings`).
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterable, Mapping
from typing import Any, Optional

from framework.data._batching import derive_seed
from framework.data._cache import InstanceCache
from framework.data._checks import describe
from framework.data._distributed import in_step
from framework.data._pass import KEPT, Progress
from framework.data._position import Position
from framework.data._resume_checks import (
    check_files,
    check_reader,
    check_samples,
    check_settings,
    file_stamps,
    sample_digests,
)
from framework.data._settings import LoaderSettings
from framework.data._shards import (
    EAGER_STATE_VERSIONS,
    LAZY_STATE_VERSIONS,
    READ,
    STATE_VERSION,
    Consumed,
    consumed_by,
)
from framework.data.reader import current_distributed_info
from framework.data.shard_files import ShardFiles
from framework.errors import ResumeError

__all__ = [
    "rank_part",
    "resumed_position",
    "same_split",
    "saved_settings",
    "whole_state",
]


def whole_state(settings: LoaderSettings, progress: Progress, cache: InstanceCache) -> dict[str, Any]:
    """`MultiProcessDataLoader.state_dict()`: where iteration stands, as plain data
    (a collective under torch.distributed)."""
    position = progress.current or progress.next_position(settings)
    info = current_distributed_info()
    world, rank = (info.world_size, info.global_rank) if info else (1, 0)
    mine = rank_part(settings, cache, position, rank, world)
    if isinstance(settings.source, ShardFiles):
        mine["shard_list"] = settings.source.describe()
    parts = [mine]
    if world > 1:
        import torch.distributed as dist

        # First a collective of the same shape as the per-batch ones: a rank still
        # taking a batch meets this one at once and both raise, rather than wait.
        in_step(progress.batches, settings.evened())

        # A rank whose epoch ended (uneven ranks) while others are still in it
        # speaks for that epoch with the pass it finished, whether or not it has begun
        # the next ones (its position there is not part of the epoch the others are in).
        epochs: list[Any] = [None] * world
        dist.all_gather_object(epochs, position.epoch)
        epoch = min(epochs)
        if position.epoch > epoch and epoch in progress.ended:
            mine["finished"] = rank_part(settings, cache, progress.ended[epoch], rank, world)
        gathered: list[Any] = [None] * world
        dist.all_gather_object(gathered, mine)
        _same_shards(gathered)
        ahead = [r for r, part in enumerate(gathered) if epochs[r] > epoch and "finished" not in part]
        if ahead:
            raise ResumeError(
                f"rank {ahead[0]} is in epoch {epochs[ahead[0]]} and no longer holds its pass "
                f"of epoch {epoch}, which rank {epochs.index(epoch)} is still in (a rank keeps "
                f"its last {KEPT} passes): no state describes both. Save with the ranks in "
                "nearer epochs (even_batches=True keeps them in step)",
                "ranks_differ",
            )
        parts = [part["finished"] if epochs[r] > epoch else part for r, part in enumerate(gathered)]
    consumed: Optional[Consumed] = None
    if all(part["tracked"] for part in parts):
        limits = {slot: limit for part in parts for slot, limit in part["limits"]}
        base = Consumed.from_dict(parts[0]["position"]["base"])
        # The base's own token too: a slot that has yielded nothing since a resume
        # stands at base.below, and only the base knows where that record starts.
        tokens = {} if base.token is None else {base.below: base.token}
        tokens.update({record: token for part in parts for record, token in part["tokens"]})
        consumed = consumed_by(
            base,
            _stride(part["position"] for part in parts) or world * settings.slots_per_rank(),
            limits,
            [index for part in parts for index in part["taken"]],
            tokens,
            _earliest(mark for part in parts for mark in part["marks"]),
        )
    return {
        "version": STATE_VERSION,
        "epoch": parts[0]["position"]["epoch"],
        "world_size": world,
        "num_workers": settings.num_workers,
        "settings": saved_settings(settings),
        "files": file_stamps(
            settings.source.local_files() if isinstance(settings.source, ShardFiles) else settings.source
        ),
        "epoch_batches": progress.epoch_batches,  # batches_per_epoch: already yielded
        # The training loop's epoch to restart at: the next iter() yields (the rest of)
        # it. Without batches_per_epoch an iter() is a pass, so it is the pass's epoch.
        "loop_epoch": (
            parts[0]["position"]["epoch"] if settings.batches_per_epoch is None else progress.loop_epoch
        ),
        "ranks": [part["position"] for part in parts],
        "consumed": None if consumed is None else consumed.to_dict(),
        "samples": {key: value for part in parts for key, value in part["samples"].items()},
        **({"shards": _pins(parts)} if "shards" in mine else {}),
    }


def _pins(parts: list[Any]) -> dict[str, str]:
    """The union of the shards the ranks read; a shard two ranks read in other versions
    (their caches held other copies) cannot be pinned to either: refused."""
    pins: dict[str, str] = {}
    for part in parts:
        for url, sha in part["shards"].items():
            if pins.setdefault(url, sha) != sha:
                raise ResumeError(
                    f"the ranks read other versions of {url} (sha256 {pins[url][:12]}... and "
                    f"{sha[:12]}...): ranks read other bytes of it this epoch, so no state can resume "
                    "it exactly. Give the ranks one cache folder (or the same copy), and restart the epoch",
                    "ranks_differ",
                )
    return pins


def _same_shards(parts: list[Any]) -> None:
    """Every rank deals records out of the same shard list, or the job reads some twice
    and others never: a glob or manifest that changed while the ranks resolved it."""
    lists = sorted({str(part.get("shard_list")) for part in parts})
    if len(lists) > 1:
        raise ResumeError(
            f"the ranks resolved data_path into different shard lists ({', '.join(lists)}): "
            "the listing or manifest changed while they started, so records are read twice or "
            "never. Pin the shards (a manifest that does not change, or a list), and restart",
            "ranks_differ",
        )


def rank_part(
    settings: LoaderSettings, cache: InstanceCache, position: Position, rank: int, world: int
) -> dict[str, Any]:
    """This rank's share of the whole-job state: its exact position, and what it
    yielded (eager mode: the first `position.consumed` of the pass's batches, made
    again from its seed when the pass is not the one in progress: loaded, cut short)."""
    if settings.max_instances_in_memory is None:
        indexes = cache.indexes
        tracked = indexes is not None
        taken = []
        if indexes is not None and position.consumed:
            lists = cache.batch_lists(position)
            taken = [indexes[i] for b in lists[: position.consumed] for i in b]
        limits = [(rank, position.base.below)]
        tokens: list[tuple[int, Any]] = []
        marks: list[tuple[int, list[int]]] = []
    else:
        position.begin(settings.slots_per_rank())
        tracked = position.tracked
        taken = [index for listed in position.taken for index in listed]
        limits = list(position.limits(rank, world).items())
        tokens = list(position.tokens().items())
        marks = list(position.marks(rank, world).items())
    cached = cache.instances if settings.max_instances_in_memory is None else None
    # The streamed shards the epoch read (between epochs, none: the next epoch reads what
    # the server has then), by the bytes they had: a resume reads those bytes only.
    read = cache.shards_read if cached is not None else position.shards_read
    streamed = {"shards": dict(read)} if isinstance(settings.source, ShardFiles) else {}
    return {
        **streamed,
        "position": position.to_dict(),
        # eager: digests of cached instances, to check a resumed cache is the same
        "samples": {} if cached is None else sample_digests(cached, cache.indexes, rank),
        "tracked": tracked,
        "taken": taken,
        "limits": limits,
        "tokens": tokens,
        "marks": marks,
    }


def resumed_position(settings: LoaderSettings, cache: InstanceCache, state: Mapping[str, Any]) -> Position:
    if not isinstance(state, Mapping) or "version" not in state:
        old = isinstance(state, Mapping) and "position" in state
        raise ResumeError(
            "load_state_dict() expects what MultiProcessDataLoader.state_dict() returned "
            f"(a mapping with 'version': {STATE_VERSION}), got "
            + (
                "a state in the format before resuming across topologies (no 'version'); "
                "it cannot be read by this version: start the epoch afresh"
                if old
                else f"{type(state).__name__}: pass the loader's own state_dict()"
            ),
            "malformed",
        )
    _check_version(state)
    check_files(state.get("files"))  # before the settings: its own clear error
    check_reader(settings.reader)
    saved = state.get("settings")
    if isinstance(saved, Mapping):
        # Outside the try below: a setting that differs is its own clear refusal, not
        # a "mangled" state.
        check_settings(saved, saved_settings(settings))
    try:
        check_settings(state["settings"], saved_settings(settings))
        info = current_distributed_info()
        world, rank = (info.world_size, info.global_rank) if info else (1, 0)
        ranks = list(state["ranks"])
        exact = state["world_size"] == world and same_split(settings, state)
        mine = Position.from_dict(dict(ranks[rank])) if exact else None
        first = Position.from_dict(dict(ranks[0]))
        consumed = None if state["consumed"] is None else Consumed.from_dict(state["consumed"])
        deal = _deal_of(ranks)
    except ResumeError:
        raise
    except (KeyError, TypeError, IndexError, AttributeError, ValueError, zlib.error) as error:
        raise ResumeError(
            f"load_state_dict() expects what MultiProcessDataLoader.state_dict() "
            f"returned; this state lacks or mangles a part ({type(error).__name__}: "
            f"{error}); pass the loader's own state_dict()",
            "malformed",
        ) from error
    # The cache the positions point into; under another split a reader's random draws
    # differ (other workers, other seeds), so only the same split can compare instances.
    if (
        settings.max_instances_in_memory is None
        and state["world_size"] == world
        and (max(1, state["num_workers"]) == max(1, settings.num_workers))
    ):
        check_samples(state.get("samples"), cache.load(), cache.indexes, rank)
    pins = state.get("shards") or {}
    _check_cached_shards(settings, cache, pins)
    if mine is not None and mine.deal and (mine.split or 1) == 1 and settings.split(world) > 1:
        # Whole shards per rank, and this job evens its ranks' batch counts: resumed as
        # they are, the ranks end far apart and evening drops the rest. Another split.
        mine = None
    if mine is not None:
        mine.shards_read.update(pins)  # what the epoch read before, pinned again by the next save
        return mine  # the same split: exact
    if consumed is None:
        raise ResumeError(
            f"the state was saved with world_size={state['world_size']} and "
            f"num_workers={state['num_workers']}, and {type(settings.reader).__name__} does "
            "not say which record each instance came from (it shards by itself, builds "
            "a list, or yields several instances per record), so the rest of the epoch "
            "cannot be dealt over another split. Resume with the same num_workers and "
            "world size, or see 'Resume anywhere' in the loader docs",
            "other_split",
        )
    # Another split: a new pass over what is left, seeded from the saved pass.
    seed = derive_seed(first.seed, "resumed", world, settings.slots_per_rank(), rank)
    # Whole shards dealt: the rest of the epoch keeps its dealing (the streams of shards
    # its records are numbered in), each slot reading its streams one after another (and
    # ranks that even their batches splitting each stream's records: `Position.split`).
    return Position(epoch=first.epoch, seed=seed, base=consumed, deal=deal, shards_read=dict(pins))


def _check_cached_shards(settings: LoaderSettings, cache: InstanceCache, pins: Mapping[str, str]) -> None:
    """ResumeError unless an eager cache read already (when the loader was built) holds
    the bytes of the shards the state pins: its positions point into those."""
    if settings.max_instances_in_memory is not None or cache.instances is None:
        return  # lazy, or an eager cache still to read: it reads the pinned bytes
    changed = sorted(url for url, sha in pins.items() if cache.shards_read.get(url, sha) != sha)
    if changed:
        raise ResumeError(
            f"shard {changed[0]} changed since the state was saved (sha256 "
            f"{pins[changed[0]][:12]}... then, {cache.shards_read[changed[0]][:12]}... now), and "
            "this eager loader read the new bytes when it was built: the saved positions would "
            "land on other records. Resume where the old bytes are cached, or start the epoch afresh",
            "files_changed",
        )


def _deal_of(positions: Iterable[Mapping[str, Any]]) -> Optional[int]:
    """How the epoch deals (`Position.deal`): as any rank that began it does (every rank
    decides alike; one that has not begun its pass has not decided yet)."""
    return next((p["deal"] for p in positions if p.get("deal") is not None), None)


def _stride(positions: Iterable[Mapping[str, Any]]) -> int:
    """`Position.stride` of the pass the ranks are in (0: records dealt one by one)."""
    begun = next((p for p in positions if p.get("deal") is not None), None)
    return 0 if begun is None or not begun["deal"] else begun["deal"] * (begun.get("split") or 1)


def _earliest(marks: Iterable[tuple[int, list[int]]]) -> dict[int, list[int]]:
    """Each stream's mark (`Consumed.marks`) from the ranks' (`Position.marks`): the
    earliest, where several ranks read the stream (every record before it consumed)."""
    out: dict[int, list[int]] = {}
    for stream, mark in marks:
        known = out.get(int(stream))
        if known is None or _later(known, mark):
            out[int(stream)] = mark
    return out


def _later(mark: list[int], other: list[int]) -> bool:
    return (mark[0] == READ and other[0] != READ) or (other[0] != READ and other[0] < mark[0])


def _check_version(state: Mapping[str, Any]) -> None:
    """ResumeError unless this version reads a state of `state`'s format version."""
    version = state["version"]
    lazy = isinstance(state.get("settings"), Mapping) and bool(state["settings"].get("lazy"))
    if version in (LAZY_STATE_VERSIONS if lazy else EAGER_STATE_VERSIONS):
        return  # an older state that names the same positions as this version's
    if version == 2:
        raise ResumeError(
            "the state was saved by a lazy loader of an earlier version of framework, "
            "whose chunks all held max_instances_in_memory instances; this version's "
            "first chunks grow from one batch, so the saved positions point elsewhere. "
            "Resume it with the version that saved it, or start the epoch afresh",
            "malformed",
        )
    raise ResumeError(
        f"the state has format version {version!r}, and this version of framework reads "
        f"version {STATE_VERSION}: resume it with the version that saved it, or start the "
        "epoch afresh",
        "malformed",
    )


def same_split(settings: LoaderSettings, state: Mapping[str, Any]) -> bool:
    """Whether this rank's saved position resumes exactly here (same world size given)."""
    if settings.max_instances_in_memory is not None:
        return bool(max(1, state["num_workers"]) == settings.slots_per_rank())
    # Eager mode caches the rank's instances in record order, whatever num_workers,
    # when the reader says which record each came from. A reader that shards by
    # itself (one file per worker, say) caches another order under another num_workers.
    return bool(state["num_workers"] == settings.num_workers or state["consumed"] is not None)


def saved_settings(settings: LoaderSettings) -> dict[str, Any]:
    """What a saved state is valid for: the same data, batched the same way."""
    plan = settings.plan
    sampler = plan.batch_sampler
    source = settings.source
    # Streamed shards: which ones, in which order (a listing or manifest may change
    # between runs: positions name shards by their place), and the seed that orders them.
    streamed = (
        {"shard_seed": settings.shard_seed, "shard_list": source.describe()}
        if isinstance(source, ShardFiles)
        else {}
    )
    return {
        **streamed,
        "lazy": plan.max_instances_in_memory is not None,
        "max_instances_in_memory": plan.max_instances_in_memory,
        "batch_size": plan.batch_size,
        "drop_last": plan.drop_last,
        "shuffle": plan.shuffle,
        "batch_sampler": None if sampler is None else describe(sampler),
        "data_path": json.loads(json.dumps(settings.data_path, default=str)),
        "reader": describe(settings.reader)["type"],
        "max_instances": settings.reader.max_instances,  # the reader's, which changes the data
    }
