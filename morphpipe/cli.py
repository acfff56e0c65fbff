"""`morphpipe` command line: each component registers its own sub-commands."""
from __future__ import annotations

import argparse
import importlib
import sys

# Sub-command modules, each exposing `register(subparsers)`; the order is the order of --help.
COMMAND_MODULES = [
    "morphpipe.tune",  # tune
    "morphpipe.executor.commands",  # train
    "morphpipe.executor.evaluate_command",  # evaluate
    "morphpipe.scheduler.commands",  # simulate
    "morphpipe.sampling.commands",  # bench
    "morphpipe.data.commands",  # data generate | convert | info
    "morphpipe.info",  # info
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="morphpipe",
        description="Hardware-adaptive mini-batch GNN training: profile, plan, train.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    subparsers.required = True
    for module_name in COMMAND_MODULES:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as error:
            if error.name != module_name:
                raise
            continue
        module.register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except (ValueError, FileNotFoundError, FileExistsError, RuntimeError) as error:
        print(f"morphpipe {args.command}: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
