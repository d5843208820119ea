"""Models on disk and in memory: a model folder's checks (``directory``), the one loader by role (``loading``),
dtypes, activation checkpointing, GGUF files converted to Hugging Face checkpoints (``gguf``), and a digest of
weights (``digest``)."""
