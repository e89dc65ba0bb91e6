"""The small error hierarchy every malletrain component raises.

Every error a user can cause (bad file, bad flag, bad config) is an
:class:`InputError` and maps to exit code 2 in the CLI; everything else is a
bug or an environment failure and maps to exit code 1.
"""
from __future__ import annotations


class MalletrainError(Exception):
    """Base class of all errors raised on purpose by malletrain."""

    exit_code = 1


class InputError(MalletrainError):
    """Bad user input: a file, a flag or a config value.

    ``where`` names the file (and line/field when known) so that the message
    points the user at the exact spot to fix.
    """

    exit_code = 2

    def __init__(self, message: str, *, path: str | None = None,
                 line: int | None = None, field: str | None = None) -> None:
        self.message, self.path, self.line, self.field = message, path, line, field
        parts = []
        if path is not None:
            parts.append(str(path))
        if line is not None:
            parts.append(f"line {line}")
        if field is not None:
            parts.append(f"field '{field}'")
        prefix = ": ".join([", ".join(parts)]) + ": " if parts else ""
        super().__init__(prefix + message)


class ConfigError(InputError):
    """A configuration mapping failed validation (unknown key, bad value)."""


class SolverError(MalletrainError):
    """The optimisation solver failed in a way the caller must handle."""


class PlanError(MalletrainError):
    """A plan violates an invariant; it is never applied."""


class BackendError(MalletrainError):
    """A backend (Slurm, simulator) command failed."""


class StateError(MalletrainError):
    """The daemon's own state (its sqlite store, its status file) cannot be written or read:
    a full disk, a broken file.  The daemon then applies nothing until it can write again."""


def yaml_problem(exc: Exception) -> tuple[str, int | None]:
    """(message, 1-based line) of a PyYAML parse error, for an :class:`InputError`."""
    mark = getattr(exc, "problem_mark", None)
    return f"not valid YAML: {getattr(exc, 'problem', exc)}", (mark.line + 1 if mark else None)
