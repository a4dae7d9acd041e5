"""Logic on live readings, pure and UI-free: the alert engine (:mod:`~hwdash.core.live.alerts`),
the OOM forecast (:mod:`~hwdash.core.live.forecast`) and the health diagnoses
(:mod:`~hwdash.core.live.diagnoses`). The telemetry samplers feed them snapshots.

May import: the core's foundation only (never the planner's packages: a training box starts the
monitor without them).
"""
