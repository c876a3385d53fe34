"""Trainer integrations: token expansion, row alignment, and agreement with verl's and TRL's
own advantage code where those packages are installed (a skipped test names the package)."""

from __future__ import annotations

import importlib
import types

import numpy as np
import pyarrow as pa
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


@pytest.mark.parametrize(("seed", "n_groups", "length", "holes"), [(0, 40, 6, False), (1, 40, 6, True), (2, 900, 48, True)])
def test_verl_rloo_opo_and_reinforce_pp_baseline(seed, n_groups, length, holes):
    """Bit for bit, REINFORCE++'s token-level whitening included: the largest case whitens
    over more than 32768 mask entries, which ATen sums on torch's threads."""
    torch = _need("torch", "torch")
    core_algos = _need("verl.trainer.ppo.core_algos", "verl")
    scores, uids = _random_rows(seed, n_groups)
    rewards, mask = _verl_inputs(torch, scores, uids, length=length, seed=seed)
    if holes:  # an agent loop's mask: tool output inside the response is not generated
        rng = np.random.default_rng(seed)
        mask = mask * torch.from_numpy((rng.random(mask.shape) > 0.2).astype(np.float32))
        mask[torch.arange(len(scores)), rewards.ne(0).float().argmax(-1)] = 1.0
        mask[:, 0] = 1.0
    lengths = mask.sum(-1).double().numpy()
    threads = torch.get_num_threads()

    def ours(estimator):
        per_row = masreplay.group_normalize(
            scores, uids, lengths=lengths, mask=mask.numpy(), estimator=estimator, compat="verl", torch_threads=threads
        )
        return torch.from_numpy(per_row).unsqueeze(-1) * mask

    theirs, _ = core_algos.compute_rloo_outcome_advantage(rewards, mask, uids)
    assert torch.equal(theirs, ours("rloo"))
    theirs, _ = core_algos.compute_opo_outcome_advantage(rewards, mask, uids)
    assert torch.equal(theirs, ours("opo"))
    theirs, _ = core_algos.compute_reinforce_plus_plus_baseline_outcome_advantage(rewards, mask, uids)
    assert torch.equal(theirs, ours("reinforce_pp_baseline"))
    from masreplay.integrations import verl as verl_integration

    verl_integration.register()
    plugged = core_algos.get_adv_estimator_fn("masreplay_reinforce_pp_baseline")
    via_registry, _ = plugged(token_level_rewards=rewards, response_mask=mask.bool(), index=uids, config=None)
    assert torch.equal(via_registry, theirs)


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
    with pytest.raises(InvalidArgumentError, match="KVBatchMeta"):
        mixin()._compute_advantage(types.new_class("KVBatchMeta")(), metrics)


