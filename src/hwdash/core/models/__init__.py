"""Models from what users give: a Hugging Face config.json (one reader per ``model_type``), a bare
parameter count, the local Hugging Face cache.

* :mod:`~hwdash.core.models.config`: the one door (:func:`~hwdash.core.models.config.resolve_model`,
  :func:`~hwdash.core.models.config.model_from_config`) and the Llama-style families;
* :mod:`~hwdash.core.models.families`: GPT-NeoX, BLOOM, GPT-2, BigCode, Falcon, OLMo, T5 and the
  registry of every reader; :mod:`~hwdash.core.models.family_deepseek`,
  :mod:`~hwdash.core.models.family_llama4` and :mod:`~hwdash.core.models.family_encoders` beside it;
* :mod:`~hwdash.core.models.fields`: reading config keys with messages that name them;
* :mod:`~hwdash.core.models.params`: parameter counts; :mod:`~hwdash.core.models.hf_cache`.

May import: the core's foundation and :mod:`hwdash.core.estimator` (a synthetic model is sized with
the estimator's layout); never the catalog loader (it imports this package), planning or plans.
"""
