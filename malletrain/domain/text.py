"""Text from users, made safe to show."""
from __future__ import annotations


def shown(text: object) -> str:
    """``text`` safe for a terminal or a log line: control characters (escape sequences,
    carriage returns, newlines, NUL) are written as ``\\xNN``/``\\uNNNN``.  Every line the
    CLI prints that holds text from a user (job names, profiles, reasons, parameters) goes
    through this."""
    s = str(text)
    if s.isprintable():
        return s
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in s)