def test_verl_dataproto_compute_advantage_and_registry():
    """verl's own DataProto through compute_advantage (full traces: ids in non_tensor_batch as
    object arrays), and a registered estimator called as verl's trainer calls one (the
    trainer module itself needs ray and torchdata)."""
    torch = _need("torch", "torch")
    protocol = _need("verl.protocol", "verl")
    core_algos = _need("verl.trainer.ppo.core_algos", "verl")
    from masreplay.integrations import verl as verl_integration

    batch = masreplay.sim.generate(16, agents=(2, 4), group_size=4, seed=5)
    events = batch.events()
    picks = [int(batch.event_offsets[i]) + 1 for i in range(16)]
    mask = torch.ones(16, 5, dtype=torch.int64)
    mask[::2, 3:] = 0
    data = protocol.DataProto.from_single_dict(
        {
            "response_mask": mask,
            "token_level_rewards": torch.zeros(16, 5),
            "trace_id": np.array([events["trace_id"][k].as_py() for k in picks], dtype=object),
            "event_id": np.array([events["id"][k].as_py() for k in picks], dtype=object),
        }
    )
    out = verl_integration.compute_advantage(data, batch, normalize_by="agent", unit="events")
    assert out is data and isinstance(out, protocol.DataProto)
    expected = torch.from_numpy(masreplay.advantages(batch, normalize_by="agent", unit="events").per_event[picks])
    assert torch.equal(data.batch["advantages"], expected.unsqueeze(-1) * mask)
    assert torch.equal(data.batch["returns"], data.batch["advantages"])
    # A slice of the DataProto (a mini-batch) keeps ids and advantages row for row.
    assert torch.equal(data[4:8].batch["advantages"][:, 0], expected[4:8])

    verl_integration.register()
    scores, uids = _random_rows(3)
    rewards, grpo_mask = _verl_inputs(torch, scores, uids, seed=3)
    step = protocol.DataProto.from_dict(
        tensors={"token_level_rewards": rewards, "response_mask": grpo_mask}, non_tensors={"uid": uids.astype(object)}
    )
    for estimator in verl_integration.ESTIMATORS:
        # ray_trainer.compute_advantage's arguments for a registered estimator:
        kwargs = {
            "token_level_rewards": step.batch["token_level_rewards"],
            "response_mask": step.batch["response_mask"],
            "config": {"norm_adv_by_std_in_grpo": True},
            "index": step.non_tensor_batch["uid"],
        }
        ours, _ = core_algos.get_adv_estimator_fn(f"masreplay_{estimator}")(**kwargs)
        verl_name = {"reinforce_pp_baseline": "reinforce_plus_plus_baseline"}.get(estimator, estimator)
        theirs, _ = core_algos.get_adv_estimator_fn(verl_name)(**kwargs)
        assert torch.equal(ours, theirs), estimator


def test_verl_ppo_trainer_steps_over_traces():
    """RayPPOTrainer.fit calls its module's compute_advantage: use_trace_advantages swaps it
    for the trace-level step and puts verl's back; a registered estimator also runs through
    verl's own step."""
    torch = _need("torch", "torch")
    protocol = _need("verl.protocol", "verl")
    ray_trainer = _need(
        "verl.trainer.ppo.ray_trainer", "verl (its trainer also needs torchdata, peft, cachetools, fastapi, uvicorn)"
    )
    from masreplay.integrations import verl as verl_integration

    assert "compute_advantage" in ray_trainer.RayPPOTrainer.fit.__code__.co_names, "fit looks the step up by name"
    batch = masreplay.sim.generate(8, agents=(2, 3), group_size=4, seed=7)
    events = batch.events()
    picks = [int(batch.event_offsets[i]) for i in range(8)]
    mask = torch.ones(8, 4, dtype=torch.int64)
    data = protocol.DataProto.from_single_dict(
        {
            "response_mask": mask,
            "token_level_rewards": torch.zeros(8, 4),
            "trace_id": np.array([events["trace_id"][k].as_py() for k in picks], dtype=object),
            "event_id": np.array([events["id"][k].as_py() for k in picks], dtype=object),
        }
    )
    verl_step = ray_trainer.compute_advantage
    restore = verl_integration.use_trace_advantages(lambda _: batch, normalize_by="agent", unit="events")
    try:
        out = ray_trainer.compute_advantage(data, adv_estimator="grpo", gamma=1.0, lam=1.0, num_repeat=1)
    finally:
        restore()
    assert ray_trainer.compute_advantage is verl_step
    expected = torch.from_numpy(masreplay.advantages(batch, normalize_by="agent", unit="events").per_event[picks])
    assert torch.equal(out.batch["advantages"], expected.unsqueeze(-1) * mask)

    verl_integration.register()
    scores, uids = _random_rows(5)
    rewards, grpo_mask = _verl_inputs(torch, scores, uids, seed=5)

    def step(estimator):
        data = protocol.DataProto.from_dict(
            tensors={"token_level_rewards": rewards, "response_mask": grpo_mask}, non_tensors={"uid": uids.astype(object)}
        )
        return ray_trainer.compute_advantage(data, adv_estimator=estimator).batch["advantages"]

    assert torch.equal(step("masreplay_grpo"), step("grpo"))


