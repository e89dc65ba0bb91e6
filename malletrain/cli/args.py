"""Argument types shared by the command-line parsers (argparse stops in this package)."""
from __future__ import annotations

import argparse
import math
from collections.abc import Callable

from malletrain.domain.text import shown


def time_arg(text: str) -> float:
    from malletrain.domain.timeutil import parse_time
    try:
        return parse_time(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not ISO-8601 or epoch seconds: {text!r}") from None


def positive(kind: Callable) -> Callable:
    def conv(text: str):
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not v > 0 or (isinstance(v, float) and not math.isfinite(v)):
            raise argparse.ArgumentTypeError(f"must be > 0: {text!r}")
        return v
    return conv


def nonneg_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not (v >= 0 and math.isfinite(v)):
        raise argparse.ArgumentTypeError(f"must be >= 0: {text!r}")
    return v



def say(text: str, **kw) -> None:
    """Print one line of output with every control character escaped (:func:`shown`)."""
    print(shown(text), **kw)
