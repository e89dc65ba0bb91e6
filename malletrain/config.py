"""The one configuration schema.

Every section is a frozen dataclass; :func:`from_mapping` builds one from a
parsed YAML/CLI mapping and rejects unknown keys with the list of valid ones,
wrong types and out-of-range values, naming the file and key.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Mapping, TypeVar

from malletrain.errors import ConfigError

POLICIES = ("malletrain", "oracle", "bftrainer", "greedy", "static")
ALLOCATORS = ("auto", "dp", "cbc", "highs", "greedy")


@dataclass(frozen=True)
class CoreConfig:
    """Knobs of the pure decision core (shared by daemon and replay)."""

    policy: str = "malletrain"     # which policy decides (see POLICIES)
    horizon_s: float = 600.0       # look-ahead H of the objective
    allocator: str = "auto"        # auto: exact DP for one node type, else MILP
    time_limit_s: float = 5.0      # MILP solver limit per decision
    max_candidates: int = 32       # candidate sizes per job (geometric grid beyond)
    min_dwell_s: float = 0.0       # a job keeps a new size at least this long
    bftrainer_time_limit_s: float = 10.0  # BFTrainer's per-decision solver limit
    static_size: str = "max"       # static policy: run each job at 'max' or 'min' nodes

    def validate(self, where: str = "config") -> "CoreConfig":
        _choice(self.policy, POLICIES, where, "policy")
        _choice(self.allocator, ALLOCATORS, where, "allocator")
        _choice(self.static_size, ("max", "min"), where, "static_size")
        for name in ("horizon_s", "time_limit_s", "bftrainer_time_limit_s"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"must be > 0, got {getattr(self, name)!r}", path=where, field=name)
        if self.min_dwell_s < 0:
            raise ConfigError("must be >= 0", path=where, field="min_dwell_s")
        if self.max_candidates < 2:
            raise ConfigError("must be >= 2", path=where, field="max_candidates")
        return self


def _choice(value: str, allowed: tuple[str, ...], where: str, key: str) -> None:
    if value not in allowed:
        raise ConfigError(f"{value!r} is not one of: {', '.join(allowed)}", path=where, field=key)


T = TypeVar("T")


def from_mapping(cls: type[T], data: Mapping[str, Any] | None, where: str = "config") -> T:
    """Build ``cls`` from ``data``; unknown keys and bad types are errors."""
    data = dict(data or {})
    valid = {f.name: f for f in fields(cls)}
    unknown = sorted(set(data) - set(valid))
    if unknown:
        raise ConfigError(f"unknown key(s) {', '.join(unknown)}; valid keys: "
                          f"{', '.join(sorted(valid))}", path=where)
    kwargs = {}
    for key, value in data.items():
        default = valid[key].default
        kwargs[key] = _coerce(value, default, where, key)
    obj = cls(**kwargs)
    validate = getattr(obj, "validate", None)
    return validate(where) if validate else obj


def _coerce(value: Any, default: Any, where: str, key: str) -> Any:
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise ConfigError(f"expected true/false, got {value!r}", path=where, field=key)
        return value
    if isinstance(default, (int, float)) and not isinstance(default, bool):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"expected a number, got {value!r}", path=where, field=key)
        if isinstance(default, int) and not float(value).is_integer():
            raise ConfigError(f"expected an integer, got {value!r}", path=where, field=key)
        return type(default)(value)
    if isinstance(default, str) and not isinstance(value, str):
        raise ConfigError(f"expected a string, got {value!r}", path=where, field=key)
    return value