def test_verl_loads_the_entry_point(tmp_path):
    """pyproject's "verl.plugins" entry point, as an installed masreplay declares it, makes a
    bare `import verl` register the estimators (in a fresh interpreter)."""
    _need("verl", "verl")
    import subprocess
    import sys
    import tomllib
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    plugins = tomllib.loads((root / "pyproject.toml").read_text())["project"]["entry-points"]["verl.plugins"]
    info = tmp_path / "masreplay_entry-0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: masreplay-entry\nVersion: 0\n")
    lines = "".join(f"{name} = {target}\n" for name, target in plugins.items())
    (info / "entry_points.txt").write_text("[verl.plugins]\n" + lines)
    code = (
        "import verl\nfrom verl.trainer.ppo import core_algos\n"
        "print(sorted(k for k in core_algos.ADV_ESTIMATOR_REGISTRY if k.startswith('masreplay')))"
    )
    path = [str(tmp_path), str(Path(masreplay.__file__).parents[1])]
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": ":".join(path), "VERL_USE_EXTERNAL_PLUGINS": "auto"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "'masreplay_grpo', 'masreplay_opo', 'masreplay_reinforce_pp_baseline', 'masreplay_rloo'" in out.stdout


# ---- TRL -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
@pytest.mark.parametrize(("seed", "n_groups"), [(0, 16), (1, 16), (2, 5000)])
def test_trl_group_normalisation_bit_for_bit(scale, seed, n_groups):
    """5000 groups: TRL's batch std sums 40000 rewards, which ATen splits between threads."""
    torch = _need("torch", "torch")
    utils = _need("trl.trainer.utils", "trl")
    num_generations = 8
    rng = np.random.default_rng(seed)
    rewards = torch.from_numpy(rng.normal(size=n_groups * num_generations).astype(np.float32))
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
    groups = np.repeat(np.arange(n_groups), num_generations)
    threads = torch.get_num_threads()
    ours = masreplay.group_normalize(rewards.numpy(), groups, compat="trl", std=scale, torch_threads=threads)
    assert torch.equal(torch.from_numpy(ours), theirs)


def test_torch_sqrt_emulation_matches_torch():
    """TRL's nanstd ends in torch.sqrt, which torch's MKL computes with a kernel chosen by CPU,
    not always correctly rounded; compat="trl" rounds as the kernel this CPU runs. Every value
    of [1, 4) covers every mantissa of both exponent parities; then the edges."""
    torch = _need("torch", "torch")
    from masreplay import _core

    bits = np.arange(0x3F800000, 0x40800000, dtype=np.uint32)
    edges = np.array([0, 1, 0x7FFFFF, 0x800000, 0x0D000000, 0x7F7FF000, 0x7F7FF001, 0x7F7FFFFF, 0x7F800000], np.uint32)
    for x in (bits.view(np.float32), edges.view(np.float32), np.linspace(1e-30, 1e30, 100_000, dtype=np.float32)):
        ours, kernel = _core.torch_sqrt(x)
        theirs = torch.sqrt(torch.from_numpy(x))
        differ = np.flatnonzero(ours != theirs.numpy())
        assert differ.size == 0, f"{kernel} emulation differs from torch.sqrt at {x[differ[:5]]} ({differ.size} values)"
    with pytest.raises(InvalidArgumentError, match="kernel"):
        _core.torch_sqrt(np.ones(1, np.float32), "sleef")


def test_trl_trainer_subclass():
    trl = _need("trl", "trl")
    from masreplay.integrations.trl import MasreplayGRPOTrainer

    assert issubclass(MasreplayGRPOTrainer, trl.GRPOTrainer)
    assert "_generate_and_score_completions" in MasreplayGRPOTrainer.__dict__


