"""The worked task: the doubling task, its tiny models, stages, one PPO run, presets and the pipeline."""
