"""Type stubs of the compiled core (rust/masreplay-py)."""

from collections.abc import Sequence
from os import PathLike
from typing import Literal, TypedDict

import numpy as np

from masreplay.errors import TraceValidationError
from masreplay.vocabulary import (
    Baseline,
    Estimator,
    ReturnKind,
    Sampler,
    ShapleyMethod,
    ShapleySurrogate,
    Stratum,
    Unit,
)

SCHEMA_VERSION: int
MAX_PRIORITY: float
VALUE_BOUND: float
# The core's vocabularies, in the canonical order (equal to masreplay.vocabulary's Literals).
EVENT_TYPES: tuple[str, ...]
EDGE_TYPES: tuple[str, ...]
TOPOLOGIES: tuple[str, ...]
COUNTERFACTUAL_KINDS: tuple[str, ...]
ESTIMATORS: tuple[str, ...]
STRATA: tuple[str, ...]
UNITS: tuple[str, ...]
RETURN_KINDS: tuple[str, ...]
SAMPLERS: tuple[str, ...]
BASELINES: tuple[str, ...]
SHAPLEY_METHODS: tuple[str, ...]
SHAPLEY_SURROGATES: tuple[str, ...]

#: The traces refused: (position in the input, trace_id, the error), in input order.
_Rejected = list[tuple[int, str | None, TraceValidationError]]
#: torch's sqrt kernels the trl emulation follows.
_SqrtKernel = Literal["correctly-rounded", "mkl-generic", "mkl-avx512"]
#: Counterfactual credit over the credited events only: (event position in the batch's
#: events, trace row, credit, standard error, branches), dtypes u64, u32, f64, f64, u32.
_CreditArrays = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]

class _ShapleyDict(TypedDict):
    values: np.ndarray  # float64, one per player
    stderr: np.ndarray  # float64, 0 where exact
    evaluations: int
    converged: bool
    method: ShapleyMethod  # the estimator that ran (what "auto" picked)
    exact: bool
    efficiency_gap: float  # NaN under noise
    noise: float | None  # sigma of one evaluation under noise

class _TraceShapleyDict(TypedDict):
    offsets: np.ndarray  # int64 (n_traces + 1): trace i owns players offsets[i]:offsets[i + 1]
    labels: list[str]  # one per player
    parents: np.ndarray  # int64 per player: local index of the spawning player, -1 for a root
    event_player: np.ndarray  # int64 per event: local index of its player, -1 for none
    values: np.ndarray  # float64 per player
    stderr: np.ndarray  # float64 per player
    evaluations: np.ndarray  # int64 per trace
    methods: list[ShapleyMethod | None]  # per trace; None: a trace without players
    exact: list[bool]  # per trace
    noise: np.ndarray  # float64 per trace: sigma of one evaluation under noise, else NaN
    total_evaluations: int  # rows valued by value_fn, over all traces

class TraceBatch:
    def __len__(self) -> int: ...
    @property
    def trace_ids(self) -> list[str]: ...
    @property
    def event_offsets(self) -> np.ndarray: ...
    @property
    def edge_offsets(self) -> np.ndarray: ...
    @property
    def num_events(self) -> int: ...
    def __arrow_c_stream__(self, requested_schema: object | None = None) -> object: ...
    def events(self) -> object: ...
    def edges(self) -> object: ...
    def trace_field(self, name: str) -> object: ...
    def event_field(self, name: str) -> object: ...
    def event_ids_at(self, positions: np.ndarray) -> object: ...
    def trace_json(self, index: int, strict_seed: bool) -> str: ...
    def take(self, indices: Sequence[int]) -> TraceBatch: ...
    @staticmethod
    def restore(table: object) -> TraceBatch: ...
    @staticmethod
    def restore_validated(table: object) -> TraceBatch: ...
    @staticmethod
    def concat(batches: Sequence[TraceBatch]) -> TraceBatch: ...
    def write_parquet(self, path: str | PathLike[str]) -> None: ...

class TraceSelection:
    def __len__(self) -> int: ...
    @property
    def trace_ids(self) -> list[str]: ...
    @property
    def event_offsets(self) -> np.ndarray: ...
    @property
    def num_events(self) -> int: ...
    def event_field(self, name: str) -> object: ...
    def flat(self, name: str) -> tuple[object, np.ndarray]: ...
    def padded(self, name: str, pad: int | float) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """(values, mask, lengths) of a 64-bit number field without nulls; None otherwise."""
    def collect(self) -> TraceBatch: ...
    @staticmethod
    def of_batches(batches: Sequence[TraceBatch], sources: Sequence[int], rows: Sequence[int]) -> TraceSelection: ...

def parse_json(data: bytes, *, strict_seed: bool = False) -> tuple[TraceBatch, _Rejected]: ...
def parse_objects(objects: Sequence[object], *, strict_seed: bool = False) -> tuple[TraceBatch, _Rejected]: ...
def ingest_arrow(table: object) -> tuple[TraceBatch, _Rejected]: ...
def read_parquet(paths: Sequence[str | PathLike[str]]) -> tuple[TraceBatch, _Rejected]: ...
def empty_batch() -> TraceBatch: ...

