"""A reward function for tests/test_chat_prompts.py (``--reward-fn tests/chat_prompt_rewards.py:record``):
it writes what each call is handed to the JSON-lines file named by $CHAT_PROMPTS_RECORD."""

import json
import os


def record(prompts, completions, completion_ids=None, **kwargs):
    with open(os.environ["CHAT_PROMPTS_RECORD"], "a", encoding="utf-8") as f:
        f.write(
            json.dumps(
                {
                    "prompts": prompts,
                    "completions": completions,
                    "completion_ids": completion_ids,
                    "columns": {k: v for k, v in kwargs.items() if isinstance(v, list)},
                }
            )
            + "\n"
        )
    return [0.5] * len(completions)
