"""Adapters: a framework's own training loop made malleable, without rewriting it for :class:`Runtime`.

Each adapter maps one framework onto the harvester's contract: stop at a step boundary on the
stop signal (every rank agrees), checkpoint atomically, resume from the newest good checkpoint
at any world size with the same global batch, write progress and metric records (for the
daemon's profiler and a campaign's pruner), and exit 3 when the work is not finished so that
the batch script requeues the job.

* :mod:`malletrain.adapters.contract` — what they share: the settings, the world-size
  independent data plan (global batch, micro-batches, accumulation), the stop flag, the records.
* :mod:`malletrain.adapters.ddp` — a plain PyTorch DDP loop (``torchrun``,
  ``malletrain submit --launch torchrun``).
* :mod:`malletrain.adapters.lightning` — a PyTorch Lightning 2.x ``Trainer`` (a callback and a
  checkpoint I/O plugin; the ``lightning`` extra), under torchrun too.
* :mod:`malletrain.adapters.hf` — a Hugging Face ``Trainer`` (a ``TrainerCallback``; the ``hf``
  extra): checkpoints sealed with a manifest, a fixed per-device batch.
* :mod:`malletrain.adapters.accelerate` — a hand-written Accelerate loop (``save_state`` into a
  sealed directory, the micro-batch counter reset at the step boundary; the ``hf`` extra).

The room imports ``runtime`` (checkpoints, stop signals, progress records, a campaign trial's
reporter) and ``domain``; the frameworks are imported by the adapter that needs them (the
``train``, ``lightning`` and ``hf`` extras), never by the daemon.
"""
