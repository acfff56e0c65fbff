"""Argument types for every numeric option of every command: text, NaN, infinities and out-of-range values
are refused by argparse in one line (`morphpipe COMMAND: error: argument --OPTION: must be ..., got ...`, exit 2).

The ranges are morphpipe.numeric's, the same the Python API checks at its boundaries.
"""
from __future__ import annotations

import argparse
from collections.abc import Callable

from morphpipe.data.splits import SplitFractions
from morphpipe.numeric import INT64_MAX, float_problem, int_problem


def integer(minimum: int | None = None, maximum: int = INT64_MAX) -> Callable[[str], int]:
    """An argparse `type=` that reads an integer in [minimum, maximum]."""

    def parse(text: str) -> int:
        try:
            value: object = int(text.strip())
        except ValueError:
            value = text
        problem = int_problem(value, minimum, maximum)
        if problem is not None:
            raise argparse.ArgumentTypeError(problem)
        return value  # type: ignore[return-value]

    parse.__name__ = "integer"
    return parse


def number(minimum: float | None = None, maximum: float | None = None, *, above: bool = False,
           below: bool = False) -> Callable[[str], float]:
    """An argparse `type=` that reads a finite number within the bounds (`above`/`below`: the bound excluded)."""

    def parse(text: str) -> float:
        try:
            value: object = float(text)
        except ValueError:
            value = text
        problem = float_problem(value, minimum, maximum, above=above, below=below)
        if problem is not None:
            raise argparse.ArgumentTypeError(problem)
        return value  # type: ignore[return-value]

    parse.__name__ = "number"
    return parse


BYTE_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def byte_size(text: str) -> int:
    """An argparse `type=` for a size in bytes: a number with an optional K, M, G or T suffix (powers of 1024;
    a trailing 'B' or 'iB' is allowed), e.g. 6G, 512MiB, 1.5G."""
    cleaned = text.strip().upper().removesuffix("IB").removesuffix("B")
    unit = cleaned[-1:] if cleaned[-1:] in BYTE_UNITS else ""
    try:
        value = float(cleaned[:len(cleaned) - len(unit)]) * BYTE_UNITS[unit]
    except ValueError:
        value = float("nan")
    if not value >= 1 or value > INT64_MAX:
        raise argparse.ArgumentTypeError(f"must be a size such as 6G, 512M or 1048576 (bytes), got {text!r}")
    return int(value)


def split_fractions(text: str) -> SplitFractions:
    """An argparse `type=` for train,val,test fractions such as 0.6,0.2,0.2."""
    try:
        return SplitFractions.parse(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


positive_int = integer(1)
non_negative_int = integer(0)
seed = integer(0)
positive_float = number(0, above=True)
non_negative_float = number(0)
fraction = number(0, 1)
dropout = number(0, 1, below=True)


def add_feature_tier_arguments(parser: argparse.ArgumentParser) -> None:
    """--features-on-disk, --feature-cache-mb and --memory-budget: where a graph's feature rows are read from (the
    tier) and how much host RAM their cache may take."""
    parser.add_argument("--features-on-disk", action="store_true",
                        help="read feature rows from features.npy through the feature store (many reads in flight, "
                             "hot rows cached) instead of through the page cache: for features larger than RAM "
                             "(default: when they do not fit --memory-budget beside the topology; a typed graph's "
                             "featured node types go together, one store per type)")
    parser.add_argument("--feature-cache-mb", type=number(0.0, INT64_MAX / 1e6), default=None,
                        help="with features on disk: host RAM for the hottest feature rows, in MB (default: the "
                             "size the planner chooses within --memory-budget; 0 without a plan; a typed graph's "
                             "node types share it by expected reads per byte of row)")
    parser.add_argument("--memory-budget", type=byte_size, default=None,
                        help="host RAM this run's data may hold (topology, labels, feature cache), e.g. 6G: features "
                             "that do not fit go on disk, and the planner sizes their cache within it (default 80%% "
                             "of the memory available now)")


def feature_tier(args: argparse.Namespace, *, fill_cache: bool = True) -> dict[str, object]:
    """load_dataset's feature-tier arguments from the flags of `add_feature_tier_arguments`. With `fill_cache` False
    the store opens without a cache: a command that ranks the rows by its workload first fills the --feature-cache-mb
    it fixed once that ranking is known (`tiering.apply_tiering`), so the cache's rows are read once, not once by
    in-degree at load and again by the workload."""
    if args.feature_cache_mb is not None and not args.features_on_disk:
        raise ValueError("--feature-cache-mb sizes the cache of the feature store: add --features-on-disk, or drop it")
    cache_bytes = int((args.feature_cache_mb or 0) * 1e6) if fill_cache else 0
    return {"features_on_disk": args.features_on_disk, "feature_cache_bytes": cache_bytes}
