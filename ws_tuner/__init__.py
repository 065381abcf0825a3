"""ws-tune: search TileLang warp-specialization schedules for the fastest Hopper kernel.

The stages, one module each: ``kernel`` (the kernel file contract) ->
``space`` (schedule variants) -> ``candidate`` -> ``builder`` -> ``runner``
-> ``store``; ``search`` picks candidates and ``tune`` wires the stages.
The Python lookup API is ``ws_tuner.lookup``.
"""

__version__ = "0.1.0"
