"""`morphpipe` command line: each component registers its own sub-commands."""
from __future__ import annotations

import argparse
import importlib
import os
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


# Errors that bad input or the environment cause (their messages name the problem): one line, exit 2.
# Anything else is a bug in morphpipe and keeps its traceback. MORPHPIPE_TRACEBACK=1 shows every traceback.
USER_ERRORS = (ValueError, OSError, EOFError, RuntimeError, MemoryError)
TRACEBACK_ENV = "MORPHPIPE_TRACEBACK"


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except USER_ERRORS as error:
        if os.environ.get(TRACEBACK_ENV) == "1":
            raise
        print(f"morphpipe {args.command}: error: {one_line(error)}", file=sys.stderr)
        return 2


def one_line(error: BaseException) -> str:
    """The error's message on one line (native errors append C++ context lines), with its type when it says little."""
    text = " ".join(part.strip() for part in str(error).splitlines() if part.strip())
    if isinstance(error, MemoryError):
        return f"out of memory{': ' + text if text else ''}; use a smaller dataset, batch or fanouts"
    if isinstance(error, OSError) and error.filename is not None and str(error.filename) not in text:
        text = f"{error.filename}: {text}"
    return text or type(error).__name__


if __name__ == "__main__":
    sys.exit(main())
