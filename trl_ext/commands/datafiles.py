"""The .jsonl readers the commands use; they live in the library (``trl_ext.data_files``), which the
prompt files (``trl_ext.prompt_files``) read through too."""

from trl_ext.data_files import as_dataset, read_jsonl, require_one_format

__all__ = ["as_dataset", "read_jsonl", "require_one_format"]
