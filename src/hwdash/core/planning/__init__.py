"""Planning: what a plan means on each flavor of the catalog.

* :mod:`~hwdash.core.planning.fit`: the fit verdict per flavor (fits / tight / no), with time and
  cost;
* :mod:`~hwdash.core.planning.fit_options`: make-it-fit, the smallest changes that fit (the
  search and the ranking);
* :mod:`~hwdash.core.planning.fit_knobs`: make-it-fit's knobs, what the search may change;
* :mod:`~hwdash.core.planning.run_time`: the one time model (hours, slowdowns);
* :mod:`~hwdash.core.planning.local_flavor`: this machine's GPUs as a flavor;
* :mod:`~hwdash.core.planning.serving_plan`: a serving plan (vLLM, SGLang) on the flavors: the
  engine's KV pool, the serving verdicts, the engine's memory as the report's estimate, its
  maximum concurrency;
* :mod:`~hwdash.core.planning.serving_command`: the server's command line (``--export vllm``, the
  planner's export).

May import: the core's foundation, :mod:`hwdash.core.estimator`, :mod:`hwdash.core.models` and
:mod:`hwdash.core.catalog`; never :mod:`hwdash.core.plans`, telemetry or the UI.
"""
