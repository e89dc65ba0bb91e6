"""Argument types shared by the command-line parsers (argparse stops in this package)."""
from __future__ import annotations

import argparse
from collections.abc import Callable

from malletrain.domain.text import clipped, shown


def time_arg(text: str) -> float:
    from malletrain.domain.timeutil import parse_time
    try:
        return parse_time(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not ISO-8601 or epoch seconds (years 1 to 9999): "
                                         f"{clipped(text)}") from None


def positive(kind: Callable, most: float) -> Callable:
    """An argparse type: a finite ``kind`` (int or float) > 0 and <= ``most``."""
    return bounded(kind, 0, most, above=True)


def bounded(kind: Callable, least: float, most: float, *, above: bool = False) -> Callable:
    """An argparse type: a finite ``kind`` (int or float) in [least, most] (``above``: > least).
    NaN, ±inf, 1e999 and a 310-digit integer are refused with the bounds, never passed on."""
    want = f"{'>' if above else '>='} {least:g} and <= {most:g}"

    def conv(text: str):
        try:
            v = kind(text)
        except ValueError:       # also an integer of more than 4300 digits
            raise argparse.ArgumentTypeError(f"not {'an integer' if kind is int else 'a number'}: "
                                             f"{clipped(text)}") from None
        if not ((v > least if above else v >= least) and v <= most):   # NaN fails both
            raise argparse.ArgumentTypeError(f"must be {want}: {clipped(text)}")
        return v
    conv.__name__ = kind.__name__   # argparse names the type in its messages
    return conv


def say(text: str, **kw) -> None:
    """Print one line of output with every control character escaped (:func:`shown`)."""
    print(shown(text), **kw)
