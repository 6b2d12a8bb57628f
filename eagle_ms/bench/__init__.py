"""Benchmark harness: datasets, per-turn runner, metrics, summary, sweeps, plots, msrun sharding.

Modules: ``datasets`` (question files -> turns), ``runner`` (``eagle-ms bench``), ``metrics`` (every
metric, defined once), ``summary`` (summary.json/md from traces), ``sweep`` (Table 2/3 sweeps),
``plots``, ``profile`` (``--profile`` stage split), ``progress``, ``distributed`` (msrun ranks).
Run directories and traces: ``eagle_ms.trace``.
"""
