"""PPO learns on a real GEM game: GuessTheNumber-easy (1-10 in 4 turns), a tiny word-level model
(``trl_ext.tasks.toy_game``) warm started by SFT on the random player's games (``warm_start_rows``: the game's
format, not its strategy), then PPO with its critic (GAE, GEM's per-turn rewards) on the train games; on 200 test
games (never trained on) the sampled mean return rises at every seed.

What rises is the return, not yet the win rate (issue 81's target). Measured on a loaded 2-core CPU, these settings
(test games sampled at T=1; before -> after 60 updates of 32 games):

| seed | mean return | win rate |
|---|---|---|
| 0 | 0.615 -> 0.675 | 0.295 -> 0.29 |
| 1 | 0.633 -> 0.739 | 0.33 -> 0.39 |
| 2 | 0.670 -> 0.733 | 0.31 -> 0.38 |

The random player wins 0.365 of the same games of seed 0. The return PPO finds first is GEM's partial score for a
last guess near the target (``1 - distance / 9``), which a policy raises by ending near the middle, not by reading
the hints: at seed 0, 200 updates take the return to 0.72 and the win rate down to 0.255 (greedy 0.13 -> 0.07).
At learning rate 1e-3 and above the first update breaks the warm start's format at some seeds (seed 2: the
first move's ``\\boxed{`` from 0.994 to under 0.11, at an approximate KL of 0.003 on the tokens trained; AdamW's
first steps moving every weight by about the rate is our guess): every episode then ends on turn 1 with GEM's
format penalty, and no advantage is left to recover with.
"""

import pytest

GAME = "gem:game:GuessTheNumber-v0-easy"
UPDATES, GAMES, TEST_GAMES = 60, 32, 200


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_ppo_from_a_random_players_warm_start_raises_the_return_on_test_games(seed, tmp_path):
    pytest.importorskip("gem")
    from datasets import Dataset

    from trl_ext.agents.public_environments import environment_factory, game_rows, game_seeds
    from trl_ext.ppo import PPOConfig, PPOTrainer
    from trl_ext.rollouts import StepEnvironment
    from trl_ext.runs.play import play_with_model, rates
    from trl_ext.runs.random_players import warm_start_rows
    from trl_ext.stages.sft import supervised_finetune
    from trl_ext.tasks.toy_game import game_model, game_tokenizer

    tokenizer = game_tokenizer()
    model, _ = supervised_finetune(
        game_model(tokenizer, seed),
        tokenizer,
        Dataset.from_list(warm_start_rows(GAME, 64, seed)),
        output_dir=str(tmp_path / "sft"),
        steps=50,
        batch_size=16,
        learning_rate=6e-3,
        seed=seed,
    )
    factory, test = environment_factory(GAME), game_seeds(TEST_GAMES, seed, "test")

    def held_out(policy) -> dict:
        played = play_with_model(
            policy, tokenizer, factory, test, response_length=120, temperature=1.0, seed=seed, max_turn_tokens=4
        )
        return rates(played)

    before = held_out(model)
    assert before["mean_turns"] > 3.0  # the warm start speaks the format: a format error ends the game on its turn
    config = PPOConfig(
        batch_size=GAMES,
        total_episodes=GAMES * UPDATES,
        response_length=120,
        learning_rate=3e-4,
        num_ppo_epochs=2,
        sampler="loop",
        temperature=1.0,
        seed=seed,
        advantage_estimator="gae",
        lr_scheduler_type="constant",
        kl_coef=0.0,
        max_grad_norm=1.0,
        value_head_init="zero",
    )
    trainer = PPOTrainer(
        model,
        args=config,
        train_dataset=Dataset.from_dict(game_rows(GAMES * UPDATES, seed)),
        processing_class=tokenizer,
        rollout=StepEnvironment(factory, max_turn_tokens=4),
    )
    trainer.train()
    after = held_out(trainer.policy)
    assert after["mean_return"] > before["mean_return"] + 0.03, (before, after)
