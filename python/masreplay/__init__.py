"""masreplay: the storage and credit engine for RL on LLM multi-agent orchestration traces.

Traces are temporal event graphs kept whole in Arrow (one row per trace). Start with
:func:`load_traces`, :func:`validate` and :mod:`masreplay.sim`.
"""

from masreplay import sim
from masreplay._core import SCHEMA_VERSION
from masreplay.batch import TraceBatch
from masreplay.buffer import AddReport, GraphBuffer
from masreplay.errors import (
    DataFormatError,
    InvalidArgumentError,
    MasreplayError,
    StorageError,
    TraceValidationError,
)
from masreplay.io import load_traces, validate

__all__ = [
    "SCHEMA_VERSION",
    "AddReport",
    "DataFormatError",
    "GraphBuffer",
    "InvalidArgumentError",
    "MasreplayError",
    "StorageError",
    "TraceBatch",
    "TraceValidationError",
    "load_traces",
    "sim",
    "validate",
]

