"""One real-LLM RLHF run (``trl-ext rlhf``): its options, optional SFT on prompt/completion data, an optional reward
model from preference pairs (``trl_ext.stages``), then PPO with LoRA on a causal LM policy, rewarded by a scalar reward
model such as a DeBERTa reward model scored on (prompt, response) pairs, on either backend.

The policy and the value head share one LoRA-adapted backbone (one large model, LoRA layers, different heads); the
reference policy is the base model without the adapter.
"""

from __future__ import annotations

import json
from dataclasses import asdict, replace
from pathlib import Path

from trl_ext.data.prompt_files import PromptFile, check_encodable, describe, read_prompt_file, uses_chat_template
from trl_ext.errors import InputError
from trl_ext.runs.agents import load_agent
from trl_ext.runs.environment_eval import EnvironmentEval
from trl_ext.runs.environment_run import environment_evaluation, environment_prompts, warm_start_data
from trl_ext.runs.rlhf_options import LoRAOptions, PromptOptions, RLHFModels, RLHFOptions, RLHFStages
from trl_ext.runs.run import train_options
from trl_ext.runs.task_eval import TaskEval
from trl_ext.settings.fields import options_dict
from trl_ext.stages.reward_model import reward_model_stage
from trl_ext.stages.sft import sft_stage


def _is_conversational(path: str) -> bool | None:
    """Whether a stage's data file holds conversations (None: no file to look at; the stage says why)."""
    from trl_ext.data.jsonl import read_jsonl

    if not Path(path).is_file():
        return None
    row = read_jsonl(path, "data")[0][1]
    return any(isinstance(row.get(k), list) for k in ("prompt", "completion", "messages", "chosen", "rejected"))


def task_settings(data: PromptOptions) -> dict:
    """``--task-configs`` (JSON, checked here) and ``--answer-format``, as ``reasoning_gym_dataset`` takes them."""
    configs = None
    if data.task_configs is not None:
        try:
            configs = json.loads(data.task_configs)
        except json.JSONDecodeError as err:
            raise InputError(f"--task-configs is not JSON ({err.msg} at character {err.pos})") from None
        if not isinstance(configs, dict):
            raise InputError(f"--task-configs: expected a JSON object of task -> settings, got {data.task_configs!r}")
    return {"task_configs": configs, "answer_format": data.answer_format}


def task_prompts(data: PromptOptions, seed: int) -> PromptFile:
    """``--task``'s train stream of ``seed`` as a prompt file: conversations, and the columns its reward reads. With
    ``--task-eval-size``, the stream asks none of the test prompts' questions (``train_excluding``)."""
    from trl_ext.data.reasoning_gym import reasoning_gym_dataset
    from trl_ext.data.reasoning_gym_splits import train_excluding
    from trl_ext.runs.task_eval import held_out_rows

    settings = task_settings(data)
    if data.task_eval_size:
        held = held_out_rows(data.task, data.task_eval_size, seed, **settings)
        dataset = train_excluding(data.task, data.task_size, held, seed=seed, **settings)
    else:
        dataset = reasoning_gym_dataset(data.task, data.task_size, seed=seed, **settings)
    columns = {name: dataset[name] for name in dataset.column_names if name != "prompt"}
    return PromptFile(data.task, list(range(1, len(dataset) + 1)), dataset["prompt"], columns, "conversational")


def load_prompts(
    data: PromptOptions, stages: RLHFStages, policy: str, seed: int = 0, tool_template: str | None = None
) -> tuple[PromptFile, list[str]]:
    """The prompt file (or ``--task``'s prompts, of ``seed``), checked against the policy's tokenizer (given
    ``tool_template`` as PPO will give it) before any stage trains, and the lines saying how it will be used (the
    tokens are made later, with the tokenizer PPO runs with)."""
    from trl_ext.models.directory import load_tokenizer, read_model_config

    prompts = task_prompts(data, seed) if data.task else read_prompt_file(data.prompts)
    read_model_config(policy, "policy")
    tokenizer = load_tokenizer(policy, "policy")
    if tool_template:
        from trl_ext.agents.templates import with_tool_template

        with_tool_template(tokenizer, tool_template)
    templated = uses_chat_template(prompts, tokenizer, data.chat_template)
    check_encodable(prompts, tokenizer, templated)
    lines = [describe(prompts, templated, data.chat_template)]
    # An SFT model or reward model trained on raw text, then prompted through the template (or the other way
    # round), is off its training format: legal, and TRL would not say so, but rarely meant.
    differ = [
        f"{flag} {path}"
        for flag, path in (("--sft-data", stages.sft_data), ("--preferences", stages.preferences))
        if path and _is_conversational(path) not in (None, templated)
    ]
    if differ:
        lines.append(
            f"[prompts] note: {' and '.join(differ)} hold {'text' if templated else 'conversations'} while the "
            f"PPO prompts {'go through' if templated else 'skip'} the chat template: those stages learn a "
            "format PPO does not use (docs/chat-prompts.md)"
        )
    return prompts, lines


