"""Rollout engines: the interface (``interface``: prompts in, ``Completions`` out, and the masks of what was
sampled), the registry of engines (``samplers``) and the engines themselves (``loop``, ``static_sampler``,
``vllm_sampler``)."""
