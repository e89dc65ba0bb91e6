"""Stop requests from Slurm: SIGTERM (preemption, requeue) and SIGUSR2 (time limit).

SIGUSR1 is never taken: NCCL uses it.  The first signal asks for a checkpoint
at the next step boundary.  The checkpoint is *forced* (the step in progress is
abandoned and the state of the last boundary saved) when

* a second signal arrives at least ``repeat_gap_s`` after the first (srun
  forwards the signal it gets while slurmstepd signals the tasks too, so two
  deliveries within a moment are one request), or
* ``deadline_s`` has passed since the first signal.
"""
from __future__ import annotations

import signal
import time
from typing import Any

SIGNALS = (signal.SIGTERM, signal.SIGUSR2)


class StopRequest:
    def __init__(self, *, deadline_s: float, repeat_gap_s: float = 1.0, clock=time.monotonic) -> None:
        self.deadline_s, self.repeat_gap_s, self.clock = deadline_s, repeat_gap_s, clock
        self.signum: int | None = None
        self.t_first: float | None = None      # monotonic time of the first signal
        self.wall_first: float | None = None   # wall time of the first signal (for logs)
        self.repeated = False
        self._previous: dict[int, Any] = {}

    def install(self) -> StopRequest:
        for sig in SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def uninstall(self) -> None:
        for sig, old in self._previous.items():
            signal.signal(sig, old)
        self._previous.clear()

    def _handle(self, signum, frame) -> None:
        self.notify(signum)

    def notify(self, signum: int) -> None:
        now = self.clock()
        if self.t_first is None:
            self.signum, self.t_first, self.wall_first = signum, now, time.time()
        elif now - self.t_first >= self.repeat_gap_s:
            self.repeated = True

    def peer(self, age_s: float) -> None:
        """Another rank of the job got the signal ``age_s`` seconds ago and the ranks agreed to
        stop before this one got its own copy (torchrun agents forward a preemption's SIGTERM
        each at its own time): the stop counts from the first signal anywhere in the job."""
        if self.t_first is None:
            now = self.clock()
            self.t_first, self.wall_first = now - max(0.0, age_s), time.time() - max(0.0, age_s)

    @property
    def requested(self) -> bool:
        return self.t_first is not None

    @property
    def forced(self) -> bool:
        if self.t_first is None:
            return False
        return self.repeated or self.clock() - self.t_first >= self.deadline_s

    def since_s(self) -> float | None:
        return None if self.t_first is None else self.clock() - self.t_first

    def name(self) -> str:
        if self.signum:
            return signal.Signals(self.signum).name
        return "peer" if self.t_first is not None else "-"
