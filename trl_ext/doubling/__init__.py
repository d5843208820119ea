"""The worked task: the doubling task of seed 000, its tiny models, stages, one PPO run, presets and the pipeline."""
