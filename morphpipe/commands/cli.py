"""`morphpipe` command line: each sub-command module of morphpipe.commands registers its parser."""
from __future__ import annotations

import argparse
import os
import re
import sys

from morphpipe.commands import bench, data, evaluate, info, simulate, train, tune

# Each exposes `register(subparsers)`; the order is the order of --help.
COMMAND_MODULES = (tune, train, evaluate, simulate, bench, data, info)


class Parser(argparse.ArgumentParser):
    """argparse's parser (sub-commands inherit it) whose one unclear refusal gets its fix: an option's value that
    begins with '-' and is not a plain negative number (`--split -0.1,0.5,0.6`) is read as another option."""

    def error(self, message: str):
        missing = re.fullmatch(r"argument (\S+): expected one argument", message)
        if missing is not None:
            option = missing.group(1).split("/")[-1]
            message += f" (a value that begins with '-' is attached with '=': {option}=VALUE)"
        super().error(message)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="morphpipe",
        description="Hardware-adaptive mini-batch GNN training: profile, plan, train.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    subparsers.required = True
    for module in COMMAND_MODULES:
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
