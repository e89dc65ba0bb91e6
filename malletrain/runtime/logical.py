"""Logical workers (EasyScale-style): the pure parts.

A job trains with a fixed number L of *logical workers* whatever the number P
of processes it got (1 <= P <= L).  Each logical worker has its own
micro-batch of fixed shape and its own RNG stream; a process runs the logical
workers it owns one after the other.  What each logical worker sees at a step
is a pure function of ``(seed, epoch, step, worker)``, so the work of a step
does not depend on P or on which process runs which worker.
"""
from __future__ import annotations

import hashlib

MAPPINGS = ("contiguous", "round_robin")


def assign(workers: int, procs: int, mapping: str | list[list[int]] = "contiguous") -> list[tuple[int, ...]]:
    """The logical workers each process owns, as one tuple per rank.

    ``contiguous`` gives rank r a block (sizes differ by at most one, larger
    blocks first); ``round_robin`` deals them out; an explicit list of lists is
    checked and used as given (uneven mappings for tests).  Logical worker 0 is
    always on rank 0 with the built-in mappings.
    """
    if not 1 <= procs <= workers:
        raise ValueError(f"need 1 <= processes <= logical workers, got P={procs}, L={workers}")
    if isinstance(mapping, list):
        owned = [tuple(int(w) for w in ws) for ws in mapping]
        flat = sorted(w for ws in owned for w in ws)
        if len(owned) != procs or flat != list(range(workers)) or any(not ws for ws in owned):
            raise ValueError(f"mapping {mapping} does not give each of {procs} processes a "
                             f"non-empty share of workers 0..{workers - 1} exactly once")
        return owned
    if mapping == "contiguous":
        base, extra = divmod(workers, procs)
        out, start = [], 0
        for r in range(procs):
            n = base + (1 if r < extra else 0)
            out.append(tuple(range(start, start + n)))
            start += n
        return out
    if mapping == "round_robin":
        return [tuple(range(r, workers, procs)) for r in range(procs)]
    raise ValueError(f"unknown mapping {mapping!r}; valid: {', '.join(MAPPINGS)}")


def mix(*parts: int) -> int:
    """A 63-bit seed from integers (stable across runs and platforms)."""
    h = hashlib.blake2b(",".join(str(int(p)) for p in parts).encode(), digest_size=8).digest()
    return int.from_bytes(h, "little") & ((1 << 63) - 1)


def steps_per_epoch(dataset_len: int, workers: int, micro_batch: int) -> int:
    n = dataset_len // (workers * micro_batch)
    if n < 1:
        raise ValueError(f"dataset of {dataset_len} samples is smaller than one global batch "
                         f"({workers} workers x {micro_batch})")
    return n


def epoch_of(step: int, per_epoch: int) -> tuple[int, int]:
    """(epoch, step within the epoch) of a global step."""
    return divmod(step, per_epoch)
