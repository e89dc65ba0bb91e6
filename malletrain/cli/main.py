"""The ``malletrain`` command line: one parser, one dispatch (each command sets ``run``).

Errors in user input exit with code 2 and one line naming the file, line and field.
"""
from __future__ import annotations

import argparse
import logging
import sys

from malletrain import __version__
from malletrain.cli import offline, user
from malletrain.domain.errors import MalletrainError


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="malletrain",
        description="Harvest transiently idle Slurm nodes for malleable DNN training; "
                    "replay past schedules to see what a centre would gain.")
    p.add_argument("--version", action="version", version=f"malletrain {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    offline.add_commands(sub)
    user.add_commands(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="malletrain: %(levelname)s %(name)s: %(message)s")
    try:
        return int(args.run(args))
    except MalletrainError as exc:
        print(f"malletrain: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("malletrain: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
