"""Strategies of the "resume is exactly once" property suites (issue 24), shared by
test_resume_properties.py and test_resume_properties_distributed.py."""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any

from hypothesis import strategies as st

from tests.support.compression import FORMS
from tests.support.resume_properties import INTERRUPTS, SOURCES, Case, FileSpec

# Regions the strategies avoid while a defect there is open (each flag also has its
# smallest failing case in test_known_defect_cases*).
KNOWN_DEFECTS: set[str] = {"batches_per_epoch_rank_repeats_a_pass_order"}
# FRAMEWORK_PROPERTY_KNOWN_DEFECTS=include draws every region; "name,name" draws those.
_INCLUDE = os.environ.get("FRAMEWORK_PROPERTY_KNOWN_DEFECTS", "")
KNOWN_DEFECTS -= set(KNOWN_DEFECTS) if _INCLUDE == "include" else set(_INCLUDE.split(","))

WORKERS = st.sampled_from([0, 0, 0, 0, 1, 1, 2, 3])  # processes are costly: mostly 0 or 1


@st.composite
def files(draw: Any, source: str, streamed: bool = False) -> tuple[FileSpec, ...]:
    count = draw(st.integers(2, 4) if streamed else st.integers(1, 3))  # streamed: shards to order
    specs = []
    for _ in range(count):
        records = draw(st.integers(0, 10))
        bom = draw(st.booleans())
        if "bom" in KNOWN_DEFECTS:  # jsonl and csv fail; text keeps the mark (a file of it alone: one line)
            bom = bom and source == "text" and records > 0
        low = 1 if bom else 0  # (a mark alone on a line is no blank line)
        blank = set()
        if records > low:
            blank = draw(st.sets(st.integers(low, records - 1), max_size=records // 3))
        final = draw(st.booleans())
        specs.append(
            FileSpec(
                records=records,
                blank=tuple(sorted(b for b in blank if b < records)),
                newline=draw(st.sampled_from(["\n", "\n", "\r\n", "\r"])),
                final_newline=final,
                bom=bom,
            )
        )
    return tuple(specs)


@st.composite
def streaming(draw: Any) -> dict[str, Any]:
    """A file case's files as they are, or (one in two) streamed over HTTP: as URLs or a
    brace range, `prefetch` 0-2, and a `cache_limit` from the least the loader takes
    (evicting shards all the time) up, or none."""
    if not draw(st.booleans()):
        return {}
    return {
        "streamed": True,
        "brace": draw(st.booleans()),
        "prefetch": draw(st.integers(0, 2)),
        "cache_limit": draw(st.sampled_from([None, None, 0, 0, 100, 2000])),
    }


@st.composite
def cases(draw: Any, world: bool = False) -> Case:
    source = draw(st.sampled_from(SOURCES))
    options: dict[str, Any] = {"source": source}
    # A rank that reads nothing is refused (another property): under torch.distributed
    # every rank of 1-3 gets one of the first 6 instances.
    least = 6 if world else 2
    if source in ("plain", "sharded"):
        n = draw(st.integers(least, 30))
        options["n"] = n
        if source == "sharded":
            low = least if world else 0
            skip = draw(st.sets(st.integers(low, n - 1), max_size=n // 2)) if n > low else set()
            options["skip"] = tuple(sorted(skip))
    else:
        options.update(draw(streaming()))
        specs = draw(files(source, options.get("streamed", False)))
        live = sum(spec.records - len(spec.blank) for spec in specs)
        if live < least:
            specs = (*specs, FileSpec(records=least))
        if len(specs) > 1 and "no_final_newline_several_files" in KNOWN_DEFECTS:
            specs = tuple(replace(spec, final_newline=True) for spec in specs)
        options["files"] = specs
        options["compression"] = draw(st.sampled_from(FORMS))
    batch_size = draw(st.integers(1, 4))
    chunks = st.integers(batch_size, 8)
    # Streamed shards are read in an order shuffled per epoch in lazy mode: mostly lazy.
    lazy = draw(st.one_of(st.none(), chunks, *[chunks] * options.get("streamed", False)))
    bucket = draw(st.booleans())
    sorting_keys = draw(st.booleans())
    if lazy is not None and bucket and "lazy_bucket_guessed_keys" in KNOWN_DEFECTS:
        sorting_keys = True
    workers = WORKERS if lazy is not None else st.integers(0, 3)  # eager: one start per loader
    if world:
        workers = st.sampled_from([0, 0, 0, 1, 1, 2])  # three ranks of workers cost: mostly none or one
    w0, w1, w2 = draw(workers), draw(workers), draw(workers)
    if draw(st.booleans()):
        w1 = w0  # the same topology, often: then the batches must be the very same
    if draw(st.booleans()):
        w2 = w1
    if lazy is None and options.get("skip") and "eager_fewer_instances_other_workers" in KNOWN_DEFECTS:
        w1 = w2 = w0
    interrupt = draw(st.sampled_from(INTERRUPTS))
    if interrupt == "in_next" and ("exception_in_next" in KNOWN_DEFECTS or (lazy is not None and w1 > 0)):
        interrupt = "keyboard"  # (with workers, collation runs in them)
    first, second = sorted((draw(st.integers(0, 12)), draw(st.integers(0, 12))))
    take = draw(st.sampled_from([0, 0, 1, 1, 2, 3, 4, 6, 8]))  # 0: saved again right after loading
    sizes, even = (1, 1, 1), True
    if world:
        bpe = draw(st.sampled_from([None, None, None, None, 1, 2, 3]))
        sizes = (draw(st.integers(1, 3)), draw(st.integers(1, 3)), draw(st.integers(1, 3)))
        if draw(st.booleans()):
            sizes = (sizes[0], sizes[0], sizes[0] if draw(st.booleans()) else sizes[2])
        even = draw(st.booleans()) or "even_batches_false" in KNOWN_DEFECTS
        if interrupt == "in_next":
            interrupt = "keyboard"  # collectives: every rank would have to fail alike
        if max(sizes) > 1 and "batches_per_epoch_ranks_in_other_passes" in KNOWN_DEFECTS:
            bpe = None
        if max(sizes) > 1 and "batches_per_epoch_rank_repeats_a_pass_order" in KNOWN_DEFECTS:
            bpe = None
        other_world = len(set(sizes)) > 1
        if (
            lazy is None
            and take == 0
            and other_world
            and "eager_state_before_first_batch_other_world" in KNOWN_DEFECTS
        ):
            take = 1
        if lazy is None and bucket and other_world and "eager_guessed_keys_empty_rank" in KNOWN_DEFECTS:
            sorting_keys = True
    if not world:
        bpe = draw(st.sampled_from([None, None, None, None, 1, 2, 3]))
    after_exit = draw(st.booleans()) and (interrupt == "hold" or "state_after_exit" not in KNOWN_DEFECTS)
    return Case(
        **options,
        lazy=lazy,
        bucket=bucket,
        sorting_keys=sorting_keys,
        batch_size=batch_size,
        drop_last=draw(st.booleans()),
        shuffle=draw(st.booleans()),
        batches_per_epoch=bpe,
        seed=draw(st.integers(0, 2**16)),
        workers=(w0, w1, w2),
        saves=(first, second),
        resume_from=draw(st.integers(0, 1)),
        in_place=draw(st.booleans()),
        take=take,
        world=sizes,
        even_batches=even,
        interrupt=interrupt,
        save_after_exit=after_exit,
        next_epoch=draw(st.booleans()),
    )
