"""Development tools: they run from a checkout of this repository and are not shipped.

``python -m devtools bench jpa|replay|runtime`` (benchmarks that read
``../shared/data`` or the examples), ``python -m devtools example`` (rebuild
``examples/`` from the public data), ``python -m devtools.demo_live`` (the live
demo driver), ``python -m devtools.synthjob`` (a synthetic malleable job for
the scheduling tests and the demo) and ``python -m devtools.elastic_drill`` (issue #26: an
elastic job's pauses against today's restart, and the seeded chaos run) and
``python -m devtools.gloo_exit`` (how often a finished DDP job aborts at exit, with and without
the adapters' ``settle_collectives``).
"""
