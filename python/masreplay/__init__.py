"""masreplay: the storage and credit engine for RL on LLM multi-agent orchestration traces.

Traces are temporal event graphs kept whole in Arrow (one row per trace). Start with
:func:`load_traces`, :func:`validate` and :mod:`masreplay.sim`.
"""

from masreplay import convert, games, rewards, sim
from masreplay._core import SCHEMA_VERSION
from masreplay.batch import TraceBatch
from masreplay.buffer import AddReport, GraphBuffer
from masreplay.errors import (
    ConversionError,
    DataFormatError,
    InvalidArgumentError,
    MasreplayError,
    StorageError,
    TraceValidationError,
)
from masreplay.io import load_traces, validate
from masreplay.orchestration import metrics
from masreplay.shapley import ShapleyResult, TraceCredit, shapley, trace_players, trace_shapley

__all__ = [
    "SCHEMA_VERSION",
    "AddReport",
    "ConversionError",
    "DataFormatError",
    "GraphBuffer",
    "InvalidArgumentError",
    "MasreplayError",
    "ShapleyResult",
    "StorageError",
    "TraceBatch",
    "TraceCredit",
    "TraceValidationError",
    "convert",
    "games",
    "load_traces",
    "metrics",
    "rewards",
    "shapley",
    "sim",
    "trace_players",
    "trace_shapley",
    "validate",
]

