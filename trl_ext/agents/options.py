"""The command line's multi-turn options (``rlhf --tools module:fn,... --environment module:Factory``, or a public
environment by name: ``--environment gem:game:GuessTheNumber-v0-easy``); ``trl_ext.runs.agents`` loads what they
name."""

from __future__ import annotations

from dataclasses import dataclass

from trl_ext.agents.public_environments import is_public_environment
from trl_ext.agents.steps import REWARD_MODES
from trl_ext.agents.templates import TOOL_TEMPLATES
from trl_ext.errors import InputError
from trl_ext.settings.fields import field, require_positive


@dataclass
class AgentOptions:
    """Tools and an environment for multi-turn rollouts (TRL GRPOTrainer's ``tools`` and ``environment_factory``;
    docs/multi-turn.md)."""

    tools: str | None = field(
        None,
        help="tools the policy may call, as 'module:function' or 'file.py:function', "
        "comma-separated: plain functions with type hints and a docstring",
    )
    environment: str | None = field(
        None,
        help="an environment class or factory as 'module:Factory': one instance "
        "a rollout, reset(**row) per batch, its public methods are tools, get_reward() "
        "an optional reward; or a public game by name, 'gem:NAME' (e.g. gem:game:GuessTheNumber-v0-easy) "
        "or 'textarena:NAME' (e.g. textarena:GuessTheNumber-v0), played turn by turn (its observations "
        "as user turns, the model's replies its moves) on the train games of --seed (the gem and "
        "textarena extras; docs/environments.md)",
    )
    environment_turns: int | None = field(
        None, help="a public environment's turns an episode at most (None: the game's own limit)"
    )
    turn_tokens: int | None = field(
        None, help="a public environment's tokens a turn at most (None: what is left of --response-length)"
    )
    environment_rewards: str = field(
        "turn",
        help="a public environment's rewards: 'turn' (each step's on its turn, where GAE credits it) or "
        "'final' (the episode's return as the score)",
        choices=REWARD_MODES,
    )
    environment_games: int = field(1000, help="a public environment's train games (seeds --seed + i), cycled")
    environment_eval_games: int = field(
        0,
        help="play the first N test games of a public environment (seeds --seed + 2**31 + i, never trained on), "
        "greedy and sampled at --temperature, before and after training: win rate and mean return in "
        "summary.json's games.test and environment_eval.json (0: not at all)",
    )
    tool_template: str | None = field(
        None,
        help="give the policy's tokenizer this tool chat template (for a model "
        "whose own template has no tool support, e.g. SmolLM2's ChatML)",
        choices=(*TOOL_TEMPLATES,),
    )

    def __post_init__(self):
        if self.tool_template is not None and self.tool_template not in TOOL_TEMPLATES:
            raise InputError(f"tool_template must be one of {', '.join(TOOL_TEMPLATES)}; got {self.tool_template!r}")
        if self.environment_rewards not in REWARD_MODES:
            raise InputError(
                f"environment_rewards must be one of {', '.join(REWARD_MODES)}; got {self.environment_rewards!r}"
            )
        require_positive(self, "environment_games")
        if self.environment_eval_games < 0:
            raise InputError(f"--environment-eval-games must be 0 or more (0: none), got {self.environment_eval_games}")
        if self.environment_eval_games and not self.public_environment:
            raise InputError(
                "--environment-eval-games plays a public environment's test games: give --environment gem:NAME"
            )
        for name in ("environment_turns", "turn_tokens"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise InputError(f"--{name.replace('_', '-')} must be 1 or more, got {getattr(self, name)}")
        if self.public_environment and self.tools:
            raise InputError(f"--environment {self.environment} plays a game turn by turn: give it without --tools")
        if not self.public_environment and (self.environment_turns or self.turn_tokens):
            raise InputError(
                "--environment-turns and --turn-tokens set a public environment's turns (gem:NAME, textarena:NAME)"
            )

    @property
    def public_environment(self) -> bool:
        """Whether --environment names a public game (``gem:NAME``, ``textarena:NAME``), played by ``step()``."""
        return is_public_environment(self.environment)

    @property
    def multi_turn(self) -> bool:
        return bool(self.tools or self.environment)