SCALAR_REWARD = "the RLHF recipe expects a scalar reward model (num_labels=1)"


def check_inputs(opts: RLHFOptions) -> None:
    """Every model folder and data file a run reads, checked before --out is created, so that a refused run
    writes nothing: the one loader's folder checks (tokenizers included), the LoRA targets against the policy's
    modules (its config built on the meta device), the user's reward function, the SFT and preference rows."""
    from trl_ext.models.loading import check_lora_targets, check_model_dir

    models, stages = opts.models, opts.stages
    tokenizer = check_model_dir(models.policy, "policy")
    check_lora_targets(models.policy, lora_config(opts.lora).target_modules)
    if models.reward:
        check_model_dir(models.reward, "reward model", labels=1, why=SCALAR_REWARD)
    if models.reward_fn:  # imported and its signature read now, not after the stages trained
        from trl_ext.rewards.base import import_reward_function

        import_reward_function(models.reward_fn)
    if stages.sft_data:
        from trl_ext.data.jsonl import as_dataset, read_jsonl
        from trl_ext.stages.sft import check_sft_format, check_sft_rows

        check_sft_format(check_sft_rows(as_dataset(read_jsonl(stages.sft_data, "SFT data"))), tokenizer)
    if stages.warm_start_games:  # its rows are conversations; the game must have a random player
        from trl_ext.runs.random_players import random_player
        from trl_ext.stages.sft import check_sft_format

        random_player(str(opts.agents.environment))
        check_sft_format(True, tokenizer)
    if stages.preferences:
        from trl_ext.stages.preferences import preference_split

        check_model_dir(stages.reward_base or models.policy, "reward model base")  # the SFT model has --policy's kind
        preference_split(stages.preferences, stages.reward_eval_n)


def load_models(models: RLHFModels, dtype: str = "auto"):
    from trl_ext.models.loading import load_policy
    from trl_ext.rewards.loading import load_reward_dir, reward_of

    policy, tokenizer = load_policy(models.policy, dtype)

    def reward_model(path: str):
        return load_reward_dir(
            path, dtype=dtype, labels=1, why=SCALAR_REWARD, pair=models.pair, max_length=models.reward_max_length
        )

    if not models.has_reward:  # an environment's get_reward alone scores the rollouts
        return policy, tokenizer, None
    return policy, tokenizer, reward_of(models.reward, models.reward_fn, models.reward_url, reward_model)


def lora_config(lora: LoRAOptions):
    from peft import LoraConfig

    targets = lora.lora_target_modules
    targets = targets if targets == "all-linear" else [t.strip() for t in targets.split(",") if t.strip()]
    return LoraConfig(
        task_type="CAUSAL_LM",
        r=lora.lora_r,
        lora_alpha=lora.lora_alpha,
        lora_dropout=lora.lora_dropout,
        target_modules=targets,
    )


STAGE_FOLDERS = ("sft", "reward_model", "warm_start")


def sft_data(opts: RLHFOptions, out: Path) -> str | None:
    """What the SFT stage trains on: ``--sft-data``, or the warm start's games."""
    return str(out / "warm_start" / "games.jsonl") if opts.stages.warm_start_games else opts.stages.sft_data


def run_stages(opts: RLHFOptions, out: Path, say) -> None:
    """SFT on ``--sft-data`` (or the warm start's games) into ``out/sft``, then a reward model on ``--preferences``
    into ``out/reward_model`` (from ``--reward-base``, or the policy PPO starts from); each reused while nothing it
    ran with changed."""
    stages, policy = opts.stages, opts.models.policy
    data = warm_start_data(opts, out, say) if stages.warm_start_games else stages.sft_data
    if data:
        policy = sft_stage(
            policy,
            data,
            out / "sft",
            steps=stages.sft_steps,
            learning_rate=stages.sft_learning_rate,
            batch_size=stages.stage_batch_size,
            seed=opts.train.seed,
            peft_config=lora_config(opts.lora),
            record={"lora": asdict(opts.lora)},
            say=say,
        )
    if stages.preferences:
        reward_model_stage(
            stages.reward_base or policy,
            stages.preferences,
            out / "reward_model",
            steps=stages.reward_steps,
            batch_size=stages.stage_batch_size,
            learning_rate=stages.reward_learning_rate,
            seed=opts.train.seed,
            eval_n=stages.reward_eval_n,
            say=say,
        )


