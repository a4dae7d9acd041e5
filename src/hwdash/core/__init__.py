"""The pure core of hwdash: the planner and the logic on live readings, without a UI.

Sub-packages by concern (docs/architecture.md draws them):

* the foundation, the modules directly here: the plan model (:mod:`~hwdash.core.plan`) and its
  field registry (:mod:`~hwdash.core.plan_fields`: each field's flag, help and form row), the
  catalog's entry schemas (:mod:`~hwdash.core.specs`), result types (:mod:`~hwdash.core.results`),
  units, number formatting, strict JSON, the packaged data files and the LoRA module-name tables;
* :mod:`hwdash.core.estimator`: memory per GPU of a plan (with its savers, parallelism and
  quantization);
* :mod:`hwdash.core.models`: a model from its config.json (the family readers), a bare parameter
  count, the Hugging Face cache;
* :mod:`hwdash.core.catalog`: the catalog loader (flavors, accelerators, models, frameworks);
* :mod:`hwdash.core.planning`: fit verdicts per flavor, run time and cost, make-it-fit;
* :mod:`hwdash.core.plans`: saved plans, imports of trainers' configs, exports;
* :mod:`hwdash.core.live`: alerts and the OOM forecast on telemetry snapshots.

May import: the standard library, pydantic and :mod:`hwdash.errors`; never Textual, the telemetry,
the UI or the commands. The foundation modules import only each other; each sub-package says what
it may import, and ``tests/unit/test_import_graph.py`` checks every import against those rules.
"""
