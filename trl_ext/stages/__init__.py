"""The stages before PPO, on TRL's trainers: supervised fine-tuning (``sft``) and a reward model from preference
pairs (``reward_model``)."""
