"""Trainer integrations: token expansion, row alignment, and agreement with verl's and TRL's
own advantage code where those packages are installed (a skipped test names the package)."""

from __future__ import annotations

import importlib
import types

import numpy as np
import pytest

import masreplay
from masreplay import InvalidArgumentError
from masreplay.integrations import align_rows
from masreplay.integrations.torch import expand_to_tokens


def _need(module: str, package: str):
    try:
        return importlib.import_module(module)
    except ImportError as error:
        pytest.skip(f"{package} is not installed ({error}); pip install {package} to compare against it")


def _random_rows(seed: int, n_groups: int = 40):
    rng = np.random.default_rng(seed)
    sizes = rng.choice([1, 2, 3, 5, 8], size=n_groups)
    uids = np.repeat([f"uid-{i}" for i in range(n_groups)], sizes)
    scores = rng.normal(size=len(uids)).astype(np.float32)
    scores[np.repeat(np.arange(n_groups) % 7 == 0, sizes)] = 1.0  # all-equal groups
    order = rng.permutation(len(uids))  # verl groups by uid value, not position
    return scores[order], uids[order]


# ---- without optional packages -------------------------------------------------------------------


def test_expand_to_tokens_numpy():
    mask = np.array([[1, 1, 0, 0], [0, 1, 1, 1]])
    out = expand_to_tokens(np.array([0.5, -2.0], dtype=np.float32), mask)
    np.testing.assert_array_equal(out, [[0.5, 0.5, 0, 0], [0, -2, -2, -2]])
    assert out.dtype == np.float32
    with pytest.raises(InvalidArgumentError, match="rows"):
        expand_to_tokens(np.zeros(3), mask)


def test_align_rows_by_trace_and_event():
    batch = masreplay.sim.generate(8, seed=1)
    result = masreplay.advantages(batch, normalize_by="agent", unit="events", dtype="float64")
    ids = batch.trace_ids
    np.testing.assert_array_equal(align_rows(result, [ids[3], ids[0]], batch=batch), result.per_trace[[3, 0]])
    events = batch.events()
    first_of_2 = int(batch.event_offsets[2])
    event_id = events["id"][first_of_2 + 1].as_py()
    rows = align_rows(result, [ids[2], ids[5]], [event_id, None], batch=batch)
    np.testing.assert_array_equal(rows, [result.per_event[first_of_2 + 1], result.per_trace[5]])
    with pytest.raises(InvalidArgumentError, match="not in the batch"):
        align_rows(result, ["nope"], batch=batch)
    with pytest.raises(InvalidArgumentError, match="no event"):
        align_rows(result, [ids[0]], ["nope"], batch=batch)


def test_optional_modules_name_their_package():
    from masreplay.integrations import trl as trl_integration

    try:
        import trl  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match="'trl'"):
            trl_integration.MasreplayGRPOTrainer  # noqa: B018
    else:
        assert trl_integration.MasreplayGRPOTrainer.__name__ == "MasreplayGRPOTrainer"


# ---- torch -------------------------------------------------------------------------------------


def test_expand_to_tokens_torch():
    torch = _need("torch", "torch")
    mask = torch.tensor([[1, 0, 1], [1, 1, 0]], dtype=torch.bool)
    out = expand_to_tokens(torch.tensor([2.0, -1.0]), mask)
    assert out.dtype == torch.float32 and out.shape == (2, 3)
    assert out.tolist() == [[2.0, 0.0, 2.0], [-1.0, -1.0, 0.0]]


# ---- verl ----------------------------------------------------------------------------------------


def _verl_inputs(torch, scores, uids, length=6, seed=0):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, length + 1, size=len(scores))
    mask = torch.tensor(np.arange(length)[None, :] < lengths[:, None], dtype=torch.float32)
    rewards = torch.zeros(len(scores), length)
    rewards[torch.arange(len(scores)), torch.tensor(lengths - 1)] = torch.from_numpy(scores)
    return rewards, mask


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("norm_by_std", [True, False])
def test_verl_grpo_bit_for_bit(seed, norm_by_std):
    torch = _need("torch", "torch")
    core_algos = _need("verl.trainer.ppo.core_algos", "verl")
    scores, uids = _random_rows(seed)
    rewards, mask = _verl_inputs(torch, scores, uids, seed=seed)
    theirs, _ = core_algos.compute_grpo_outcome_advantage(rewards, mask, uids, norm_adv_by_std_in_grpo=norm_by_std)
    ours = masreplay.group_normalize(scores, uids, compat="verl", std=norm_by_std)
    assert torch.equal(theirs, torch.from_numpy(ours).unsqueeze(-1) * mask)
    from masreplay.integrations import verl as verl_integration

    names = verl_integration.register()
    plugged = core_algos.get_adv_estimator_fn("masreplay_grpo")
    config = {"norm_adv_by_std_in_grpo": norm_by_std}
    via_registry, _ = plugged(token_level_rewards=rewards, response_mask=mask, index=uids, config=config)
    assert torch.equal(via_registry, theirs) and "masreplay_rloo" in names