class _SimShape(TypedDict):
    agents: tuple[int, int]
    depth: int
    fan_out: tuple[int, int]
    events_per_agent: tuple[int, int]
    group_size: int
    seed: int

def simulate(n_traces: int, shape: _SimShape) -> TraceBatch: ...

class GraphBuffer:
    def __init__(self, capacity: int, *, unit: Unit = "traces", seed: int = 0, max_staleness: int | None = None) -> None: ...
    def __len__(self) -> int: ...
    def __contains__(self, trace_id: str) -> bool: ...
    @property
    def policy_version(self) -> int: ...
    @policy_version.setter
    def policy_version(self, version: int) -> None: ...
    def advance(self, version: int) -> None: ...
    @property
    def max_staleness(self) -> int | None: ...
    def evict_stale(self, max_staleness: int | None = None) -> int: ...
    def eligible(
        self, *, min_events: int | None = None, max_events: int | None = None, max_staleness: int | None = None
    ) -> tuple[int, float]: ...
    def eligible_group_count(self, *, group_size: int | None = None, max_staleness: int | None = None) -> int: ...
    def contains_many(self, trace_ids: Sequence[str]) -> np.ndarray: ...
    @property
    def num_events(self) -> int: ...
    @property
    def nbytes(self) -> int: ...
    @property
    def num_groups(self) -> int: ...
    @property
    def capacity(self) -> int: ...
    @property
    def unit(self) -> Unit: ...
    @property
    def seed(self) -> int: ...
    def add(self, batch: TraceBatch, *, skip_invalid: bool = False) -> tuple[int, _Rejected]:
        """(traces added, refused): positions count within ``batch``; without skip_invalid
        the first refused trace raises and nothing is added."""
    def sample(
        self,
        batch_size: int,
        *,
        sampler: Sampler = "uniform",
        min_events: int | None = None,
        max_events: int | None = None,
        seed: int | None = None,
        with_branches: bool = False,
        max_staleness: int | None = None,
    ) -> tuple[TraceSelection, np.ndarray]:
        """(the draws, each draw's probability as float64; NaN for a branch that came with one)."""
    def sample_groups(
        self,
        num_groups: int,
        *,
        group_size: int | None = None,
        seed: int | None = None,
        max_staleness: int | None = None,
    ) -> TraceSelection: ...
    def update_priorities(self, trace_ids: Sequence[str], priorities: Sequence[float], *, skip_missing: bool = False) -> int: ...
    def priorities(self) -> np.ndarray: ...
    def to_batch(self) -> TraceBatch: ...
    def get(self, trace_id: str) -> TraceBatch: ...
    def branches(self, trace_id: str, event_id: str | None = None) -> TraceBatch: ...
    def ancestors(self, trace_id: str, event_id: str) -> list[str]: ...
    def descendants(self, trace_id: str, event_id: str) -> list[str]: ...
    def subgraph(self, trace_id: str, event_ids: Sequence[str]) -> TraceBatch: ...
    def agent_view(self, trace_id: str, agent: str) -> TraceBatch: ...
    def save(self, path: str | PathLike[str]) -> None: ...
    @staticmethod
    def load(path: str | PathLike[str]) -> GraphBuffer: ...
    def persisted(self) -> object:
        """An Arrow table: the traces, priorities and settings (in the schema metadata)."""
    @staticmethod
    def restore(table: object) -> GraphBuffer: ...

def route_to_shards(batch: TraceBatch, shards: int, known_ids: Sequence[str], known_shards: Sequence[int]) -> np.ndarray:
    """uint32 shard per trace; 2**32 - 1 for a branch whose factual trace is nowhere known."""

def metrics(batch: TraceBatch) -> object:
    """An Arrow table, one row per trace (see masreplay.orchestration.metrics)."""

def counterfactual_credit(batch: TraceBatch, *, channel: str, baseline: Baseline) -> _CreditArrays: ...
def same_prefix_credit_arrays(
    batch: TraceBatch, *, channel: str, signature: list[str] | None, importance_weighting: bool
) -> _CreditArrays: ...
def simulate_branches(
    n_traces: int,
    shape: _SimShape,
    *,
    branches: int,
    branch_points: int,
    noise: float,
) -> tuple[TraceBatch, list[tuple[str, str, str, float]], list[tuple[str, str, float]]]:
    """(factual traces and branches, (trace_id, event_id, kind, true effect) per branch point,
    (trace_id, agent, true value) per agent)."""

# ---- advantages (rust/masreplay-py/src/advantage.rs) ----
def group_normalize(
    values: np.ndarray,
    groups: np.ndarray,
    *,
    strata: np.ndarray | None = None,
    lengths: np.ndarray | None = None,
    mask: np.ndarray | None = None,
    estimator: Estimator = "grpo",
    std: Literal["group", "batch", "none"] = "group",
    eps: float | None = None,
    compat: Literal["native", "verl", "trl", "openrlhf"] | None = None,
    float32: bool = True,
    torch_threads: int = 1,
) -> np.ndarray:
    """One advantage per value, float32 (or float64 with float32=False)."""

