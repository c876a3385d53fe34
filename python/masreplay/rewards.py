"""Orchestration rewards: Kimi PARL's reward, weight schedules, and the composition of reward
channels with optional running-std balancing.

Everything here is small numpy on per-trace figures; the graph work is in
:func:`masreplay.orchestration.metrics`. Schedules and balancing state are plain data
(``to_dict`` / ``from_dict`` give JSON-safe dicts; pickling works too), so a training run
that checkpoints them resumes with the same weights.
"""

from __future__ import annotations

import bisect
import contextlib
import itertools
import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Literal

import numpy as np
import pyarrow.compute as pc

from masreplay import _core
from masreplay._args import I64_MAX, checked, flag, numbers, real, unsummable, whole, wrong_type
from masreplay.errors import ChannelNotFoundError, InvalidArgumentError
from masreplay.io import as_batch
from masreplay.orchestration import metrics


@checked
def parl(batch: Any, lambda_parallel: float, lambda_finish: float, *, perf: str = "team") -> np.ndarray:
    """Kimi K2.5 PARL's reward per trace: ``r_perf + lambda_parallel * r_parallel +
    lambda_finish * r_finish``.

    - ``r_perf``: the trace's ``perf`` reward channel (0 where a trace lacks it);
    - ``r_parallel = 1 - critical_steps / total_work_steps``: the measured speedup ``s`` (work
      over PARL critical steps) as ``1 - 1/s``, so 0 for a serial run and below 1 however wide;
      bounded like a success reward, so the lambdas keep their meaning;
    - ``r_finish``: the finish rate, 0 when nothing was spawned (a run that never delegates
      must not earn the finishing bonus, or the reward would favour the serial collapse PARL
      is designed against).

    ``batch`` is a TraceBatch or anything ``load_traces`` accepts. Pass ``Schedule(step)``
    values as the lambdas to anneal them.
    """
    batch = as_batch(batch)
    table = metrics(batch)
    work = table["total_work_steps"].to_numpy().astype(np.float64)
    critical = table["critical_steps"].to_numpy().astype(np.float64)
    r_parallel = np.clip(1.0 - critical / work, 0.0, 1.0)
    r_finish = table["finish_rate"].fill_null(0.0).to_numpy()
    r_perf = pc.map_lookup(batch.to_arrow()["rewards"], perf, "first").fill_null(0.0).to_numpy()
    return r_perf + lambda_parallel * r_parallel + lambda_finish * r_finish