@pytest.mark.parametrize("seed", [0, 1])
def test_verl_rloo_opo_and_reinforce_pp_baseline(seed):
    torch = _need("torch", "torch")
    core_algos = _need("verl.trainer.ppo.core_algos", "verl")
    scores, uids = _random_rows(seed)
    rewards, mask = _verl_inputs(torch, scores, uids, seed=seed)
    lengths = mask.sum(-1).double().numpy()
    theirs, _ = core_algos.compute_rloo_outcome_advantage(rewards, mask, uids)
    ours = masreplay.group_normalize(scores, uids, estimator="rloo", compat="verl")
    assert torch.equal(theirs, torch.from_numpy(ours).unsqueeze(-1) * mask)
    theirs, _ = core_algos.compute_opo_outcome_advantage(rewards, mask, uids)
    ours = masreplay.group_normalize(scores, uids, lengths=lengths, estimator="opo", compat="verl")
    torch.testing.assert_close(theirs, torch.from_numpy(ours).unsqueeze(-1) * mask, rtol=2e-7, atol=2e-7)
    theirs, _ = core_algos.compute_reinforce_plus_plus_baseline_outcome_advantage(rewards, mask, uids)
    ours = masreplay.group_normalize(scores, uids, lengths=lengths, estimator="reinforce_pp_baseline", compat="verl")
    # verl whitens token by token in fp32 sums; the same statistics, summed in another order.
    torch.testing.assert_close(theirs, torch.from_numpy(ours).unsqueeze(-1) * mask, rtol=1e-5, atol=1e-5)


def test_verl_compute_advantage_over_traces():
    torch = _need("torch", "torch")
    from masreplay.integrations import verl as verl_integration

    batch = masreplay.sim.generate(16, agents=(2, 4), group_size=4, seed=5)
    events = batch.events()
    picks = [int(batch.event_offsets[i]) + 1 for i in range(16)]  # one agent step per trace
    trace_ids = np.array([events["trace_id"][k].as_py() for k in picks], dtype=object)
    event_ids = np.array([events["id"][k].as_py() for k in picks], dtype=object)
    mask = torch.ones(16, 5)
    mask[:, 3:] = 0
    data = types.SimpleNamespace(batch={"response_mask": mask}, non_tensor_batch={"trace_id": trace_ids, "event_id": event_ids})
    verl_integration.compute_advantage(data, batch, normalize_by="agent", unit="events")
    expected = masreplay.advantages(batch, normalize_by="agent", unit="events").per_event[picks]
    assert torch.equal(data.batch["advantages"][:, 0], torch.from_numpy(expected))
    assert torch.count_nonzero(data.batch["advantages"][:, 3:]) == 0
    metrics: dict = {}
    mixin = verl_integration.trace_advantage_mixin(lambda _: batch, normalize_by="agent", unit="events")
    mixin()._compute_advantage(data, metrics)
    assert "masreplay/advantages_mean" in metrics


# ---- TRL -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_trl_group_normalisation_bit_for_bit(scale, seed):
    torch = _need("torch", "torch")
    utils = _need("trl.trainer.utils", "trl")
    num_generations = 8
    rng = np.random.default_rng(seed)
    rewards = torch.from_numpy(rng.normal(size=16 * num_generations).astype(np.float32))
    rewards[::13] = torch.nan  # unscorable rows
    rewards[:num_generations] = 0.5  # an all-equal group
    # TRL's GRPOTrainer lines (sum_then_normalize), with TRL's own nanstd:
    mean = torch.nanmean(rewards.view(-1, num_generations), dim=1).repeat_interleave(num_generations, dim=0)
    if scale == "batch":
        std = utils.nanstd(rewards).expand_as(rewards)
    else:
        std = utils.nanstd(rewards.view(-1, num_generations), dim=1).repeat_interleave(num_generations, dim=0)
    theirs = rewards - mean
    if scale != "none":
        theirs = theirs / (std + 1e-4)
    theirs = torch.nan_to_num(theirs, nan=0.0)
    groups = np.repeat(np.arange(16), num_generations)
    ours = masreplay.group_normalize(rewards.numpy(), groups, compat="trl", std=scale)
    if scale == "none":
        assert torch.equal(torch.from_numpy(ours), theirs)
    else:
        # Everything up to TRL's torch.sqrt is bit for bit; torch's fp32 sqrt on the CPU (MKL's
        # vsSqrt in the pip builds) is not correctly rounded (1 ulp off for ~20% of inputs on
        # the test machine), masreplay's is: allow that last ulp, and nothing more.
        ulp = np.spacing(np.abs(theirs.numpy())).astype(np.float32)
        assert np.all(np.abs(ours - theirs.numpy()) <= 2 * ulp)


def test_trl_trainer_subclass():
    trl = _need("trl", "trl")
    from masreplay.integrations.trl import MasreplayGRPOTrainer

    assert issubclass(MasreplayGRPOTrainer, trl.GRPOTrainer)
    assert "_generate_and_score_completions" in MasreplayGRPOTrainer.__dict__


# ---- OpenRLHF (its formulas, computed with torch as OpenRLHF does) --------------------------------


def test_openrlhf_group_norm_and_rloo_with_torch():
    torch = _need("torch", "torch")
    rng = np.random.default_rng(4)
    rewards = torch.from_numpy(rng.normal(size=(12, 4)).astype(np.float32))
    groups = np.repeat(np.arange(12), 4)
    norm = (rewards - rewards.mean(-1, keepdim=True)) / (rewards.std(-1, keepdim=True) + 1e-9)
    ours = masreplay.group_normalize(rewards.flatten().numpy(), groups, compat="openrlhf")
    assert torch.equal(torch.from_numpy(ours), norm.flatten())
    baseline = (rewards.sum(-1, keepdim=True) - rewards) / (4 - 1)
    ours = masreplay.group_normalize(rewards.flatten().numpy(), groups, estimator="rloo", compat="openrlhf")
    assert torch.equal(torch.from_numpy(ours), (rewards - baseline).flatten())


def test_torch_loop_example_runs(capsys):
    _need("torch", "torch")
    import runpy
    from pathlib import Path

    example = Path(__file__).resolve().parents[1] / "examples" / "torch_loop.py"
    runpy.run_path(str(example), run_name="__main__")
    assert capsys.readouterr().out.count("loss") == 5
