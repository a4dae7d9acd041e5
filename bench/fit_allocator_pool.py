"""Fit the caching allocator's pool of a distributed training process on the seen readings (issue 29).

    PYTHONPATH=src .venv/bin/python bench/fit_allocator_pool.py            # the table and the fit
    PYTHONPATH=src .venv/bin/python bench/fit_allocator_pool.py --check    # exit 1 if the catalog differs

For every reserved or whole-GPU reading of the seen sets (every ``bench/data/whole_gpu_readings*.toml``
that has been scored: A to M, public readings and hwdash's own H100 runs; a held-out set, collected
after the fit, is never read here), the pool the reading implies is what it holds
beyond hwdash's allocated tensors:

* a ``reserved`` reading: ``reading - side-stream cache - allocated``;
* an ``nvml`` reading also less what lies outside the allocator (the CUDA context row, NCCL's
  communicators, managed memory).

Allocated readings say nothing about the pool and are left out, and so is an nvml reading of a run
whose reserved reading is in the same table (one run, one vote: the reserved reading is the pool's
own). Three kinds are fitted (``estimate.pool_kind``): ``megatron`` (training on the Megatron-LM
path), ``param_offload`` (ZeRO-3 parameter offload, FSDP CPU offload) and ``distributed`` (any other
training under a parallel group, ZeRO or FSDP). A kind's pool is ``base + fraction x allocated``,
and three forms compete for each kind (:data:`FORMS`):

* ``median``: no base, the median implied fraction (robust to a row whose tensors hwdash misjudges);
* ``fraction``: no base, the fraction that minimises the median |error| of the rows' readings;
* ``base+fraction``: both, minimising the same (base in quarter GiB up to 8 GiB).

Every median here gives one vote to each source (:func:`source_of`: a repository or site), its
rows sharing it, so that one benchmark table of many rows does not set a kind's pool alone. The form
kept for a kind is the one with the smallest median |error| when each seen set in turn is left out of
the fit and scored by the others (leave one set out: a held-out test inside the seen sets); its fit on
every seen set goes to ``catalog/software.toml``'s ``[[allocator_pool]]``
(fractions to a hundredth). Each fit's held-out test is a set collected after it and never read
here: C and D for the first fit (0.14), F for the second (0.19), H for the third (0.24 and 0.35,
commit c96669e), I to L for the fourth (A to H: 0.22, 0.38, 0.11, all medians), M for the fifth (A to
L: 0.22, 4.25 GiB + 0.06, 0.07); this fit, on A to M, has none yet.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from whole_gpu_accuracy import GIB, REPO, estimate_row, load_rows, row_plan

from hwdash.core.catalog import load_catalog
from hwdash.core.estimator.estimate import pool_kind

DATA = REPO / "bench" / "data"
SEEN = (
    DATA / "whole_gpu_readings.toml",
    *(DATA / f"whole_gpu_readings_{name}.toml" for name in ("b", "c1", "c2", "c3", "c4")),
    *(DATA / f"whole_gpu_readings_{name}.toml" for name in ("d1", "d2", "e", "f", "g1", "g2")),
    *(DATA / f"whole_gpu_readings_{name}.toml" for name in ("h1", "h2", "h3", "i1", "i2")),
    *(DATA / f"whole_gpu_readings_{name}.toml" for name in ("j1", "j2", "k1", "k2", "k3")),
    *(DATA / f"whole_gpu_readings_{name}.toml" for name in ("l1", "l2", "l3")),
    *(DATA / f"whole_gpu_readings_m{number}.toml" for number in range(1, 8)),
)
KINDS = ("distributed", "param_offload", "megatron")
"""The fitted kinds (``single_gpu`` keeps hwdash's own H200 measurement)."""
OUTSIDE = ("CUDA context", "runtime context", "NCCL (")
SIDE = "FSDP1 side streams"
FORMS = ("median", "fraction", "base+fraction")
"""The pool's forms that compete for each kind (the module's docstring)."""
QUARTER_GIB = GIB // 4
BASES = tuple(step * QUARTER_GIB for step in range(33))
"""The bases ``base+fraction`` tries: 0 to 8 GiB in quarters."""
FRACTIONS = tuple(step / 100 for step in range(61))
"""The fractions the error-minimising forms try: 0 to 0.60 in hundredths."""


@dataclass(frozen=True)
class Implied:
    """One reading's implied pool."""

    id: str
    measure: str
    gpus: int
    allocated: int
    pool: int
    """Bytes the reading holds beyond hwdash's allocated tensors and what lies outside the pool."""
    reading: int
    """The reading itself, bytes (an error is relative to it)."""
    kind: str
    """The plan's pool kind (``estimate.pool_kind``)."""
    table: str
    """The readings file's name: one seen set, left out as one by :func:`leave_one_set_out`."""
    source: str = ""
    """Where the reading comes from (:func:`source_of`): the rows of one source share one vote."""

    @property
    def fraction(self) -> float:
        return self.pool / self.allocated


@dataclass(frozen=True)
class Pool:
    """One kind's fitted pool: ``base + fraction x allocated`` bytes."""

    base: int
    fraction: float
    form: str

    def error(self, row: Implied) -> float:
        """The row's relative error with this pool: (estimate - reading) / reading."""
        return (self.base + self.fraction * row.allocated - row.pool) / row.reading


def source_of(url: str) -> str:
    """A reading's source as one vote: the GitHub or Hugging Face repository, else the site, else
    the text (hwdash's own runs name the bench script and its data folder)."""
    repository = re.match(
        r"https?://(?:github\.com|huggingface\.co)/(?:datasets/)?([^/]+/[^/#?]+)", url
    )
    if repository:
        return repository.group(1).lower()
    site = re.match(r"https?://([^/]+)", url)
    return site.group(1).lower() if site else url


def _weights(rows: list[Implied]) -> list[float]:
    """One vote per source: each row weighs 1 / the rows of its source among ``rows``."""
    counts = Counter(row.source for row in rows)
    return [1.0 / counts[row.source] for row in rows]


def weighted_median(values: list[float], weights: list[float]) -> float:
    """The smallest value at which the weights of the values up to it reach half of all."""
    pairs = sorted(zip(values, weights, strict=True))
    half = sum(weights) / 2
    running = 0.0
    for value, weight in pairs:
        running += weight
        if running >= half - 1e-12:
            return value
    return pairs[-1][0]


def implied(files: tuple[Path, ...] = SEEN) -> list[Implied]:
    """Every reserved or whole-GPU reading's implied pool."""
    catalog = load_catalog(include_user=False)
    out = []
    for path in files:
        rows = load_rows(path)
        reserved = {
            (row["source"], row["hwdash_args"]) for row in rows if row["measure"] == "reserved"
        }
        for row in rows:
            if row["measure"] == "allocated":
                continue
            if row["measure"] == "nvml" and (row["source"], row["hwdash_args"]) in reserved:
                continue
            plan = row_plan(row, catalog)
            estimate = estimate_row(row, catalog, plan)
            kind = pool_kind(plan, estimate.gpus)
            side = sum(b for name, b in estimate.details if name.startswith(SIDE))
            whole = round(row["per_gpu_gib"] * GIB)
            beyond = whole
            if row["measure"] == "nvml":
                outside = sum(b for name, b in estimate.details if name.startswith(OUTSIDE))
                beyond -= outside + estimate.managed_bytes
            allocated = estimate.allocated_bytes
            pool = beyond - side - allocated
            out.append(
                Implied(
                    row["id"],
                    row["measure"],
                    estimate.gpus,
                    allocated,
                    pool,
                    whole,
                    kind,
                    path.name,
                    source_of(row["source"]),
                )
            )
    return out


def _median_error(pool: Pool, rows: list[Implied]) -> float:
    """The rows' median |error| with ``pool``, one vote per source."""
    return weighted_median([abs(pool.error(row)) for row in rows], _weights(rows))


def fit_form(rows: list[Implied], form: str) -> Pool:
    """The pool of ``form`` fitted on ``rows`` (the module's docstring)."""
    if form == "median":
        median = weighted_median([row.fraction for row in rows], _weights(rows))
        return Pool(0, round(median, 2), form)
    bases = BASES if form == "base+fraction" else (0,)
    candidates = (Pool(base, fraction, form) for base in bases for fraction in FRACTIONS)
    # the smallest error; among equals the smallest base, then the smallest fraction
    return min(candidates, key=lambda pool: (_median_error(pool, rows), pool.base, pool.fraction))


def leave_one_set_out(rows: list[Implied], form: str) -> float:
    """The median |error| of every row (one vote per source) when its set is left out of the fit
    of ``form``."""
    errors: list[float] = []
    scored: list[Implied] = []
    for table in sorted({row.table for row in rows}):
        kept = [row for row in rows if row.table != table]
        pool = fit_form(kept, form)
        left = [row for row in rows if row.table == table]
        errors.extend(abs(pool.error(row)) for row in left)
        scored.extend(left)
    return weighted_median(errors, _weights(scored))


def form_scores(own: list[Implied]) -> dict[str, float]:
    """Each form's leave-one-set-out error on one kind's rows."""
    return {form: leave_one_set_out(own, form) for form in FORMS}


def fit(rows: list[Implied], kind: str = "distributed") -> Pool:
    """The kind's pool: the form with the smallest leave-one-set-out error (the first of
    :data:`FORMS` among equals), fitted on every row of the kind."""
    own = [row for row in rows if row.kind == kind]
    return _kept(own, form_scores(own))


def _kept(own: list[Implied], scores: dict[str, float]) -> Pool:
    return fit_form(own, min(FORMS, key=lambda name: scores[name]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the catalog differs")
    args = parser.parse_args(argv)
    rows = implied()
    for r in sorted(rows, key=lambda r: (r.kind, r.fraction)):
        print(
            f"{r.id:56} {r.measure:8} gpus {r.gpus:3}  allocated {r.allocated / GIB:7.2f} GiB"
            f"  implied pool {r.fraction:+7.1%} ({r.pool / GIB:+6.2f} GiB)  {r.kind}"
        )
    fitted = {}
    for kind in KINDS:
        own = [row for row in rows if row.kind == kind]
        print(
            f"{kind} rows: {len(own)} of {len({r.source for r in own})} sources,"
            f" median implied pool {weighted_median([r.fraction for r in own], _weights(own)):.2f}"
        )
        scores = form_scores(own)
        for form in FORMS:
            pool = fit_form(own, form)
            print(
                f"    {form:14} base {pool.base / GIB:4.2f} GiB  fraction {pool.fraction:.2f}"
                f"  seen median |err| {_median_error(pool, own):5.1%}"
                f"  leave one set out {scores[form]:5.1%}"
            )
        fitted[kind] = _kept(own, scores)
        print(f"    kept: {fitted[kind]}")
    single = [row for row in rows if row.kind == "single_gpu"]
    print(
        f"single_gpu rows: {len(single)}, median implied pool {statistics.median(r.fraction for r in single):.2f}"
    )
    print("(single_gpu is not fitted: the catalog keeps hwdash's own H200 measurement)")
    catalog = load_catalog(include_user=False)
    assert catalog.software is not None
    software = catalog.software
    held = {kind: (software.pool_base(kind), software.pool_fraction(kind)) for kind in KINDS}
    print(f"catalog/software.toml [[allocator_pool]] (base bytes, fraction): {held}")
    if args.check and held != {kind: (p.base, p.fraction) for kind, p in fitted.items()}:
        print("the catalog differs from the fit", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