def run_rlhf(opts: RLHFOptions, print_fn=print) -> dict:
    """The stages, then PPO (``trl_ext.runs.run.run_training``); returns the summary (also ``summary.json``)."""
    from trl_ext.data.prompt_files import prepare_prompts
    from trl_ext.models.fetch import model_folder
    from trl_ext.models.loading import truncation_notice
    from trl_ext.runs.run import RunSpec, run_training
    from trl_ext.runs.runners import RunInputs

    backend, models = opts.run.backend, opts.models
    if opts.agents.multi_turn and backend != "scratch":
        raise InputError("--tools and --environment need --backend scratch (TRL's PPO has no multi-turn rollouts)")
    if not (models.has_reward or opts.stages.preferences or opts.agents.environment or opts.data.task):
        raise InputError(
            "give --reward (a reward model directory), --reward-fn (module:callable), --reward-url, "
            "--preferences (a preference file to train the reward model on first), --environment "
            "(one whose get_reward scores a rollout) or --task (its verifier scores)"
        )
    if models.reward and opts.stages.preferences:
        raise InputError(
            "give --reward or --preferences, not both: --preferences trains the reward model "
            "(its base is --reward-base)"
        )
    if backend == "scratch":  # a group estimator with one completion a prompt: refused before any stage trains
        from trl_ext.ppo.config_checks import check_groups

        check_groups(opts.train)
    if opts.train.separate_critic:
        raise InputError(
            "the RLHF recipe shares the LoRA backbone between policy and value head; "
            "separate_critic is not supported here"
        )
    # summary.json records the options as given (catalogue:NAME, not this machine's cache folder)
    record = options_dict(opts)
    opts = replace(opts, models=replace(models, policy=model_folder(models.policy, "policy")))
    models = opts.models
    out = Path(opts.output.out)
    spec = RunSpec(
        backend,
        backend,
        train_options(opts),
        record,
        opts.sources,
        overwrite=opts.output.overwrite,
        owned=STAGE_FOLDERS,
    )
    task_eval: TaskEval | None = None  # --task-eval-size's, on the main process only
    environment_eval: EnvironmentEval | None = None  # --environment-eval-games', on the main process only

    def load(run) -> RunInputs:
        nonlocal task_eval, environment_eval
        if opts.data.task_eval_size and run.state.num_processes > 1:  # the others would wait in prepare, or hang
            raise InputError("--task-eval-size scores on the main process only: use it with one process")
        if opts.agents.environment_eval_games and run.state.num_processes > 1:
            raise InputError("--environment-eval-games plays on the main process only: use it with one process")
        if models.reward_url:  # an unreachable server: one line before any stage trains
            from trl_ext.rewards.loading import connect_reward

            connect_reward(models.reward_url)
        check_inputs(opts)  # every folder and file, before --out is created: a refused run writes nothing
        if opts.agents.public_environment:  # the games make the prompts
            prompt_file, prompt_lines = environment_prompts(opts.agents, opts.train.seed)
        else:
            prompt_file, prompt_lines = load_prompts(
                opts.data, opts.stages, models.policy, opts.train.seed, opts.agents.tool_template
            )
        # tools, environment and chat template checked here too; --policy's tokenizer is the SFT model's
        agent = load_agent(opts.agents, models.policy) if opts.agents.multi_turn else None
        for line in prompt_lines if run.is_main else ():
            print_fn(line)
        # The stages run once, on the main process; the others wait and read what it wrote.
        run.open_out(on_main=lambda: run_stages(opts, out, print_fn))
        policy_dir = str(out / "sft") if sft_data(opts, out) else models.policy
        reward_dir = str(out / "reward_model") if opts.stages.preferences else models.reward
        trained_here = replace(
            models, policy=policy_dir, reward=reward_dir, pair=models.pair and not opts.stages.preferences
        )
        policy, tokenizer, reward_fn = load_models(trained_here, opts.train.dtype)
        if opts.data.task:  # the task's verifier, summed with the other rewards given
            from trl_ext.rewards.loading import summed
            from trl_ext.rewards.reasoning_gym import ReasoningGymReward

            reward_fn = summed([r for r in (reward_fn, ReasoningGymReward()) if r is not None])
        if opts.agents.tool_template:  # chosen by the user, never silently (docs/multi-turn.md)
            from trl_ext.agents.templates import with_tool_template

            with_tool_template(tokenizer, opts.agents.tool_template)
        # 'prompt' as reward functions get it (a conversation when templated), 'input_ids' as the policy gets it
        prepared = prepare_prompts(prompt_file, tokenizer, opts.data.chat_template, opts.data.max_prompt_length)
        dataset = prepared.dataset  # prepared.truncation: how many prompts were cut, and by up to how many tokens
        notice = truncation_notice(prepared.truncation, opts.data.max_prompt_length)  # said once, before training
        if notice and run.is_main:
            print_fn(notice)
        if opts.data.task_eval_size and run.is_main:  # the policy as loaded: the trainer has not added LoRA yet
            task_eval = TaskEval.of_task(
                opts.data.task,
                opts.data.task_eval_size,
                opts.train.seed,
                opts.train.response_length,
                opts.data.max_prompt_length,
                **task_settings(opts.data),
            )
            task_eval.check_train({"prompt": prompt_file.prompts}, task_settings(opts.data)["task_configs"])
            policy.to(run.state.device)  # where it trains and is scored after: both phases on one device
            task_eval.score("before", policy, tokenizer)
            print_fn(task_eval.line("before"))
        if opts.agents.environment_eval_games and run.is_main:  # the policy as loaded (the warm start's), no LoRA
            environment_eval = environment_evaluation(opts, agent["rollout"])
            policy.to(run.state.device)
            environment_eval.play_random()
            environment_eval.play("before", policy, tokenizer)
            print_fn(environment_eval.line("before"))
        # The reference is the policy with its LoRA adapters disabled: no second copy of the base model.
        return RunInputs(
            spec.config,
            policy,
            tokenizer,
            reward_fn,
            peft_config=lora_config(opts.lora),
            prompts=lambda n: dataset.select([i % len(dataset) for i in range(n)]),  # cycled to n
            agent=agent,
        )

    def summarize(inputs, runner, recorder) -> dict:
        history = recorder.history
        fields = {
            "first_score": history.first.get("objective/scores"),
            "last_score": history.last.get("objective/scores"),
        }
        if opts.agents.public_environment:  # the games it trained on; test games are seeded from 2**31 on
            from trl_ext.agents.public_environments import TEST_SEED_OFFSET

            seed = opts.train.seed
            fields["games"] = {
                "environment": opts.agents.environment,
                "train_seeds": [seed, seed + opts.agents.environment_games - 1],
                "test_seeds_from": seed + TEST_SEED_OFFSET,
                "first_return": history.first.get("env/return"),
                "last_return": history.last.get("env/return"),
            }
        if environment_eval is not None:
            environment_eval.play("after", runner.policy, inputs.tokenizer)  # its adapter on
            print_fn(environment_eval.line("after"))
            environment_eval.write(out)
            fields["games"]["test"] = environment_eval.record()
        if task_eval is not None:
            task_eval.score("after", runner.policy, inputs.tokenizer)  # its adapter on
            print_fn(task_eval.line("after"))
            task_eval.write(out)
        if opts.data.task_eval_size:  # None on the other processes
            scores = task_eval.scores if task_eval is not None else {}
            fields.update(test_before=scores.get("before"), test_after=scores.get("after"))
            if task_eval is not None:  # what the train stream shares with the test prompts: nothing
                fields.update(test_overlap=task_eval.test_overlap, distinct_questions=task_eval.distinct_questions)
        return fields

    summary = run_training(spec, load, summarize, print_fn)
    tested = (
        f"; test score {summary['test_before']} -> {summary['test_after']} (task_eval.json)"
        if opts.data.task_eval_size
        else ""
    )
    test_games = (summary.get("games") or {}).get("test")
    if test_games:
        before, after = test_games["before"]["sampled"], test_games["after"]["sampled"]
        tested += f"; test win rate (sampled) {before['win_rate']} -> {after['win_rate']} (environment_eval.json)"
    summary["summary"] = (
        f"rlhf[{backend}]: {summary['updates']} updates, reward score "
        f"{summary['first_score']} -> {summary['last_score']}{tested}; LoRA adapter in {out}"
    )
    return summary