class Schedule:
    """A weight as a function of the training step: ``schedule(step) -> float``.

    Build one with :meth:`constant`, :meth:`linear`, :meth:`cosine`, :meth:`step` or
    :meth:`on_indicator` (an anneal triggered by a measured indicator rather than by the step
    count). Only an indicator schedule has state; feed it with :meth:`observe`.
    """

    __slots__ = ("kind", "params", "state")

    def __init__(self, kind: str, params: dict[str, Any], state: dict[str, Any] | None = None) -> None:
        if kind not in _KINDS:
            raise InvalidArgumentError(f"unknown schedule kind {kind!r}; expected one of {sorted(_KINDS)}")
        self.kind = kind
        self.params = params
        self.state = state if state is not None else ({"streak": 0, "since": None} if kind == "on_indicator" else {})

    # The constructors check their arguments (@checked): a weight that is no finite
    # number (NaN, an infinity, text) or a step count that is no whole number >= 0 is refused
    # by name here, not found later as a NaN weight or a builtin error from float().
    @classmethod
    @checked
    def constant(cls, value: float) -> Schedule:
        return cls("constant", {"value": value})

    @classmethod
    @checked
    def linear(cls, start: float, end: float, steps: int) -> Schedule:
        """From ``start`` at step 0 to ``end`` at ``steps``, then ``end``."""
        return cls("linear", {"start": start, "end": end, "steps": steps})

    @classmethod
    @checked
    def cosine(cls, start: float, end: float, steps: int) -> Schedule:
        """Half a cosine from ``start`` at step 0 to ``end`` at ``steps``, then ``end``."""
        return cls("cosine", {"start": start, "end": end, "steps": steps})

    @classmethod
    @checked
    def step(cls, values: Sequence[float], boundaries: Sequence[int]) -> Schedule:
        """``values[i]`` from ``boundaries[i-1]`` (inclusive) to ``boundaries[i]``:
        one more value than boundaries, boundaries increasing."""
        if len(values) != len(boundaries) + 1:
            raise InvalidArgumentError(f"step needs one more value than boundaries, got {len(values)} and {len(boundaries)}")
        if any(lower >= upper for lower, upper in itertools.pairwise(boundaries)):
            raise InvalidArgumentError(f"boundaries must increase, got {list(boundaries)}")
        return cls("step", {"values": list(values), "boundaries": list(boundaries)})

    @classmethod
    def on_indicator(
        cls,
        before: Schedule | float,
        after: Schedule,
        *,
        threshold: float,
        patience: int,
        above: bool = True,
    ) -> Schedule:
        """``before`` until the indicator given to :meth:`observe` has been above (or, with
        ``above=False``, below) ``threshold`` for ``patience`` consecutive observations; from
        then on ``after``, with its steps counted from the trigger. For example, keep the
        finish-rate weight at 0.5 until the mean finish rate exceeds 0.9 for 20 steps, then
        anneal it linearly to 0 over 1,000 steps."""
        # Checked by hand: @checked reads the annotations while the class, which they name,
        # is still being defined.
        before = before if isinstance(before, Schedule) else cls.constant(before)
        if not isinstance(after, Schedule):
            raise wrong_type("Schedule.on_indicator: after", "a Schedule", after)
        params = {
            "before": before,
            "after": after,
            "threshold": real("Schedule.on_indicator: threshold", threshold),
            "patience": whole("Schedule.on_indicator: patience", patience),
        }
        return cls("on_indicator", {**params, "above": flag("Schedule.on_indicator: above", above)})

    def observe(self, step: int, indicator: float) -> bool:
        """Records the indicator measured at ``step``; True once the anneal has triggered. A
        NaN indicator (nothing measured) does not meet the threshold."""
        if self.kind != "on_indicator":
            raise TypeError(f"a {self.kind} schedule does not observe indicators")
        step = whole("Schedule.observe: step", step, low=-I64_MAX, high=I64_MAX)
        indicator = real("Schedule.observe: indicator", indicator, nan=True)
        if self.state["since"] is not None:
            return True
        met = indicator > self.params["threshold"] if self.params["above"] else indicator < self.params["threshold"]
        self.state["streak"] = self.state["streak"] + 1 if met else 0
        if self.state["streak"] >= self.params["patience"]:
            self.state["since"] = step
        return self.state["since"] is not None

    def __call__(self, step: float) -> float:
        step = real("Schedule: step", step)  # NaN would make every schedule's weight NaN
        p = self.params
        if self.kind == "constant":
            return p["value"]
        if self.kind in ("linear", "cosine"):
            progress = 1.0 if p["steps"] == 0 else min(max(step, 0) / p["steps"], 1.0)
            if self.kind == "cosine":
                progress = (1.0 - math.cos(math.pi * progress)) / 2.0
            return p["start"] + (p["end"] - p["start"]) * progress
        if self.kind == "step":
            return p["values"][bisect.bisect_right(p["boundaries"], step)]
        since = self.state["since"]
        return p["before"](step) if since is None or step < since else p["after"](step - since)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-safe description, state included."""
        params = {k: v.to_dict() if isinstance(v, Schedule) else v for k, v in self.params.items()}
        return {"kind": self.kind, "params": params, "state": dict(self.state)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Schedule:
        """The schedule :meth:`to_dict` described, rebuilt through its constructor so that a
        damaged description (a checkpoint edited by hand, truncated) is refused by name."""
        with _refused_if_damaged("Schedule.from_dict: not a schedule's description"):
            kind = data["kind"]
            if kind not in _KINDS:
                raise InvalidArgumentError(f"unknown schedule kind {kind!r}; expected one of {sorted(_KINDS)}")
            params = {k: cls.from_dict(v) if isinstance(v, Mapping) else v for k, v in data["params"].items()}
            schedule = getattr(cls, kind)(**params)
            state = dict(data.get("state") or {})
            if kind == "on_indicator":
                since = state.get("since")
                schedule.state = {
                    "streak": whole("Schedule.from_dict: state.streak", state.get("streak", 0)),
                    "since": None if since is None else whole("Schedule.from_dict: state.since", since, low=-I64_MAX),
                }
        return schedule

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Schedule) and self.to_dict() == other.to_dict()

    def __repr__(self) -> str:
        return f"Schedule({self.to_dict()!r})"

    def __reduce__(self) -> tuple[Any, tuple[dict[str, Any]]]:
        return (Schedule.from_dict, (self.to_dict(),))


_KINDS = {"constant", "linear", "cosine", "step", "on_indicator"}


@contextlib.contextmanager
def _refused_if_damaged(what: str) -> Iterator[None]:
    """What reading a damaged saved dict raises from inside (a missing key, a wrong type) as
    one refusal that says ``what``; the checks' own refusals pass through as they are."""
    try:
        yield
    except InvalidArgumentError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        raise InvalidArgumentError(f"{what}: {error!r}") from None


