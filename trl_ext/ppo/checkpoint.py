"""Checkpoints of the scratch trainer: all a killed run needs to go on as if it never stopped.

A checkpoint is ``OUTPUT_DIR/checkpoint-<update>/`` holding the trainable weights (the whole policy,
or only its LoRA adapter, plus the value head and a separate critic or the critic's LoRA adapter), the
optimizer and scheduler states, every rank's random generators, and ``trainer_state.json`` with the counters (the data
position is the update count: prompts are read in order) and a fingerprint of the run. The state
file is written last: a directory without it was cut off while saving and is never resumed from.
Tensors are stored with safetensors, optimizer/scheduler states with ``torch.save`` and read back
with ``weights_only=True``.
"""

from __future__ import annotations

import json
import re
import shutil
import warnings
from pathlib import Path

import torch

from trl_ext.errors import InputError

PREFIX = "checkpoint-"
STATE_FILE = "trainer_state.json"
WEIGHTS_FILE = "trainable.safetensors"


class CheckpointError(InputError):
    """A checkpoint that is missing, incomplete, or from another model or incompatible options."""


def _update_of(path: Path) -> int | None:
    match = re.fullmatch(re.escape(PREFIX) + r"(\d+)", path.name)
    return int(match.group(1)) if match else None


def checkpoints(output_dir: str | Path) -> list[Path]:
    """Complete checkpoints in ``output_dir``, oldest first; incomplete ones are skipped with a warning."""
    root = Path(output_dir)
    found = sorted((p for p in root.glob(PREFIX + "*") if p.is_dir() and _update_of(p) is not None), key=_update_of)
    complete = []
    for path in found:
        if (path / STATE_FILE).exists():
            complete.append(path)
        else:
            warnings.warn(
                f"skipping {path}: it has no {STATE_FILE} (the run was stopped while saving it)", stacklevel=2
            )
    return complete


def resolve(spec: str, output_dir: str | Path | None) -> Path:
    """``latest`` (the newest complete checkpoint in ``output_dir``) or a checkpoint directory."""
    if spec == "latest":
        if output_dir is None:
            raise CheckpointError("resume_from_checkpoint='latest' needs an output_dir to look in")
        complete = checkpoints(output_dir)
        if not complete:
            raise CheckpointError(f"resume_from_checkpoint='latest': no complete checkpoint in {str(output_dir)!r}")
        return complete[-1]
    path = Path(spec)
    if not path.is_dir():
        raise CheckpointError(f"resume_from_checkpoint {spec!r} does not exist")
    if not (path / STATE_FILE).exists():
        raise CheckpointError(f"resume_from_checkpoint {spec!r} holds no {STATE_FILE}: not a complete checkpoint")
    return path


def read_state(path: str | Path) -> dict:
    """The trainer state of the checkpoint at ``path`` (counters, fingerprint): the one reader of ``STATE_FILE``."""
    file = Path(path) / STATE_FILE
    if not file.exists():
        raise CheckpointError(f"checkpoint {str(path)!r} holds no {STATE_FILE}: not a complete checkpoint")
    return json.loads(file.read_text())


def fingerprint(model: torch.nn.Module, config, num_processes: int) -> dict:
    """What must match for a checkpoint to fit this run: trainable shapes and the batch layout."""
    return {
        "backend": "scratch",
        "trainable": {n: list(p.shape) for n, p in model.named_parameters() if p.requires_grad},
        "batch_size": config.batch_size,
        "num_mini_batches": config.num_mini_batches,
        "num_processes": num_processes,
        "total_episodes": config.total_episodes,
    }


def check_fits(saved: dict, current: dict, path: Path) -> None:
    """Raise naming the first thing the checkpoint at ``path`` and this run disagree on."""
    for key in current:
        if key == "trainable":
            continue
        if saved.get(key) != current[key]:
            raise CheckpointError(
                f"checkpoint {str(path)!r} was written with {key}={saved.get(key)!r}; "
                f"this run has {key}={current[key]!r}"
            )
    saved_shapes, shapes = saved.get("trainable", {}), current["trainable"]
    missing = sorted(set(shapes) - set(saved_shapes))
    extra = sorted(set(saved_shapes) - set(shapes))
    if missing or extra:
        raise CheckpointError(
            f"checkpoint {str(path)!r} is of another model: "
            f"{'it lacks ' + missing[0] if missing else 'it has ' + extra[0]} "
            f"({len(missing)} missing, {len(extra)} extra trainable tensors)"
        )
    for name, shape in shapes.items():
        if saved_shapes[name] != shape:
            raise CheckpointError(
                f"checkpoint {str(path)!r} is of another model: {name} has shape "
                f"{saved_shapes[name]}, this model's is {shape}"
            )