def test_trl_trainer_trains_on_masreplay_advantages(tmp_path):
    """TRL's real GRPOTrainer, one step on the CPU: a 1-layer Llama and a word-level
    tokenizer built here (no hub), two prompts x two generations; each row is a trace of a
    simulated batch, and the advantages the loss receives are masreplay's per-agent ones."""
    torch = _need("torch", "torch")
    trl = _need("trl", "trl")
    datasets = _need("datasets", "datasets")
    transformers = _need("transformers", "transformers")
    tokenizers = _need("tokenizers", "tokenizers")
    from masreplay.integrations.trl import MasreplayGRPOTrainer

    words = ["<pad>", "<eos>", "<unk>"] + [f"w{i}" for i in range(29)]
    word_level = tokenizers.Tokenizer(tokenizers.models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    word_level.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=word_level, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>"
    )
    torch.manual_seed(0)
    sizes = {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1, "max_position_embeddings": 64}
    heads = {"num_attention_heads": 2, "num_key_value_heads": 2}
    special = {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 1}
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(vocab_size=len(words), **sizes, **heads, **special))

    traces = masreplay.sim.generate(4, agents=(2, 4), group_size=2, seed=3)
    group_of = pa.table(traces)["group_id"].to_pylist()
    members: dict[str, list[str]] = {}
    for trace_id, group in zip(traces.trace_ids, group_of, strict=True):
        members.setdefault(group, []).append(trace_id)
    prompts = datasets.Dataset.from_dict({"prompt": ["w3 w4 w5", "w6 w7"], "group_id": list(members)})
    options = {"normalize_by": "agent"}
    seen: list[list[str]] = []
    generated: list = []
    trained: list = []

    def traces_of(inputs, _output):
        taken: dict[str, int] = {}
        ids = []
        for row in inputs:  # each prompt's generations take that group's traces in turn
            group = row["group_id"]
            ids.append(members[group][taken.setdefault(group, 0)])
            taken[group] += 1
        seen.append(ids)
        return traces, ids, None

    class Recording(MasreplayGRPOTrainer):
        def _generate_and_score_completions(self, inputs):
            output = super()._generate_and_score_completions(inputs)
            generated.append(output["advantages"].clone())
            return output

        def compute_loss(self, model, inputs, *args, **kwargs):
            trained.append(inputs["advantages"].clone())
            return super().compute_loss(model, inputs, *args, **kwargs)

    args = trl.GRPOConfig(
        output_dir=str(tmp_path),
        per_device_train_batch_size=4,
        num_generations=2,
        max_completion_length=4,
        max_steps=1,
        learning_rate=1e-2,
        use_cpu=True,
        bf16=False,
        report_to="none",
        save_strategy="no",
        logging_steps=1,
        seed=0,
    )
    before = [p.detach().clone() for p in model.parameters()]
    trainer = Recording(
        model=model,
        reward_funcs=lambda completions, **_: [float(len(c)) for c in completions],
        args=args,
        train_dataset=prompts,
        processing_class=tokenizer,
        traces_of=traces_of,
        advantage_options=options,
    )
    trainer.train()

    result = masreplay.advantages(traces, **options)
    position = {trace_id: i for i, trace_id in enumerate(traces.trace_ids)}
    expected = torch.tensor([result.per_trace[position[t]] for t in seen[0]], dtype=torch.float32)
    assert len(seen) == 1 and sorted(seen[0]) == sorted(traces.trace_ids)
    assert torch.equal(generated[0], expected)
    assert torch.equal(torch.sort(torch.cat(trained)).values, torch.sort(expected).values)
    assert list(trainer._logs["advantages"]) == expected.tolist()  # the completions table's
    assert torch.count_nonzero(expected) > 0
    assert any(not torch.equal(a, b.detach()) for a, b in zip(before, model.parameters(), strict=True))


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
