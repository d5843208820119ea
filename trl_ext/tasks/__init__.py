"""The worked tasks: ``doubling`` (a toy task, its tiny models, stages, presets and pipeline) and ``real_model``
(SmolLM2-135M-Instruct and a task with a verifiable reward)."""
