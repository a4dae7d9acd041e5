"""Plans as files: the saved plans (:mod:`~hwdash.core.plans.store`), trainers' configs read back
(``--from``: :mod:`~hwdash.core.plans.imports`, which hands each format to its ``from_*`` reader)
and written out (``--export``: :mod:`~hwdash.core.plans.exports`).

May import: the core's foundation, :mod:`hwdash.core.estimator`, :mod:`hwdash.core.models`,
:mod:`hwdash.core.catalog` and :mod:`hwdash.core.planning`.
"""
