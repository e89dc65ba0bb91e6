"""A training state as plain bytes: what a joining process receives from the survivors.

A state (the dict :meth:`Runtime.state` builds: model, optimizer and scheduler state dicts,
RNG states, counters) becomes one ``uint8`` tensor: a JSON header that describes the
structure, followed by every tensor's raw bytes.  Nothing is pickled, so a peer's bytes can
never run code here; :func:`decode` checks every field of the header against bounds before it
allocates anything and refuses what does not add up with :class:`WireError`.

Header: ``{"v": 1, "tree": T, "tensors": [[dtype, shape, offset, nbytes], ...]}`` where T is
the state with each tensor replaced by ``{"t": i}``, each tuple by ``{"tuple": [...]}`` and
each dict by ``{"dict": [[key, value], ...]}`` (keys keep their type: str or int).  The
encoding is deterministic, so two processes holding equal states produce equal bytes (and
equal SHA-256 digests: the transfer is checked that way).
"""
from __future__ import annotations

import hashlib
import json
import math
import struct
from typing import Any

import torch

from malletrain.domain.errors import MalletrainError

VERSION = 1
HEADER_MAX = 16 << 20          # bytes of JSON a peer may send
TENSORS_MAX = 100_000
DEPTH_MAX = 32
DTYPES = {name: getattr(torch, name) for name in (
    "float32", "float64", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "bool")}
_NAMES = {dt: name for name, dt in DTYPES.items()}
_LEN = struct.Struct("<Q")


class WireError(MalletrainError):
    """Bytes that are not a state this module wrote (truncated, out of bounds, wrong digest)."""


def encode(state: Any) -> torch.Tensor:
    """``state`` as one contiguous CPU ``uint8`` tensor (header length, header, tensor bytes)."""
    tensors: list[torch.Tensor] = []
    tree = _tree(state, tensors, 0)
    meta: list[list] = []
    spans: list[tuple[int, int]] = []
    offset = 0
    for t in tensors:
        n = t.numel() * t.element_size()
        meta.append([_NAMES[t.dtype], list(t.shape), offset, n])
        spans.append((offset, n))
        offset += n
    header = json.dumps({"v": VERSION, "tree": tree, "tensors": meta}, separators=(",", ":"),
                        allow_nan=True).encode()
    out = torch.empty(_LEN.size + len(header) + offset, dtype=torch.uint8)
    out[:_LEN.size] = torch.frombuffer(bytearray(_LEN.pack(len(header))), dtype=torch.uint8)
    out[_LEN.size:_LEN.size + len(header)] = torch.frombuffer(bytearray(header), dtype=torch.uint8)
    pos = _LEN.size + len(header)
    for t, (off, n) in zip(tensors, spans):
        if n:
            out[pos + off:pos + off + n] = t.detach().cpu().contiguous().reshape(-1).view(torch.uint8)
    return out


def digest(blob: torch.Tensor) -> str:
    return hashlib.sha256(blob.numpy().tobytes()).hexdigest()


def decode(blob: torch.Tensor) -> Any:
    """The state :func:`encode` turned into ``blob``; every tensor is a fresh copy."""
    raw = blob.numpy().tobytes()
    if len(raw) < _LEN.size:
        raise WireError("state transfer: shorter than its header length")
    (hlen,) = _LEN.unpack_from(raw)
    if hlen > HEADER_MAX or _LEN.size + hlen > len(raw):
        raise WireError(f"state transfer: header of {hlen} bytes does not fit")
    try:
        head = json.loads(raw[_LEN.size:_LEN.size + hlen].decode())
    except (UnicodeDecodeError, ValueError):
        raise WireError("state transfer: header is not JSON") from None
    if not isinstance(head, dict) or head.get("v") != VERSION or not isinstance(head.get("tensors"), list):
        raise WireError("state transfer: not a version-1 state header")
    body = memoryview(raw)[_LEN.size + hlen:]
    metas = head["tensors"]
    if len(metas) > TENSORS_MAX:
        raise WireError(f"state transfer: {len(metas)} tensors (at most {TENSORS_MAX})")
    tensors, offset = [], 0
    for i, m in enumerate(metas):           # the spans tile the body: nothing read twice
        tensors.append(_tensor(m, body, i, offset))
        offset += m[3]
    if offset != len(body):
        raise WireError(f"state transfer: {len(body) - offset} bytes past the last tensor")
    return _untree(head.get("tree"), tensors, 0)


def _tensor(meta: Any, body: memoryview, i: int, offset: int) -> torch.Tensor:
    ok = (isinstance(meta, list) and len(meta) == 4 and isinstance(meta[0], str) and meta[0] in DTYPES
          and isinstance(meta[1], list) and len(meta[1]) <= DEPTH_MAX
          and all(type(d) is int and 0 <= d <= max(len(body), 1 << 20) for d in meta[1]) and meta[2] == offset
          and type(meta[2]) is int and type(meta[3]) is int and 0 <= meta[3] <= len(body) - offset)
    if not ok:
        raise WireError(f"state transfer: tensor {i} is described out of bounds")
    dtype = DTYPES[meta[0]]
    size = torch.empty((), dtype=dtype).element_size()
    if math.prod(meta[1]) * size != meta[3]:
        raise WireError(f"state transfer: tensor {i}'s shape does not match its {meta[3]} bytes")
    if meta[3] == 0:
        return torch.empty(meta[1], dtype=dtype)
    chunk = bytearray(body[meta[2]:meta[2] + meta[3]])
    return torch.frombuffer(chunk, dtype=torch.uint8).view(dtype).reshape(meta[1]).clone()


def _tree(x: Any, tensors: list, depth: int) -> Any:
    if depth > DEPTH_MAX:
        raise WireError("state transfer: the state nests too deeply")
    if isinstance(x, torch.Tensor):
        if x.dtype not in _NAMES:
            raise WireError(f"state transfer: tensors of {x.dtype} are not carried")
        tensors.append(x)
        return {"t": len(tensors) - 1}
    if isinstance(x, dict):
        items = []
        for k, v in x.items():
            if type(k) not in (str, int):
                raise WireError(f"state transfer: a key of type {type(k).__name__} is not carried")
            items.append([k, _tree(v, tensors, depth + 1)])
        return {"dict": items}
    if isinstance(x, tuple):
        return {"tuple": [_tree(v, tensors, depth + 1) for v in x]}
    if isinstance(x, list):
        return [_tree(v, tensors, depth + 1) for v in x]
    if x is None or isinstance(x, (bool, int, float, str)):
        return x
    raise WireError(f"state transfer: a value of type {type(x).__name__} is not carried")


def _untree(x: Any, tensors: list, depth: int) -> Any:
    if depth > DEPTH_MAX:
        raise WireError("state transfer: the state nests too deeply")
    if isinstance(x, list):
        return [_untree(v, tensors, depth + 1) for v in x]
    if isinstance(x, dict):
        if len(x) != 1:
            raise WireError("state transfer: a malformed node in the state tree")
        (kind, v), = x.items()
        if kind == "t" and type(v) is int and 0 <= v < len(tensors):
            return tensors[v]
        if kind == "tuple" and isinstance(v, list):
            return tuple(_untree(e, tensors, depth + 1) for e in v)
        if kind == "dict" and isinstance(v, list) and all(
                isinstance(e, list) and len(e) == 2 and type(e[0]) in (str, int) for e in v):
            return {e[0]: _untree(e[1], tensors, depth + 1) for e in v}
        raise WireError("state transfer: a malformed node in the state tree")
    if x is None or isinstance(x, (bool, int, float, str)):
        return x
    raise WireError("state transfer: a malformed value in the state tree")
