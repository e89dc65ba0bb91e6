"""The site's per-node facts: topology group and speed (``replay --node-info FILE``, the
daemon's ``slurm.node_info``).

CSV with header ``node,group,slowdown``: ``group`` a topology group (switch, rack,
cabinet; may be empty), ``slowdown`` the node's relative step time (1.0 nominal, 1.1 ten
per cent slower; from per-GPU measurements such as PAL's).  Nodes the file does not list
are nominal and in no group.  The live daemon reads the same file besides what Slurm says
(its topology switches give groups where the file gives none).  Bad rows are an error naming
file, line and field.
"""
from __future__ import annotations

import csv
import io
import math

from malletrain.domain.config import read_text
from malletrain.domain.errors import InputError
from malletrain.domain.text import clipped

MAX_BYTES = 64 << 20
MAX_NAME = 256


def load_node_info(path: str, error: type[InputError] = InputError) -> dict[str, tuple[str, float]]:
    text = read_text(path, max_bytes=MAX_BYTES, what="node info", error=error)
    reader = csv.reader(io.StringIO(text, newline=""))
    out: dict[str, tuple[str, float]] = {}
    try:
        header = next(reader, None)
        if header is None or [h.strip() for h in header] != ["node", "group", "slowdown"]:
            raise error(f"header must be node,group,slowdown, got {clipped(','.join(header or []))}",
                        path=path, line=1)
        for row in reader:
            line = reader.line_num
            if not row or not "".join(row).strip():
                continue
            if len(row) != 3:
                raise error(f"expected 3 fields, got {len(row)}", path=path, line=line)
            node, group, raw = (x.strip() for x in row)
            if not node or len(node) > MAX_NAME:
                raise error(f"expected a node name (1 to {MAX_NAME} characters)", path=path, line=line,
                            field="node")
            if len(group) > MAX_NAME:
                raise error(f"at most {MAX_NAME} characters", path=path, line=line, field="group")
            try:
                slowdown = float(raw)
            except ValueError:
                raise error(f"not a number: {clipped(raw)}", path=path, line=line, field="slowdown") from None
            if not (math.isfinite(slowdown) and 0.1 <= slowdown <= 10.0):
                raise error(f"must be from 0.1 to 10, got {clipped(raw)}", path=path, line=line,
                            field="slowdown")
            if node in out:
                raise error(f"node {clipped(node)} listed twice", path=path, line=line, field="node")
            out[node] = (group, slowdown)
    except csv.Error as exc:
        raise error(f"not CSV: {exc}", path=path, line=reader.line_num) from None
    return out
