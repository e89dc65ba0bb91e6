"""The shared vocabulary (the ``domain`` room): typed frozen records (:mod:`~malletrain.domain.model`),
the one config schema (:mod:`~malletrain.domain.config`), the error hierarchy
(:mod:`~malletrain.domain.errors`), nodes' site facts, safe file writes, time and text helpers.

Imports nothing of malletrain's.
"""