class RunningStd:
    """The running standard deviation of each reward channel over every value seen
    (Chan et al.'s parallel merge of count, mean and sum of squared deviations; unbiased,
    N-1). The state of ``compose(..., balance="std")``: pass the same instance on every call."""

    __slots__ = ("channels", "eps")

    def __init__(self, eps: float = 1e-8) -> None:
        self.eps = real("RunningStd: eps", eps, low=0.0)
        #: channel -> [count, mean, m2]
        self.channels: dict[str, list[float]] = {}

    @checked
    def update(self, channel: str, values: Any) -> None:
        """Merges ``values`` (NaN: missing, skipped) into the statistics of ``channel``;
        values compose would refuse are refused here, before the statistics change."""
        values = _channel(channel, values, "RunningStd.update")
        values = values[~np.isnan(values)]
        if len(values) == 0:
            return
        count, mean, m2 = self.channels.get(channel, [0, 0.0, 0.0])
        n, batch_mean = len(values), float(values.mean())
        delta = batch_mean - mean
        total = count + n
        m2 += float(((values - batch_mean) ** 2).sum()) + delta * delta * count * n / total
        self.channels[channel] = [total, mean + delta * n / total, m2]

    def std(self, channel: str) -> float:
        count, _, m2 = self.channels.get(channel, [0, 0.0, 0.0])
        return math.sqrt(m2 / (count - 1)) if count > 1 else math.nan

    def scale(self, channel: str) -> float:
        """1 / std, or 1 while the channel has no spread yet (fewer than 2 values, or constant)."""
        std = self.std(channel)
        return 1.0 / (std + self.eps) if std > 0 else 1.0

    def to_dict(self) -> dict[str, Any]:
        return {"eps": self.eps, "channels": {k: list(v) for k, v in self.channels.items()}}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RunningStd:
        """The statistics :meth:`to_dict` saved; a damaged copy is refused by name."""
        with _refused_if_damaged("RunningStd.from_dict: not saved statistics"):
            state = cls(real("RunningStd.from_dict: eps", data["eps"], low=0.0))
            for name, (count, mean, m2) in data["channels"].items():
                where = f"RunningStd.from_dict: channels[{name!r}]"
                state.channels[str(name)] = [
                    whole(f"{where} count", count),
                    real(f"{where} mean", mean),
                    real(f"{where} m2", m2, low=0.0),
                ]
        return state

    def __repr__(self) -> str:
        return f"RunningStd({ {k: round(self.std(k), 6) for k in self.channels} })"


@checked
def compose(
    channels: Mapping[str, Any],
    weights: Mapping[str, float | Schedule],
    *,
    balance: Literal["std"] | None = None,
    state: RunningStd | None = None,
    step: int | None = None,
) -> np.ndarray:
    """The hybrid reward ``sum_k w_k * c_k`` over named channels (arrays of one value per
    trace); a NaN in a channel contributes nothing (as TRL's nansum).

    ``weights`` maps each channel to a number or a :class:`Schedule` (evaluated at ``step``).
    With ``balance="std"`` each channel is first divided by its running standard deviation,
    so that no channel drowns the others whatever its scale: the statistics live in ``state``
    (a :class:`RunningStd`, updated with this batch before scaling); pass the same one on
    every call to keep them across calls, and save it with ``state.to_dict()``.
    """
    if state is not None and not isinstance(state, RunningStd):
        raise wrong_type("compose: state", "a RunningStd", state)
    if state is not None and balance is None:
        raise InvalidArgumentError("compose: state holds the running statistics of balance='std'; pass balance='std' with it")
    if balance is not None and state is None:
        state = RunningStd()
    missing = set(weights) - set(channels)
    if missing:
        raise ChannelNotFoundError(tuple(sorted(map(str, missing))), tuple(map(str, channels)))
    if not weights:
        raise InvalidArgumentError("compose needs at least one weighted channel")
    # Every channel and weight is read and checked before the state learns from any of them,
    # so a refused call leaves the running statistics as they were.
    terms = {name: (_weight(name, weight, step), _channel(name, channels[name], "compose")) for name, weight in weights.items()}
    lengths = {name: len(values) for name, (_, values) in terms.items()}
    if len(set(lengths.values())) > 1:
        raise InvalidArgumentError(f"compose: channels must hold one value per trace each, got lengths {lengths}")
    total = np.zeros(next(iter(lengths.values())))
    for name, (weight, values) in terms.items():
        if state is not None:
            state.update(name, values)
            values = values * state.scale(name)
        total += np.nan_to_num(weight * values, nan=0.0)
    return total


def _weight(name: str, weight: float | Schedule, step: int | None) -> float:
    if isinstance(weight, Schedule):
        if step is None:
            raise InvalidArgumentError(f"the weight of {name!r} is a Schedule: pass step=")
        weight = weight(step)
    value = real(f"compose: the weight of {name!r}", weight)
    if not abs(value) < _core.VALUE_BOUND:
        raise InvalidArgumentError(f"compose: the weight of {name!r} is {value:g}: weights must be of magnitude below 2^49")
    return value


def _channel(name: str, values: Any, caller: str) -> np.ndarray:
    """One value per trace of channel ``name``, checked for ``caller`` (named in a refusal)."""
    array = numbers(f"{caller}: channel {name!r}", values)
    if array.ndim != 1:
        raise InvalidArgumentError(f"{caller}: channel {name!r} must be 1-D (one value per trace), got shape {array.shape}")
    beyond = np.flatnonzero(unsummable(array))
    if len(beyond):
        raise InvalidArgumentError(
            f"{caller}: channel {name!r} holds {array[beyond[0]]:g} (trace {beyond[0]}): rewards must be finite and "
            "of magnitude below 2^49 (about 5.6e14), beyond which sums overflow (NaN marks a missing one)"
        )
    return array
