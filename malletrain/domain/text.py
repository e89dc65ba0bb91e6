"""Text from users, made safe to show."""
from __future__ import annotations

import math


def shown(text: object) -> str:
    """``text`` safe for a terminal or a log line: control characters (escape sequences,
    carriage returns, newlines, NUL) are written as ``\\xNN``/``\\uNNNN``.  Every line the
    CLI prints that holds text from a user (job names, profiles, reasons, parameters) goes
    through this."""
    s = str(text)
    if s.isprintable():
        return s
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in s)


def clipped(value: object, limit: int = 60) -> str:
    """``repr(value)`` made safe (:func:`shown`) and cut to ``limit`` characters, for error
    messages about user values: a 400-digit number or a megabyte string stays one short line."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**30:
        if abs(value) < 10**4000:       # str() refuses more than 4300 digits
            return f"a {len(str(abs(value)))}-digit integer"
        return f"an integer of about {math.floor(math.log10(abs(value))) + 1} digits"
    text = shown(repr(value))
    return text if len(text) <= limit else text[:limit - 3] + "..."


def error_line(exc: BaseException, limit: int = 200) -> str:
    """``Type: message`` of an exception, made safe (:func:`shown`) and cut to ``limit``
    characters: what a reason, a note or a status line says of an error."""
    text = shown(f"{type(exc).__name__}: {exc}")
    return text if len(text) <= limit else text[:limit - 3] + "..."
