"""Megatron-LM (Megatron-Core with Transformer Engine): ``facts.yaml`` (the engine profile), ``arg_facts.jsonl``
(every ``pretrain_gpt.py`` option at the pinned commit), :mod:`.export` (a plan as ``pretrain_gpt.py``
arguments), :mod:`.importer` (a user's argument list or launch script as a plan), :mod:`.runner` (real trials
through ``pretrain_gpt.py``) and :mod:`.log` (its training log). Reached through :mod:`autotune.engines.registry`.
"""