def batch_advantages(
    batch: TraceBatch,
    trace_values: np.ndarray,
    groups: np.ndarray,
    *,
    credit: np.ndarray | None = None,
    normalize_by: Sequence[Stratum] = ...,
    unit: Unit = "traces",
    estimator: Estimator = "grpo",
    std: Literal["group", "batch", "none"] = "group",
    eps: float | None = None,
    compat: Literal["native", "verl", "trl", "openrlhf"] | None = None,
    weight_by: Sequence[Stratum] = ...,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(per trace, per event, loss weight per event) float64, and the trace of each event
    (int64); events as in batch.events()."""

def trace_channel(batch: TraceBatch, channel: str) -> np.ndarray:
    """float64 per trace; NaN where the trace has no such reward."""

def trace_text_codes(batch: TraceBatch, field: str) -> np.ndarray:
    """int64 per trace: the text field's codes 0.. in order of first appearance."""

def graph_returns(batch: TraceBatch, rewards: np.ndarray, *, gamma: float, kind: ReturnKind) -> np.ndarray:
    """float64 per event."""

def graph_gae(
    batch: TraceBatch, rewards: np.ndarray, values: np.ndarray, *, gamma: float, lam: float
) -> tuple[np.ndarray, np.ndarray]:
    """(advantages, returns), float64 per event."""

def torch_sqrt(values: np.ndarray, kernel: _SqrtKernel | None = None) -> tuple[np.ndarray, _SqrtKernel]:
    """(float32 roots, the kernel that computed them: the given one, or this CPU's)."""

# ---- Shapley credit ----------------------------------------------------------------------

class Game:
    @property
    def n_players(self) -> int: ...
    @property
    def kind(self) -> str: ...
    def values(self, masks: np.ndarray) -> np.ndarray: ...
    def shapley_values(self) -> np.ndarray | None: ...
    def banzhaf_values(self) -> np.ndarray | None: ...
    def terms(self) -> list[tuple[list[int], float]] | None: ...

def check_game_values(values: np.ndarray, function: str, whom: str) -> None: ...
def soum_game(n: int, terms: int | list[tuple[list[int], float]], max_order: int | None, seed: int) -> Game: ...
def dense_table_game(values: np.ndarray) -> Game: ...  # float64, contiguous
def sparse_table_game(n_players: int, entries: list[tuple[list[int], float]], default: float) -> Game: ...
def additive_game(weights: list[float]) -> Game: ...
def weighted_voting_game(weights: list[float], quota: float) -> Game: ...
def empirical_game(masks: np.ndarray, rewards: list[float], order: int) -> Game: ...
def shapley(
    game: object,
    n_players: int | None,
    method: ShapleyMethod,
    budget: int | None,
    target_stderr: float | None,
    seed: int,
    parents: list[int] | None,
    unions: list[object] | None,
    n_threads: int | None,
    antithetic: bool,
    chunk_size: int,
    fixed: list[int],
    exclude: list[int],
    canonical: object | None,
    noise: float | None,
    repeats: int | None,
    surrogate: ShapleySurrogate,
) -> _ShapleyDict: ...
def trace_players(batch: TraceBatch, players: str) -> tuple[np.ndarray, list[str], np.ndarray, np.ndarray]:
    """(offsets, labels, parents, event_player), as in trace_shapley's result."""

def trace_shapley(
    batch: TraceBatch,
    value_fn: object,
    players: str,
    respect_spawn_tree: bool,
    method: ShapleyMethod,
    budget: int | None,
    seed: int,
    n_threads: int | None,
    antithetic: bool,
    chunk_size: int,
    fixed: list[str],
    exclude: list[str],
    canonical: object | None,
    noise: float | None,
    repeats: int | None,
) -> _TraceShapleyDict: ...
def convert_claude_code(
    sources: list[tuple[str, str, bytes | list[dict[str, object]]]],
    *,
    folder: str | None = None,
    trace_id: str | None = None,
    task_id: str | None = None,
) -> tuple[TraceBatch, int, list[tuple[str, int]], list[tuple[str, int]], list[str]]:
    """(batch, records read, ignored counts, unknown counts, warnings) of a Claude Code session:
    (name, content-reference label, JSON Lines bytes or records) per source, main transcript
    first; raises ConversionError naming the file and line."""

def convert_marble(
    source: tuple[str, str, bytes | list[dict[str, object]]],
) -> tuple[TraceBatch, int, list[tuple[str, int]], list[tuple[str, int]], list[str]]:
    """(batch, records read, ignored counts, unknown counts, warnings) of MARBLE episodes:
    (name, content-reference label, JSON Lines bytes or records), one trace per episode;
    raises ConversionError naming the file and line."""

def convert_otel(
    name: str,
    document: object,
    *,
    text: bytes | None = None,
) -> tuple[TraceBatch, int, list[tuple[str, int]], list[tuple[str, int]], list[str]]:
    """(batch, spans read, ignored counts, unknown counts, warnings) of OpenTelemetry spans:
    ``text``, a file's bytes (one JSON document or JSON Lines of them), or else ``document``,
    the parsed objects; raises ConversionError naming the file and place."""