def rng_state(generator: torch.Generator) -> dict[str, torch.Tensor]:
    state = {"torch": torch.get_rng_state(), "sampler": generator.get_state()}
    if torch.cuda.is_available():
        state.update({f"cuda{i}": s for i, s in enumerate(torch.cuda.get_rng_state_all())})
    return state


def set_rng_state(state: dict[str, torch.Tensor], generator: torch.Generator) -> None:
    torch.set_rng_state(state["torch"])
    generator.set_state(state["sampler"])
    cuda = [state[k] for k in sorted(k for k in state if k.startswith("cuda"))]
    if cuda and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(cuda)


def save(path: Path, *, model, optimizer, scheduler, generator, state: dict, is_main: bool, rank: int, barrier) -> Path:
    """Write one checkpoint; every rank calls it (each writes its own generators)."""
    from safetensors.torch import save_file

    path.mkdir(parents=True, exist_ok=True)
    save_file(
        {f"rank{rank}/{k}": v.contiguous() for k, v in rng_state(generator).items()},
        str(path / f"rng-rank{rank}.safetensors"),
    )
    if is_main:
        trainable = {n: p.detach().cpu().contiguous() for n, p in model.named_parameters() if p.requires_grad}
        save_file(trainable, str(path / WEIGHTS_FILE))
        torch.save(optimizer.state_dict(), path / "optimizer.pt")
        torch.save(scheduler.state_dict(), path / "scheduler.pt")
    barrier()
    if is_main:  # last: its presence says the checkpoint is complete
        (path / STATE_FILE).write_text(json.dumps(state, indent=2) + "\n")
    barrier()
    return path


def load(path: Path, *, model, optimizer, scheduler, generator, rank: int) -> dict:
    """Read a checkpoint into the live objects; returns its trainer state (counters, fingerprint)."""
    from safetensors.torch import load_file

    state = read_state(path)
    weights = load_file(str(path / WEIGHTS_FILE))
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, value in weights.items():
            params[name].copy_(value.to(params[name].device))
    device = next(model.parameters()).device
    optimizer.load_state_dict(torch.load(path / "optimizer.pt", map_location=device, weights_only=True))
    scheduler.load_state_dict(torch.load(path / "scheduler.pt", weights_only=True))
    rng_file = path / f"rng-rank{rank}.safetensors"
    if not rng_file.exists():
        raise CheckpointError(f"checkpoint {str(path)!r} has no random state for rank {rank}")
    rng = {k.split("/", 1)[1]: v for k, v in load_file(str(rng_file)).items()}
    set_rng_state(rng, generator)
    return state


def rotate(output_dir: str | Path, keep: int) -> list[Path]:
    """Delete the oldest complete checkpoints beyond ``keep`` (only trl-ext's ``checkpoint-N``)."""
    complete = checkpoints(output_dir)
    doomed = complete[:-keep] if keep > 0 else []
    for path in doomed:
        shutil.rmtree(path)
    return doomed


def save_run(
    output_dir: str | Path, counters: dict, *, config, world_size: int, parts: dict, is_main: bool, barrier
) -> Path:
    """``output_dir/checkpoint-<update>`` for a run whose ``counters`` are ``update``, ``episode``, ``kl_coef`` (the
    KL weight in force: an adaptive one's current value) and ``warmup_value_losses`` (what the critic warm-up's
    stopping rule reads), the oldest beyond ``config.save_total_limit`` deleted. ``parts``: ``save``'s model,
    optimizer, scheduler, generator, rank."""
    update = counters["update"]
    state = {**counters, "fingerprint": fingerprint(parts["model"], config, world_size)}
    path = save(Path(output_dir) / f"{PREFIX}{update}", **parts, state=state, is_main=is_main, barrier=barrier)
    if config.save_total_limit and is_main:
        rotate(output_dir, config.save_total_limit)
    barrier()
    return path


def load_run(path: Path, *, config, world_size: int, parts: dict) -> dict:
    """Read a checkpoint that fits this run into ``parts``; returns the counters ``save_run`` wrote (``kl_coef``: the
    config's, and no ``warmup_value_losses``, for a checkpoint written before they were saved)."""
    check_fits(read_state(path)["fingerprint"], fingerprint(parts["model"], config, world_size), path)
    state = load(path, **parts)
    return {"kl_coef": config.kl_coef, "warmup_value_losses": [], **state}
