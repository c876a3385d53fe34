"""masreplay: the storage and credit engine for RL on LLM multi-agent orchestration traces.

Traces are temporal event graphs kept whole in Arrow (one row per trace). Start with
:func:`load_traces`, :func:`validate` and :mod:`masreplay.sim`.
"""

from masreplay import convert, games, recipes, rewards, sim
from masreplay._core import SCHEMA_VERSION
from masreplay.advantages import Advantages, advantages, event_rewards, graph_gae, graph_returns, group_normalize
from masreplay.batch import TraceBatch
from masreplay.buffer import AddReport, GraphBuffer
from masreplay.counterfactual import coma_credit, counterfactual_credit, difference_rewards, same_prefix_credit
from masreplay.errors import (
    ArgumentTypeError,
    ChannelNotFoundError,
    ColumnNotFoundError,
    ConversionError,
    DataFormatError,
    InvalidArgumentError,
    MasreplayError,
    StorageError,
    TraceNotFoundError,
    TraceValidationError,
)
from masreplay.io import as_batch, load_traces, validate
from masreplay.offline import DumpSummary, credit_dump, read_credit
from masreplay.orchestration import metrics
from masreplay.shapley import ShapleyResult, TraceCredit, shapley, trace_players, trace_shapley
from masreplay.viewer import TraceView, view
from masreplay.vocabulary import EDGE_TYPES, ESTIMATORS, EVENT_TYPES, STRATA, TOPOLOGIES

__all__ = [
    "EDGE_TYPES",
    "ESTIMATORS",
    "EVENT_TYPES",
    "SCHEMA_VERSION",
    "STRATA",
    "TOPOLOGIES",
    "AddReport",
    "Advantages",
    "ArgumentTypeError",
    "ChannelNotFoundError",
    "ColumnNotFoundError",
    "ConversionError",
    "DataFormatError",
    "DumpSummary",
    "GraphBuffer",
    "InvalidArgumentError",
    "MasreplayError",
    "ShapleyResult",
    "StorageError",
    "TraceBatch",
    "TraceCredit",
    "TraceNotFoundError",
    "TraceValidationError",
    "TraceView",
    "advantages",
    "as_batch",
    "coma_credit",
    "convert",
    "counterfactual_credit",
    "credit_dump",
    "difference_rewards",
    "event_rewards",
    "games",
    "graph_gae",
    "graph_returns",
    "group_normalize",
    "load_traces",
    "metrics",
    "read_credit",
    "recipes",
    "rewards",
    "same_prefix_credit",
    "shapley",
    "sim",
    "trace_players",
    "trace_shapley",
    "validate",
    "view",
]
