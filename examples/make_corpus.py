"""Regenerate ``framework/examples/corpus.txt``, the bundled dataset of `framework run`.

Deterministic sentences from a tiny grammar, with lengths from 3 to ~60 tokens so
that bucketing and padding have something to do. Run: ``python examples/make_corpus.py``.
"""

from __future__ import annotations

import random
from pathlib import Path

SUBJECTS = ["the model", "a reader", "the loader", "each worker", "the sampler", "our cache",
            "a research team", "the download manager", "every rank", "the collator"]
VERBS = ["reads", "batches", "shuffles", "fetches", "verifies", "pads", "streams", "publishes",
         "tokenizes", "indexes"]
OBJECTS = ["the corpus", "long sentences", "a shared file", "sixteen shards", "the tensors",
           "short lines", "a tar archive", "the vocabulary", "every instance", "the checksum"]
TAILS = ["quickly", "in parallel", "without hanging", "exactly once", "on every epoch",
         "with bounded memory", "after the lock is released", "before the first batch"]


def sentence(rng: random.Random) -> str:
    clauses = []
    for _ in range(rng.choice([1, 1, 1, 2, 2, 3, 5, 8])):
        clause = [rng.choice(SUBJECTS), rng.choice(VERBS), rng.choice(OBJECTS)]
        if rng.random() < 0.5:
            clause.append(rng.choice(TAILS))
        clauses.append(" ".join(clause))
    return " and ".join(clauses) + " ."


def main(lines: int = 5000) -> None:
    rng = random.Random(0)
    target = Path(__file__).resolve().parent.parent / "framework" / "examples" / "corpus.txt"
    target.write_text("\n".join(sentence(rng) for _ in range(lines)) + "\n", encoding="utf-8")
    print(f"wrote {lines} lines to {target}")


if __name__ == "__main__":
    main()
