"""verl plug-in.

Two ways in, as verl offers them:

1. **uid-only estimators** in verl's registry: ``masreplay_grpo``, ``masreplay_rloo``,
   ``masreplay_opo``, ``masreplay_reinforce_pp_baseline``. They see what every verl
   estimator sees (token rewards, response mask, uid) and compute with verl's own fp32
   arithmetic, so ``algorithm.adv_estimator=masreplay_grpo`` reproduces ``grpo`` exactly, in
   Rust. verl (0.9 on) loads them by itself: ``import verl`` loads every ``verl.plugins``
   entry point, and masreplay declares this module as one (pyproject.toml; turned off by
   ``VERL_USE_EXTERNAL_PLUGINS=none``). ``VERL_USE_EXTERNAL_MODULES=masreplay.integrations.verl``
   or :func:`register` do the same by hand.
2. **full traces**: :func:`compute_advantage` replaces the trainer's compute-advantage step
   (:func:`use_trace_advantages` installs it in ``RayPPOTrainer``).
   The agent loop carries ``trace_id`` (and, for rows that are one agent step, ``event_id``)
   in its extra fields, which verl puts in ``non_tensor_batch``; the step computes
   :func:`masreplay.advantages` over the traces (stratified by agent, role, depth, ...) and
   writes each row's advantage on its generated tokens. :func:`trace_advantage_mixin` makes
   a ``_compute_advantage(batch, metrics)`` override over a ``DataProto``. verl 0.9.1's v1
   trainer calls its ``_compute_advantage`` with a ``KVBatchMeta`` whose tensors live in
   TransferQueue, not a DataProto: the mixin refuses one by name; there, call
   :func:`compute_advantage` on the DataProto the trainer builds.

verl is optional: it is imported when this module is, and a missing verl is reported by name
when a function needs it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import numpy as np

from masreplay.advantages import advantages as trace_advantages
from masreplay.advantages import group_normalize
from masreplay.errors import InvalidArgumentError
from masreplay.integrations import align_rows
from masreplay.integrations.torch import expand_to_tokens
from masreplay.vocabulary import ESTIMATORS


def _config_flag(config: Any, name: str, default: Any) -> Any:
    if config is None:
        return default
    getter = getattr(config, "get", None)
    return getter(name, default) if getter is not None else getattr(config, name, default)


def _estimator(name: str) -> Callable[..., tuple[Any, Any]]:
    def estimate(token_level_rewards, response_mask, index=None, config=None, epsilon: float = 1e-6, **_: Any):
        import torch

        scores = token_level_rewards.sum(dim=-1).detach().to(torch.float32).cpu().numpy().astype(np.float64)
        groups = np.zeros(len(scores), dtype=np.int64) if index is None else np.asarray(index)
        std = bool(_config_flag(config, "norm_adv_by_std_in_grpo", True)) if name == "grpo" else True
        mask = response_mask.detach().to(torch.float32).cpu().numpy()
        per_row = group_normalize(
            scores,
            groups,
            lengths=mask.sum(axis=-1, dtype=np.float64),
            mask=mask,
            estimator=name,
            std=std,
            eps=epsilon,
            compat="verl",
            torch_threads=torch.get_num_threads(),  # ATen splits whole-tensor sums between them
        )
        token = expand_to_tokens(torch.from_numpy(per_row).to(response_mask.device), response_mask)
        return token, token

    estimate.__name__ = f"masreplay_{name}"
    estimate.__doc__ = f"masreplay's {name} with verl's fp32 arithmetic (uid groups), as a verl advantage estimator."
    return estimate


def _core_algos() -> Any:
    try:
        from verl.trainer.ppo import core_algos
    except ImportError as error:
        raise ImportError("masreplay.integrations.verl.register needs the 'verl' package (pip install verl)") from error
    return core_algos


def register() -> list[str]:
    """Registers the masreplay estimators in verl's registry; returns their names."""
    core_algos = _core_algos()
    names = []
    for name in ESTIMATORS:
        registered = f"masreplay_{name}"
        if registered not in core_algos.ADV_ESTIMATOR_REGISTRY:
            core_algos.register_adv_est(registered)(_estimator(name))
        names.append(registered)
    return names


def compute_advantage(data: Any, traces: Any, *, trace_key: str = "trace_id", event_key: str = "event_id", **options: Any) -> Any:
    """verl's compute-advantage step over whole traces: ``data`` is the DataProto of the
    step (``data.batch["response_mask"]``, ``data.non_tensor_batch[trace_key]`` and
    optionally ``[event_key]``), ``traces`` the TraceBatch of its rollouts, ``options`` the
    arguments of :func:`masreplay.advantages` (``normalize_by="agent"``, ``compat=...``).
    Sets ``advantages`` and ``returns`` (rows x tokens) and returns ``data``."""
    import torch

    result = trace_advantages(traces, **options)
    extra = data.non_tensor_batch
    event_ids = extra.get(event_key) if hasattr(extra, "get") else None
    per_row = align_rows(result, list(extra[trace_key]), None if event_ids is None else list(event_ids), batch=traces)
    mask = data.batch["response_mask"]
    token = expand_to_tokens(torch.from_numpy(np.ascontiguousarray(per_row)).to(mask.device), mask)
    data.batch["advantages"] = token
    data.batch["returns"] = token
    return data


def use_trace_advantages(traces_of: Callable[[Any], Any], **options: Any) -> Callable[[], None]:
    """Makes verl's PPO trainer (``verl.trainer.ppo.ray_trainer.RayPPOTrainer``, whose ``fit``
    calls that module's ``compute_advantage``) compute advantages over whole traces: each
    step's DataProto goes through :func:`compute_advantage` with the traces
    ``traces_of(data)`` returns (e.g. looked up in a GraphBuffer by the batch's trace ids)
    and ``options``. Returns a function that puts verl's step back."""
    from verl.trainer.ppo import ray_trainer

    verl_step = ray_trainer.compute_advantage

    def trace_step(data: Any, adv_estimator: Any = None, *_: Any, **__: Any) -> Any:
        # verl's estimator arguments (gamma, lam, num_repeat, ...) are replaced by `options`.
        return compute_advantage(data, traces_of(data), **options)

    ray_trainer.compute_advantage = trace_step

    def restore() -> None:
        ray_trainer.compute_advantage = verl_step

    return restore


def trace_advantage_mixin(traces_of: Callable[[Any], Any], **options: Any) -> type:
    """A mixin whose ``_compute_advantage(batch, metrics)`` calls :func:`compute_advantage`
    with the traces ``traces_of(batch)`` returns (e.g. looked up in a GraphBuffer by the
    batch's trace ids): ``class Trainer(trace_advantage_mixin(lookup, normalize_by="agent"),
    RayPPOTrainer): ...``."""

    class TraceAdvantages:
        def _compute_advantage(self, batch: Any, metrics: dict | None = None) -> Any:
            if not hasattr(batch, "non_tensor_batch"):
                raise InvalidArgumentError(
                    f"trace_advantage_mixin reads a DataProto, got {type(batch).__name__} (verl's v1 trainer "
                    "keeps its tensors in TransferQueue: call compute_advantage on a DataProto there)"
                )
            batch = compute_advantage(batch, traces_of(batch), **options)
            if metrics is not None:
                advantages = batch.batch["advantages"]
                mask = batch.batch["response_mask"].bool()
                metrics["masreplay/advantages_mean"] = float(advantages[mask].mean()) if mask.any() else 0.0
            return batch

    return TraceAdvantages


with contextlib.suppress(ImportError):  # VERL_USE_EXTERNAL_MODULES imports this module: register where verl is installed.
    register()
