"""What the command line hides: notices a user of trl-ext can do nothing about, and progress bars
of library internals (saving and loading weights). The library silences nothing but the banner TRL 1.12's PPO
prints every update (``trl_ext.runs.runners.stdout_without``).

``quiet()`` runs in the CLI's process and again in every worker process the pipeline spawns: a
spawned process starts with fresh warning filters and loggers.
"""

from __future__ import annotations

import logging
import re
import warnings

# Each is a message about how trl-ext calls its dependencies, not about the user's input.
HIDDEN_WARNINGS = (
    r"You are importing from 'trl\.experimental'",  # the trl backend exists to import it
    # transformers 5.24's rename of gradient checkpointing: we pass the new name, but TRL 1.12's PPO, PEFT and TRL's
    # model utilities still read `is_gradient_checkpointing`
    r".*deprecated and will be removed in v6",
)
HIDDEN_LOG_LINES = re.compile(
    r"Setting accelerator to CPU"  # DeepSpeed, when imported on a machine without a GPU
    r"|`loss_type=None` was set in the config"  # transformers, about the tiny models' saved config
    r"|We strongly recommend passing in an `attention_mask`"  # generate on left-padded prompts: it is passed
    r"|Passing `generation_config` together with generation-related arguments"  # TRL 1.12's own generate call
    r"|Failed to load .*torchao"  # torchao's CUDA kernels, on a machine without them (transformers imports it)
    r"|is an Enum subclass and is now natively supported by torch\.compile"  # torch, of torchao's enums
)
# Loggers that print at import, each with its own name: a filter on a logger survives the import.
IMPORT_LOGGERS = ("DeepSpeed", "torchao", "torch.utils._pytree")


def _keep(record: logging.LogRecord) -> bool:
    return not HIDDEN_LOG_LINES.search(record.getMessage())


def quiet() -> None:
    for message in HIDDEN_WARNINGS:
        warnings.filterwarnings("ignore", message=message)
    for name in IMPORT_LOGGERS:  # DeepSpeed makes its logger at import, with its own handler
        logging.getLogger(name).addFilter(_keep)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # "Writing model shards", "Loading weights"
    for handler in hf_logging.get_logger().handlers:  # module loggers propagate to this handler
        handler.addFilter(_keep)
