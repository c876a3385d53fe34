"""TRL plug-in: a ``GRPOTrainer`` whose advantages come from masreplay.

``MasreplayGRPOTrainer(..., traces_of=fn, advantage_options={...})`` calls the parent's
``_generate_and_score_completions`` and replaces ``output["advantages"]`` (one per local row)
with masreplay's: ``fn(inputs, output)`` returns ``(traces, trace_ids, event_ids)`` for the
local rows (``event_ids`` None when a row is a whole trace), and ``advantage_options`` are
the arguments of :func:`masreplay.advantages`; the completions log shows them too. Without
``traces_of`` it is TRL's trainer unchanged. Tested end to end with TRL 1.16 (one GRPO step of
a tiny model on the CPU).

TRL is optional: ``MasreplayGRPOTrainer`` is built on first access and a missing TRL is
reported by name.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from masreplay.advantages import advantages as trace_advantages
from masreplay.integrations import align_rows

_CLASS: type | None = None


def _build() -> type:
    try:
        from trl import GRPOTrainer
    except ImportError as error:
        raise ImportError("masreplay.integrations.trl needs the 'trl' package (pip install trl)") from error
    import torch

    class MasreplayGRPOTrainer(GRPOTrainer):
        """GRPOTrainer with masreplay's trace-level advantages."""

        def __init__(
            self,
            *args: Any,
            traces_of: Callable[[Any, dict], tuple[Any, list, list | None]] | None = None,
            advantage_options: dict | None = None,
            **kwargs: Any,
        ) -> None:
            super().__init__(*args, **kwargs)
            self.traces_of = traces_of
            self.advantage_options = dict(advantage_options or {})

        def _generate_and_score_completions(self, inputs: Any) -> dict:
            output = super()._generate_and_score_completions(inputs)
            if self.traces_of is None:
                return output
            traces, trace_ids, event_ids = self.traces_of(inputs, output)
            result = trace_advantages(traces, **self.advantage_options)
            per_row = align_rows(result, trace_ids, event_ids, batch=traces)
            previous = output["advantages"]
            ours = torch.as_tensor(np.ascontiguousarray(per_row), dtype=previous.dtype, device=previous.device)
            output["advantages"] = ours
            # TRL has logged its own advantages of every process's rows (the completions
            # table): log the ones trained on instead.
            logged = self._logs["advantages"]
            every = self.accelerator.gather(ours).tolist()
            for _ in range(min(len(every), len(logged))):
                logged.pop()
            logged.extend(every)
            return output

    return MasreplayGRPOTrainer


def __getattr__(name: str) -> Any:
    global _CLASS
    if name == "MasreplayGRPOTrainer":
        if _CLASS is None:
            _CLASS = _build()
        return _CLASS
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
