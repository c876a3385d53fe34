"""masreplay.ray: a GraphBuffer sharded over Ray actors, for rollout workers on many processes
or machines and a trainer that samples (``pip install masreplay[ray]``).

Each shard is a Ray actor holding a :class:`~masreplay.GraphBuffer`. A trace goes to the shard
given by a stable hash of its group_id (a GRPO group lands whole in one shard) and a branch
rollout goes wherever its factual trace went (a branch family is never split). Traces cross
to the shards as compressed Arrow IPC streams (one buffer each: Ray would otherwise serialize
a table array by array). Sampling follows the rule of one GraphBuffer over the union of the
shards: per-shard counts are drawn multinomially from the shards' eligible counts (uniform) or
priority totals (prioritized), and each shard draws from its own seeded stream. A sample's
traces stay on the shards until the trainer reads them, and a read fetches only what it
reads (``flat("tokens")`` brings the token column of the drawn traces, nothing else).
"""

from __future__ import annotations

import contextlib
import hmac
import json
import logging
import os
import pathlib
import secrets
import tempfile
import uuid
import warnings
import weakref
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import ray  # the Ray package: imports are absolute, so this is never masreplay.ray itself

from masreplay import _core
from masreplay._args import I32_MAX, I64_MAX, checked, ids, numbers, optional_whole, real, whole
from masreplay.bands import band_limits
from masreplay.batch import TraceBatch, _check_event_field, _from_ipc_table
from masreplay.buffer import AddReport, GraphBuffer, Sampler
from masreplay.errors import DataFormatError, InvalidArgumentError, MasreplayError, StorageError
from masreplay.io import OnError, _load

__all__ = ["BufferWriter", "RayGraphBuffer", "ShardLoss", "ShardLossWarning"]

_UNRESOLVED = 2**32 - 1
_MANIFEST = "ray_buffer.json"
#: A shard's add log is emptied past this size, when its JSON ledger is next written.
_LOG_LIMIT = 1 << 20
#: Samples whose traces a shard keeps for the trainer to read (the oldest go first).
KEPT_SAMPLES = 1024
#: Most shards of one buffer: each is an actor (a process of its own) that every sample and
#: count calls. Ray's many-actors release benchmark launches 10,000 actors on a cluster;
#: beyond, a count of shards is a mistake, which would otherwise spend all memory or start
#: actors for hours before failing.
MAX_SHARDS = 10_000
_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ShardLoss:
    """What a shard lost when its actor died and Ray restarted it from its last save.

    ``lost_traces`` traces were added to the shard after that save and are gone;
    ``restored_traces`` came back from the save (None saved: 0); ``held_traces`` is what the
    shard held after its last add before it died."""

    shard: int
    restarts: int
    restored_traces: int
    lost_traces: int
    held_traces: int


class ShardLossWarning(UserWarning):
    """A shard was restarted and lost traces (see :meth:`RayGraphBuffer.losses`)."""


# On the calling thread: Arrow's pool would wake threads for a few hundred kilobytes (3x the
# CPU time, measured on a busy 2-core machine).
_WIRE = pa.ipc.IpcWriteOptions(compression="lz4", use_threads=False)
_WIRE_READ = pa.ipc.IpcReadOptions(use_threads=False)


def _to_wire(table: pa.Table) -> pa.Buffer:
    """A table as one LZ4-compressed Arrow IPC stream, for Ray to move as one buffer (it would
    serialize a table array by array). Traces hold many all-null columns whose buffers
    compress to almost nothing: a part of a few hundred kilobytes then stays below Ray's
    inline limit (100 KiB by default), which spares it the trip through the object store."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema, options=_WIRE) as writer:
        writer.write_table(table)
    return sink.getvalue()


def _from_wire(data: pa.Buffer) -> pa.Table:
    """A table written by _to_wire in another process (checked as any pickled state)."""
    return _from_ipc_table(data, _WIRE_READ, "a table from another process")


def _digest(key: bytes, data: pa.Buffer) -> bytes:
    """A keyed digest of a stream (HMAC-SHA256: 0.04 ms for a 64-trace stream here, keyed
    BLAKE2b 0.06): a shard that finds it right knows the stream comes from a handle of its
    buffer, which validated the traces before writing them."""
    return hmac.digest(key, memoryview(data), "sha256")


def _narrowed(values: np.ndarray) -> np.ndarray:
    """int64 values in the narrowest integer type that holds them all (token ids fit in 32
    bits): fewer bytes for Ray to move, widened back by the reader."""
    if values.dtype != np.int64 or not len(values):
        return values
    low, high = values.min(), values.max()
    for narrow in (np.int8, np.int16, np.int32):
        if np.iinfo(narrow).min <= low and high <= np.iinfo(narrow).max:
            return values.astype(narrow)
    return values


def _get(refs: Any) -> Any:
    """``ray.get`` of the handle's calls to its shards, with what a shard raised as the error
    itself (Ray wraps it in a RayTaskError whose message is the worker's traceback), and a
    shard that is gone for good (killed without restart, or past ``max_restarts``) as a
    StorageError. Each answer of a failed call is read, so Ray logs no error left unread."""
    try:
        return ray.get(refs)
    except (ray.exceptions.RayTaskError, ray.exceptions.RayActorError) as error:
        failed = error
    for ref in refs if isinstance(refs, list) else ():
        with contextlib.suppress(ray.exceptions.RayError):
            ray.get(ref)
    if isinstance(failed, ray.exceptions.RayActorError):
        raise StorageError(
            5,
            f"a shard of this RayGraphBuffer is gone (actor {failed.actor_id}): its actor died and Ray does not "
            "restart it (killed for good, or past max_restarts); the traces it held are lost, and "
            "RayGraphBuffer.load of the last save starts the buffer again",
        ) from None
    # Ray's wrapper also derives from the class of what it wraps: unwrap down to the error.
    cause: BaseException | None = failed
    for _ in range(8):  # an add's last shard reads the earlier shards' answers: two wrappers deep
        if not isinstance(cause, ray.exceptions.RayError):
            break
        cause = getattr(cause, "cause", None) or cause.__cause__
    if not isinstance(cause, MasreplayError):
        raise failed
    raise cause.with_traceback(None) from None


def _shard_seed(seed: int, shard: int) -> int:
    """Each shard's own stream: the same for the same (seed, shard) in every process."""
    return int(np.random.SeedSequence([seed, shard]).generate_state(1, np.uint64)[0])


def _with_logged_adds(ledger: dict[str, Any], log_path: pathlib.Path) -> dict[str, Any]:
    """The ledger with the adds its log recorded after it was written ("added held" lines)."""
    log = log_path.read_bytes() if log_path.exists() else b""
    start = ledger.get("log_bytes", 0) if len(log) >= ledger.get("log_bytes", 0) else 0
    lines = [line.split() for line in log[start:].splitlines() if len(line.split()) == 2]
    if not lines:
        return ledger
    added = ledger["added_since_save"] + sum(int(added) for added, _ in lines)
    return {**ledger, "added_since_save": added, "held": int(lines[-1][1])}


def _write_json(path: pathlib.Path, value: dict[str, Any]) -> None:
    """Replaces ``path`` atomically (a crash leaves the previous content)."""
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(value))
    os.replace(partial, path)


class _Shard:
    """One shard: a GraphBuffer and a ledger (its last save, what it took since) that lets a
    restarted actor resume from the save and say what it lost.

    The ledger is a JSON file, replaced atomically when the shard saves or changes version,
    and an append-only log with a line per add since (one small write instead of a file
    replaced per add); the JSON records how long the log was when it was written."""

    def __init__(
        self,
        shard: int,
        capacity: int,
        unit: str,
        seed: int,
        max_staleness: int | None,
        state_directory: str,
        restore_from: str | None,
        key: bytes,
    ) -> None:
        self.shard = shard
        self.key = key
        self.ledger_path = pathlib.Path(state_directory) / f"shard-{shard:05d}.json"
        self.ledger_path.parent.mkdir(parents=True, exist_ok=True)
        ledger = json.loads(self.ledger_path.read_text()) if self.ledger_path.exists() else None
        log_path = self.ledger_path.with_suffix(".adds")
        if ledger is not None:
            ledger = _with_logged_adds(ledger, log_path)
        self.log = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self.loss: ShardLoss | None = None
        if ledger is None:
            # First start: a fresh buffer, or a shard of a saved RayGraphBuffer.
            self.save_path = restore_from
            self.buffer = GraphBuffer.load(restore_from) if restore_from else None
            self.restarts = 0
        else:
            # The actor died and Ray runs __init__ again with the same arguments.
            self.save_path = ledger["save"]
            self.buffer = GraphBuffer.load(self.save_path) if self.save_path else None
            self.restarts = ledger["restarts"] + 1
            restored = 0 if self.buffer is None else len(self.buffer)
            self.loss = ShardLoss(shard, self.restarts, restored, ledger["added_since_save"], ledger["held"])
            _log.warning("masreplay.ray shard %d restarted: %s", shard, self.loss)
        if self.buffer is None:
            self.buffer = GraphBuffer(capacity, unit=unit, seed=seed, max_staleness=max_staleness)
        if ledger is not None:
            self.buffer.policy_version = max(self.buffer.policy_version, ledger["policy_version"])
        self.added_since_save = 0
        self.kept: OrderedDict[str, Any] = OrderedDict()
        self._write_ledger()

    def _write_ledger(self) -> None:
        ledger = {
            "save": self.save_path,
            "added_since_save": self.added_since_save,
            "held": len(self.buffer),
            "restarts": self.restarts,
            "policy_version": self.buffer.policy_version,
        }
        _write_json(self.ledger_path, {**ledger, "log_bytes": os.fstat(self.log).st_size})
        if os.fstat(self.log).st_size > _LOG_LIMIT:
            # Emptied after the JSON took its lines in; a reader finding the log shorter than
            # the JSON says knows this happened and reads it from the start.
            os.ftruncate(self.log, 0)
            _write_json(self.ledger_path, {**ledger, "log_bytes": 0})

    def add(
        self, data: pa.Buffer, digest: bytes = b"", counted: bool = False, earlier: Sequence[ray.ObjectRef] = ()
    ) -> int | tuple[int, list[tuple[int, str | None, Exception]]]:
        """Takes an Arrow IPC stream of traces: returns how many were added and the refused
        ones, or (``counted``) the count alone plus what the ``earlier`` calls of the same
        add_async counted, raising the first refusal after keeping the rest. Only the last
        shard of an add is given ``earlier`` and they all have lower numbers, so no shard ever
        waits on one that waits.

        A stream whose ``digest`` is right for this buffer's key was written by a handle that
        validated its traces: only its layout is checked. Any other is checked in full (bytes
        from another process), and one that fails leaves the shard as it was."""
        table = _from_wire(data)
        if digest and hmac.compare_digest(digest, _digest(self.key, data)):
            batch = _core.TraceBatch.restore_validated(table)
        else:
            batch = _core.TraceBatch.restore(table)
        added, rejected = self.buffer._core.add(batch, skip_invalid=True)
        self.added_since_save += added
        os.write(self.log, f"{added} {len(self.buffer)}\n".encode())
        if os.fstat(self.log).st_size > _LOG_LIMIT:
            # A shard that is never saved nor given a version would log for as long as it runs.
            self._write_ledger()
        if not counted:
            return added, rejected
        if rejected:
            raise rejected[0][2]
        return added + sum(ray.get(list(earlier)))

    def stats(self) -> tuple[int, int, int]:
        return len(self.buffer), self.buffer.num_events, self.restarts

    def eligible(self, filters: dict[str, Any]) -> tuple[int, float, int]:
        count, mass = self.buffer._core.eligible(**filters)
        return count, mass, self.restarts

    def eligible_groups(self, group_size: int | None, max_staleness: int | None) -> tuple[int, int]:
        count = self.buffer._core.eligible_group_count(group_size=group_size, max_staleness=max_staleness)
        return count, self.restarts

    # ---- samples kept here until the trainer reads them ------------------------------------
    def draw(
        self,
        key: str,
        count: int,
        sampler: str,
        filters: dict[str, Any],
        seed: int | None,
        with_branches: bool,
        columns: tuple[str, ...],
        column_rows: int | None,
        released: list[str],
    ) -> tuple[int, float, int, np.ndarray, np.ndarray, list[np.ndarray | pa.Buffer]]:
        """The shard's eligible count, priority mass and restarts, and (when anything is
        eligible) ``count`` draws kept under ``key``: their event counts, local
        probabilities and the per-event ``columns`` of the first ``column_rows`` draws
        (None: all) go back, the rest of their traces stays here until read. Samples the
        trainer dropped (``released``) are let go first."""
        self._release(released)
        eligible, mass = self.buffer._core.eligible(**filters)
        weight = eligible if sampler == "uniform" else mass
        if count == 0 or weight <= 0:
            return eligible, mass, self.restarts, np.zeros(0, np.int64), np.zeros(0), []
        selection, probabilities = self.buffer._core.sample(
            count, sampler=sampler, seed=seed, with_branches=with_branches, **filters
        )
        lengths = self._keep(key, selection)
        rows = None if column_rows is None else min(column_rows, len(lengths))
        values = [_column(selection, rows, column) for column in columns]
        return eligible, mass, self.restarts, lengths, probabilities, values

    def draw_groups(
        self,
        key: str,
        count: int,
        group_size: int | None,
        seed: int | None,
        max_staleness: int | None,
        released: list[str],
    ) -> np.ndarray:
        self._release(released)
        selection = self.buffer._core.sample_groups(count, group_size=group_size, seed=seed, max_staleness=max_staleness)
        return self._keep(key, selection)

    def _keep(self, key: str, selection: Any) -> np.ndarray:
        """Keeps a selection (it owns its chunks: later adds and evictions leave it as drawn)
        and returns its traces' event counts."""
        self.kept[key] = selection
        while len(self.kept) > KEPT_SAMPLES:
            self.kept.popitem(last=False)
        return np.diff(selection.event_offsets)

    def _kept(self, key: str) -> Any:
        if key not in self.kept:
            raise InvalidArgumentError(
                f"shard {self.shard} no longer holds this sample: it keeps the traces of its "
                f"{KEPT_SAMPLES} latest samples until read (or it restarted since the draw)"
            )
        return self.kept[key]

    def trace_ids(self, key: str, rows: int | None) -> pa.Array:
        return pa.array(self._kept(key).trace_ids[:rows], pa.string())

    def flat(self, key: str, rows: int | None, column: str) -> np.ndarray | pa.Buffer:
        return _column(self._kept(key), rows, column)

    def collect(self, key: str, rows: int | None) -> pa.Buffer:
        return _to_wire(pa.table(self._kept(key).collect()).slice(0, rows))

    def _release(self, keys: list[str]) -> None:
        for key in keys:
            self.kept.pop(key, None)

    def contains_many(self, trace_ids: list[str]) -> np.ndarray:
        return self.buffer._core.contains_many(trace_ids)

    def update_priorities(self, trace_ids: list[str], priorities: list[float]) -> int:
        return self.buffer._core.update_priorities(trace_ids, priorities, skip_missing=True)

    def set_policy_version(self, version: int, advance: bool) -> None:
        if advance:
            self.buffer.advance(version)
        else:
            self.buffer.policy_version = version
        self._write_ledger()

    def policy_version(self) -> int:
        return self.buffer.policy_version

    def evict_stale(self, max_staleness: int | None) -> int:
        removed = self.buffer.evict_stale(max_staleness)
        self._write_ledger()
        return removed

    def save(self, path: str) -> None:
        self.buffer.save(path)
        self.save_path = path
        self.added_since_save = 0
        self._write_ledger()

    def to_arrow(self) -> pa.Table:
        return self.buffer.to_arrow()

    def report(self) -> ShardLoss | None:
        return self.loss


def _column(selection: Any, rows: int | None, column: str) -> np.ndarray | pa.Buffer:
    """The first ``rows`` (None: all) traces' values of one per-event field: a numpy array
    (Ray moves it as one buffer) or, for other types, an Arrow IPC stream of one column."""
    values, offsets = selection.flat(column)
    end = int(offsets[len(offsets) - 1 if rows is None else rows])
    if isinstance(values, np.ndarray):
        return _narrowed(values[:end])
    return _to_wire(pa.table({column: pa.array(values).slice(0, end)}))


_ShardActor = ray.remote(_Shard)


class RayGraphBuffer:
    """A GraphBuffer split over ``shards`` Ray actors; this object is a handle (it pickles as
    one), usable from any Ray task or actor.

    ``capacity`` is split across the shards (each evicts its own oldest traces); ``shards`` is
    at most :data:`MAX_SHARDS`. Ray restarts a shard actor that dies (``max_restarts`` and
    ``max_task_retries``, 3 each unless ``actor_options`` say otherwise) from the shard's last
    :meth:`save`; what it took since is lost, and reported: by :meth:`losses` and a
    :class:`ShardLossWarning` on the next call that reads the shard's counts. A shard Ray does
    not restart (killed for good, or past its restarts) makes every call raise a
    :class:`~masreplay.errors.StorageError` saying so; :meth:`load` of the last save starts
    the buffer again. ``state_directory`` holds each shard's small ledger (the path of its
    last save, what it took since); in a cluster of several machines it, like the save
    directory, must be storage every node reaches. ``actor_options`` go to each shard's
    ``.options(...)``. Shards whose ``actor_options`` ask for more than any node of the
    cluster has (``num_cpus=64`` on a 2-CPU cluster) wait up to ``start_timeout`` seconds for
    the cluster to grow (an autoscaler adding a node), then raise
    :class:`~masreplay.errors.InvalidArgumentError` naming what they asked for.
    """

    def __init__(
        self,
        capacity: int,
        unit: Literal["traces", "events"] = "traces",
        shards: int = 1,
        seed: int = 0,
        max_staleness: int | None = None,
        *,
        state_directory: str | os.PathLike[str] | None = None,
        start_timeout: float = 120.0,
        **actor_options: Any,
    ) -> None:
        settings = _settings(capacity, unit, shards, seed, max_staleness)
        self._start(settings, state_directory, actor_options, [None] * settings["shards"], start_timeout)

    def _start(
        self,
        settings: dict[str, Any],
        state_directory: str | os.PathLike[str] | None,
        actor_options: dict[str, Any],
        restore_from: list[str | None],
        start_timeout: float,
    ) -> None:
        start_timeout = real("start_timeout", start_timeout, low=0.0)
        self._settings = settings
        directory = state_directory or os.path.join(tempfile.gettempdir(), "masreplay-ray", uuid.uuid4().hex)
        self._state_directory = os.fspath(directory)
        # A call that reaches a restarting shard waits for it (a retried add lands in the
        # restored buffer: the first attempt's effect died with the actor).
        options = {"max_restarts": 3, "max_task_retries": 3, **actor_options}
        capacity, shards = settings["capacity"], settings["shards"]
        # The shards trust a stream only with this buffer's digest (see _Shard.add); the key
        # travels with the handle, whose adds validate before they write.
        self._key = secrets.token_bytes(32)
        self._shards = [
            _ShardActor.options(**options).remote(
                shard,
                capacity // shards + (shard < capacity % shards),
                settings["unit"],
                _shard_seed(settings["seed"], shard),
                settings["max_staleness"],
                self._state_directory,
                restore_from[shard],
                self._key,
            )
            for shard in range(shards)
        ]
        self._await_placement(options, start_timeout)
        self._calls = 0
        self._restarts_seen = [0] * shards
        # Each shard's share of the previous sample's weights, and keys of samples the
        # trainer dropped (their shards let them go on the next draw).
        self._shares: np.ndarray | None = None
        self._released: list[str] = []

    def _await_placement(self, options: dict[str, Any], start_timeout: float) -> None:
        """Ray holds an actor that fits no node until one joins, forever on a fixed cluster,
        and every call to it waits as long: shards no node can hold now get ``start_timeout``
        seconds to start, then are ended with an error naming what they asked for."""
        request = _unplaceable(options)
        if request is None:
            return
        _, waiting = ray.wait(
            [shard.stats.remote() for shard in self._shards], num_returns=len(self._shards), timeout=start_timeout
        )
        if waiting:
            self.shutdown()
            nodes = [node["Resources"] for node in ray.nodes() if node["Alive"]]
            raise InvalidArgumentError(
                f"each shard asks for {request} (actor_options), which no node of this Ray cluster has "
                f"(its nodes: {nodes}), and none joined within start_timeout={start_timeout} s"
            )

    # ---- what the handle knows ---------------------------------------------------------
    @property
    def shards(self) -> int:
        return self._settings["shards"]

    @property
    def capacity(self) -> int:
        return self._settings["capacity"]

    @property
    def unit(self) -> str:
        return self._settings["unit"]

    @property
    def max_staleness(self) -> int | None:
        return self._settings["max_staleness"]

    def __repr__(self) -> str:
        return f"RayGraphBuffer({self.shards} shards, capacity {self.capacity} {self.unit})"

    def _note_restarts(self, restarts: list[int]) -> None:
        """Warns once per restart a call notices (a restart is never silent)."""
        if any(now > seen for now, seen in zip(restarts, self._restarts_seen, strict=True)):
            for loss in self.losses():
                if loss.restarts > self._restarts_seen[loss.shard]:
                    warnings.warn(ShardLossWarning(f"masreplay.ray shard restarted: {loss}"), stacklevel=3)
            self._restarts_seen = [max(a, b) for a, b in zip(restarts, self._restarts_seen, strict=True)]

    def losses(self) -> list[ShardLoss]:
        """What each restarted shard lost at its latest restart."""
        reports = _get([shard.report.remote() for shard in self._shards])
        return [report for report in reports if report is not None]

    def _stats(self) -> list[tuple[int, int, int]]:
        stats = _get([shard.stats.remote() for shard in self._shards])
        self._note_restarts([restarts for _, _, restarts in stats])
        return stats

    def __len__(self) -> int:
        return sum(length for length, _, _ in self._stats())

    @property
    def num_events(self) -> int:
        return sum(events for _, events, _ in self._stats())

    # ---- adding ------------------------------------------------------------------------
    def _route(self, batch: Any, settle: Callable[[], Any] | None = None) -> np.ndarray:
        """Each trace's shard; a branch whose factual trace was added earlier is sent where
        the shards say that trace is (after ``settle``, which lands what the caller still
        holds, so that the shards know every earlier trace)."""
        routes = _core.route_to_shards(batch, self.shards, [], [])
        unresolved = np.flatnonzero(routes == _UNRESOLVED)
        if len(unresolved) == 0:
            return routes
        if settle is not None:
            settle()
        of = pa.table(batch).column("counterfactual_of").take(pa.array(unresolved))
        factual_ids = pc.unique(pc.struct_field(of, "trace_id")).to_pylist()
        held = _get([shard.contains_many.remote(factual_ids) for shard in self._shards])
        owner = np.argmax(np.stack(held), axis=0)
        found = np.stack(held).any(axis=0)
        known_ids = [t for t, ok in zip(factual_ids, found, strict=True) if ok]
        routes = _core.route_to_shards(batch, self.shards, known_ids, owner[found].tolist())
        # A branch of a trace no shard holds: shard 0 refuses it with the buffer's own error.
        routes[routes == _UNRESOLVED] = 0
        return routes

    def _validated(self, traces: Any, on_error: OnError) -> tuple[Any, list]:
        """``traces`` checked here and ingested (a canonical batch) and the load's rejections;
        ``on_error="raise"`` raises the first before anything is sent."""
        if on_error not in ("raise", "skip"):
            raise InvalidArgumentError(f"on_error must be 'raise' or 'skip', not {on_error!r}")
        batch, load_rejected = _load(traces, strict_seed=False)
        if load_rejected and on_error == "raise":
            raise load_rejected[0][2]
        return batch, load_rejected

    def _parts(self, batch: Any, settle: Callable[[], Any] | None = None) -> list[tuple[int, pa.Table, np.ndarray]]:
        """Each shard's part of a validated batch, by shard number: (shard, its traces as a
        canonical table, their positions in the batch); see _route for ``settle``."""
        routes = self._route(batch, settle)
        # One copy puts each shard's traces next to each other; each part is then a slice.
        order = np.argsort(routes, kind="stable")
        table = pa.table(batch if np.array_equal(order, np.arange(len(order))) else batch.take(order.tolist()))
        shards, starts, sizes = np.unique(routes[order], return_index=True, return_counts=True)
        return [
            (int(shard), table.slice(start, size), order[start : start + size])
            for shard, start, size in zip(shards, starts, sizes, strict=True)
        ]

    def _send(self, shard: int, table: pa.Table, *args: Any) -> ray.ObjectRef:
        """Sends validated canonical traces to a shard, with the digest that spares it their
        second validation."""
        data = _to_wire(table)
        return self._shards[shard].add.remote(data, _digest(self._key, data), *args)

    def add(self, traces: Any, *, on_error: OnError = "raise") -> int | AddReport:
        """Validates ``traces`` here (anything ``masreplay.load_traces`` accepts) and sends
        each shard its part as one Arrow IPC stream. ``on_error="raise"``: an invalid trace raises
        before anything is sent; a trace a shard refuses (an id it already stores, a branch
        whose factual trace is gone) raises after the other shards took their parts.
        ``on_error="skip"``: returns an AddReport as GraphBuffer.add does."""
        batch, load_rejected = self._validated(traces, on_error)
        parts = self._parts(batch)
        answers = _get([self._send(shard, part) for shard, part, _ in parts])
        return _report(answers, [rows for _, _, rows in parts], load_rejected, on_error)

    def add_async(self, traces: Any) -> ray.ObjectRef:
        """As ``add`` (validated here, raising before anything is sent), without waiting for
        the shards: returns an ObjectRef of the number of traces added (``ray.get`` raises if
        a shard refused one). The last shard of the add answers for all (no task of its own)."""
        batch, _ = self._validated(traces, "raise")
        parts = self._parts(batch)
        if not parts:
            return ray.put(0)
        earlier = [self._send(shard, part, True) for shard, part, _ in parts[:-1]]
        last, part, _ = parts[-1]
        return self._send(last, part, True, earlier)

    def writer(self, *, flush_traces: int = 1, max_in_flight: int = 8, on_error: OnError = "raise") -> BufferWriter:
        """A writer for a rollout worker's stream of adds (see :class:`BufferWriter`): use it
        as a context manager, which flushes on exit, error or not."""
        return BufferWriter(self, flush_traces=flush_traces, max_in_flight=max_in_flight, on_error=on_error)

    # ---- sampling ----------------------------------------------------------------------
    def _rng(self, seed: int | None) -> tuple[np.random.Generator, list[int | None]]:
        """The handle's stream for this call, and the seed each shard draws with (None: the
        shard's own stream)."""
        if seed is None:
            self._calls += 1
            return np.random.default_rng([self._settings["seed"], self._calls]), [None] * self.shards
        seed = whole("seed", seed)
        return np.random.default_rng([seed, 2**32]), [_shard_seed(seed, s) for s in range(self.shards)]

    def sample(
        self,
        batch_size: int,
        *,
        sampler: Sampler = "uniform",
        seed: int | None = None,
        min_events: int | None = None,
        max_events: int | None = None,
        band: int | None = None,
        with_branches: bool = False,
        max_staleness: int | None = None,
        columns: Sequence[str] = (),
    ) -> TraceBatch:
        """Draws ``batch_size`` traces with replacement from all shards, with the probability
        rule of :meth:`GraphBuffer.sample` over the union (uniform over every eligible trace,
        or in proportion to priority over every shard). The draws come in random order, then
        the branch rollouts of ``with_branches``; ``probabilities`` are global.

        The traces stay on the shards until read: ``flat``/``padded`` of one column fetch that
        column alone, ``to_arrow``/``events``/``edges`` the whole traces (each shard keeps
        the traces of its latest 1,024 samples; a sample the trainer drops is let go with the
        next draw). Without branches this takes one round trip to the shards: each draws
        ``batch_size`` traces with its own stream and says how many it holds (or its
        priority total), and the handle takes the first ``counts[s]`` of shard s's draws for
        multinomial counts over those totals, which is the global rule exactly (the first k
        of iid draws are k iid draws). With branches (which follow their draws) the counts
        are drawn first, in a round trip of their own.

        ``columns`` names per-event fields the trainer will read (``flat``, ``padded``):
        the shards send them with the draws, so ``sample(n, columns=["tokens"]).flat("tokens")``
        is one round trip (without branches); other fields are fetched when read."""
        if sampler not in ("uniform", "prioritized"):
            raise InvalidArgumentError(f"sampler must be 'uniform' or 'prioritized', not {sampler!r}")
        batch_size = whole("batch_size", batch_size, high=I32_MAX)
        if band is not None:
            min_events, max_events = band_limits(band)
        filters = {
            "min_events": optional_whole("min_events", min_events),
            "max_events": optional_whole("max_events", max_events),
            "max_staleness": optional_whole("max_staleness", max_staleness),
        }
        columns = tuple(columns)
        for column in columns:
            _check_event_field(column)
        rng, seeds = self._rng(seed)
        keys = _keys(self.shards)
        if with_branches:
            eligible = _get([shard.eligible.remote(filters) for shard in self._shards])
            weights = self._sample_weights(eligible, sampler, filters)
            counts = rng.multinomial(batch_size, weights / weights.sum())
            asked, column_rows = counts, [None] * self.shards
        else:
            asked, column_rows = [batch_size] * self.shards, self._likely_counts(batch_size)
        released = self._take_released()
        answers = _get(
            [
                shard.draw.remote(
                    keys[s], int(asked[s]), sampler, filters, seeds[s], with_branches, columns, column_rows[s], released
                )
                for s, shard in enumerate(self._shards)
            ]
        )
        if not with_branches:
            weights = self._sample_weights([answer[:3] for answer in answers], sampler, filters)
            counts = rng.multinomial(batch_size, weights / weights.sum())
            self._shares = weights / weights.sum()
            # A shard that sent too few draws' columns: they are all fetched when read.
            short = any(rows is not None and rows < count for rows, count in zip(column_rows, counts, strict=True))
        else:
            short = False
        parts, lengths, draws, branches, probabilities = [], [], [], [], []
        sent: dict[str, list[np.ndarray | pa.Array]] = {column: [] for column in columns if not short}
        start = 0
        for s, (_, _, _, local_lengths, local, values) in enumerate(answers):
            if len(local) == 0:
                continue
            if counts[s] == 0:  # drew, but the multinomial took none of its draws
                self._released.append(keys[s])
                continue
            kept = len(local) if with_branches else int(counts[s])
            parts.append((self._shards[s], keys[s], None if with_branches else kept))
            lengths.append(local_lengths[:kept])
            draws.append(np.arange(start, start + counts[s]))
            branches.append(np.arange(start + counts[s], start + kept))
            # Local probability times the shard's share of the whole gives the global one.
            probabilities.append(local[:kept] * (weights[s] / weights.sum()))
            events = int(local_lengths[:kept].sum())
            if not short:
                for column, part in zip(columns, values, strict=True):
                    sent[column].append(_decoded(part)[:events])
            start += kept
        none = np.zeros(0, np.int64)
        order = np.concatenate([rng.permutation(np.concatenate([none, *draws])), *branches]).astype(np.int64)
        selection = _ShardSample(parts, np.concatenate([none, *lengths]), order, self._released, sent)
        return TraceBatch(selection, probabilities=np.concatenate([none * 0.0, *probabilities])[order])

    def _likely_counts(self, batch_size: int) -> list[int | None]:
        """How many draws' columns each shard sends with them: its count in the multinomial
        exceeds this with probability below 1e-4 at the shares of the previous sample (all
        on the first). Sending each shard's whole ``batch_size`` would multiply the bytes by
        the number of shards, and a few more kilobytes take Ray's slow path (see _to_wire)."""
        if self._shares is None:
            return [None] * self.shards
        spread = 4 * np.sqrt(batch_size * self._shares * (1 - self._shares))
        return [int(rows) for rows in np.minimum(batch_size, np.ceil(batch_size * self._shares + spread) + 8)]

    def _take_released(self) -> list[str]:
        """Keys of samples garbage-collected since the last call (sent with the next draw)."""
        taken = []
        while self._released:
            taken.append(self._released.pop())
        return taken

    def _sample_weights(self, eligible: list[tuple[int, float, int]], sampler: str, filters: dict) -> np.ndarray:
        """Each shard's weight in the multinomial (eligible count or priority total)."""
        self._note_restarts([restarts for _, _, restarts in eligible])
        weights = np.array([count if sampler == "uniform" else mass for count, mass, _ in eligible], dtype=float)
        if weights.sum() <= 0:
            what = "trace" if sampler == "uniform" or not any(c for c, _, _ in eligible) else "trace of priority > 0"
            raise InvalidArgumentError(f"no stored {what} is eligible for this sample (filters {filters})")
        return weights

    def sample_groups(
        self,
        num_groups: int,
        *,
        group_size: int | None = None,
        seed: int | None = None,
        max_staleness: int | None = None,
    ) -> TraceBatch:
        """Draws ``num_groups`` distinct groups uniformly over all shards (a group lives whole
        in one shard), as :meth:`GraphBuffer.sample_groups`; groups come shard by shard, and
        their traces stay on the shards until read (as :meth:`sample`'s)."""
        num_groups = whole("num_groups", num_groups, high=I32_MAX)
        group_size = optional_whole("group_size", group_size)
        max_staleness = optional_whole("max_staleness", max_staleness)
        answers = _get([shard.eligible_groups.remote(group_size, max_staleness) for shard in self._shards])
        self._note_restarts([restarts for _, restarts in answers])
        available = np.array([count for count, _ in answers], dtype=np.int64)
        if available.sum() < num_groups:
            raise InvalidArgumentError(f"asked for {num_groups} groups but the shards hold {available.sum()} eligible group(s)")
        rng, seeds = self._rng(seed)
        counts = rng.multivariate_hypergeometric(available, num_groups) if num_groups else available * 0
        drawing = [s for s in range(self.shards) if counts[s] > 0]
        keys, released = _keys(self.shards), self._take_released()
        lengths = _get(
            [
                self._shards[s].draw_groups.remote(keys[s], int(counts[s]), group_size, seeds[s], max_staleness, released)
                for s in drawing
            ]
        )
        parts = [(self._shards[s], keys[s], None) for s in drawing]
        lengths = np.concatenate(lengths) if lengths else np.zeros(0, np.int64)
        return TraceBatch(_ShardSample(parts, lengths, None, self._released))

    @checked
    def update_priorities(self, trace_ids: Any, priorities: Any, *, missing: OnError = "raise") -> int:
        """Sets priorities of stored traces on whichever shards hold them and returns how many
        it set; with ``missing="raise"`` all or nothing (an id no shard holds raises before
        any priority changes), with ``missing="skip"`` the ids no shard holds any more are
        left out. An id every shard is asked about at once and found, then evicted by a
        producer's add before its shard applies the update, counts as updated just before
        that eviction (nothing raises halfway: its priority went with the trace)."""
        keys = ids("trace_ids", trace_ids)
        values = numbers("priorities", priorities).ravel()
        if len(values) != len(keys):
            raise InvalidArgumentError(f"{len(keys)} trace ids but {len(values)} priorities: give one per trace")
        # Every shard's own check, before any shard changes: a priority one shard refused
        # after another applied its part would leave the update half done.
        if not np.all((values >= 0) & (values <= _core.MAX_PRIORITY)):
            bad = values[~((values >= 0) & (values <= _core.MAX_PRIORITY))][0]
            raise InvalidArgumentError(f"{bad} is not a priority; priorities are finite numbers from 0 to {_core.MAX_PRIORITY:e}")
        held = np.stack(_get([shard.contains_many.remote(keys) for shard in self._shards]))
        absent = np.flatnonzero(~held.any(axis=0))
        if len(absent) and missing == "raise":
            raise InvalidArgumentError(f"no trace {keys[absent[0]]!r} in the buffer")
        owner = np.where(held.any(axis=0), np.argmax(held, axis=0), -1)
        # The shards skip in both modes: the check above is the update's moment, and a raise
        # here, after other shards applied their parts, would leave the update half done.
        return sum(
            _get(
                [
                    self._shards[s].update_priorities.remote([keys[i] for i in rows], values[rows].tolist())
                    for s in np.unique(owner[owner >= 0])
                    for rows in [np.flatnonzero(owner == s)]
                ]
            )
        )

    # ---- staleness ---------------------------------------------------------------------
    @property
    def policy_version(self) -> int:
        return max(_get([shard.policy_version.remote() for shard in self._shards]))

    @policy_version.setter
    def policy_version(self, version: int) -> None:
        version = whole("policy_version", version, high=I64_MAX)
        _get([shard.set_policy_version.remote(version, False) for shard in self._shards])

    def advance(self, version: int) -> None:
        """Moves every shard's policy version forward to ``version``."""
        version = whole("policy_version", version, high=I64_MAX)
        _get([shard.set_policy_version.remote(version, True) for shard in self._shards])

    def evict_stale(self, max_staleness: int | None = None) -> int:
        """As :meth:`GraphBuffer.evict_stale`, on every shard; returns how many traces left."""
        max_staleness = optional_whole("max_staleness", max_staleness)
        return sum(_get([shard.evict_stale.remote(max_staleness) for shard in self._shards]))

    def to_arrow(self) -> pa.Table:
        """Every stored trace as the canonical table, shard by shard, each in insertion order."""
        return pa.concat_tables(_get([shard.to_arrow.remote() for shard in self._shards]))

    # ---- persistence -------------------------------------------------------------------
    def save(self, directory: str | os.PathLike[str]) -> None:
        """Saves every shard to its own Parquet file in a new snapshot folder of
        ``directory``, then points ``ray_buffer.json`` at it (replaced atomically) and removes
        the previous snapshot: a save killed at any moment leaves the previous one loadable."""
        directory = pathlib.Path(directory)
        previous = _read_manifest(directory) if (directory / _MANIFEST).exists() else None
        snapshot = f"snapshot-{uuid.uuid4().hex}"
        try:
            (directory / snapshot).mkdir(parents=True)
        except OSError as error:  # a file in the way, or no permission
            raise StorageError(error.errno, f"cannot save a RayGraphBuffer here ({error.strerror})", error.filename) from None
        files = [f"shard-{s:05d}-of-{self.shards:05d}.parquet" for s in range(self.shards)]
        _get(
            [
                shard.save.remote(os.fspath((directory / snapshot / name).resolve()))
                for shard, name in zip(self._shards, files, strict=True)
            ]
        )
        _write_json(directory / _MANIFEST, {**self._settings, "snapshot": snapshot, "files": files})
        if previous is not None:
            for name in previous["files"]:
                (directory / previous["snapshot"] / name).unlink(missing_ok=True)
            (directory / previous["snapshot"]).rmdir()

    @classmethod
    def load(
        cls,
        directory: str | os.PathLike[str],
        *,
        state_directory: str | os.PathLike[str] | None = None,
        start_timeout: float = 120.0,
        **actor_options: Any,
    ) -> RayGraphBuffer:
        """Starts shard actors from a directory written by :meth:`save`."""
        directory = pathlib.Path(directory)
        manifest = _read_manifest(directory)
        buffer = cls.__new__(cls)
        buffer._start(manifest["settings"], state_directory, actor_options, manifest["paths"], start_timeout)
        return buffer

    def shutdown(self) -> None:
        """Ends the shard actors (the handle is unusable afterwards)."""
        for shard in self._shards:
            ray.kill(shard, no_restart=True)


def _unplaceable(options: dict[str, Any]) -> dict[str, float] | None:
    """What one shard asks the scheduler for when no live node has that much in total (Ray
    places an actor with 1 CPU unless told otherwise); None when some node has it, or when
    a scheduling strategy or placement group decides where shards go."""
    if options.get("scheduling_strategy") is not None or options.get("placement_group") is not None:
        return None
    asked = {"CPU": options.get("num_cpus", 1), "GPU": options.get("num_gpus", 0), "memory": options.get("memory", 0)}
    asked.update(options.get("resources") or {})
    request = {name: amount for name, amount in asked.items() if amount}
    nodes = [node["Resources"] for node in ray.nodes() if node["Alive"]]
    if any(all(node.get(name, 0) >= amount for name, amount in request.items()) for node in nodes):
        return None
    return request


def _settings(capacity: Any, unit: Any, shards: Any, seed: Any, max_staleness: Any) -> dict[str, Any]:
    """A buffer's settings, each checked (given to the constructor, or read from a save)."""
    shards = whole("shards", shards, low=1, high=MAX_SHARDS)
    capacity = whole("capacity", capacity)
    if capacity < shards:
        raise InvalidArgumentError(f"capacity must be at least one per shard ({shards}), got {capacity}")
    if unit not in ("traces", "events"):
        raise InvalidArgumentError(f"unit must be 'traces' or 'events', not {unit!r}")
    return {
        "capacity": capacity,
        "unit": unit,
        "shards": shards,
        "seed": whole("seed", seed),
        "max_staleness": optional_whole("max_staleness", max_staleness),
    }


def _report(
    answers: list[tuple[int, list]], positions: list[np.ndarray], load_rejected: list, on_error: OnError
) -> int | AddReport:
    """What one add landed, from the shards' answers to its parts (``positions``: each part's
    traces in the validated batch): the count (``on_error="raise"``: the first refusal
    raises), or an AddReport with every rejection at its position in the input."""
    if on_error == "raise":
        for _, problems in answers:
            if problems:
                raise problems[0][2]
        return sum(added for added, _ in answers)
    # Positions in the validated batch, then in the input (past the load's rejections).
    load_positions = {position for position, _, _ in load_rejected}
    accepted = [p for p in range(sum(map(len, positions)) + len(load_rejected)) if p not in load_positions]
    rejected = list(load_rejected)
    for rows, (_, problems) in zip(positions, answers, strict=True):
        rejected += [(accepted[rows[k]], trace_id, error) for k, trace_id, error in problems]
    return AddReport(sum(added for added, _ in answers), sorted(rejected, key=lambda r: r[0]))


class BufferWriter:
    """A rollout worker's adds to a :class:`RayGraphBuffer`, gathered per shard and sent
    without waiting for the shards after each one (from :meth:`RayGraphBuffer.writer`)::

        with buffer.writer(flush_traces=256) as writer:
            for rollouts in produce():
                writer.add(rollouts)
        writer.added  # every trace has landed here

    ``add`` validates its traces at once (an invalid one raises there, or is set aside in
    ``rejected`` with ``on_error="skip"``) and routes them; each shard's traces are held until
    ``flush_traces`` of them are waiting, then go as one call, and the writer goes on without
    waiting for the answer. Each call thus carries at least ``flush_traces`` traces whatever
    the number of shards (an add of 64 traces into 2 shards with ``flush_traces=64`` makes one
    call per add on average, not two). At most ``max_in_flight`` calls stay unanswered: past
    that, the writer waits for the oldest (so a fast worker cannot pile work up in the shards'
    queues). ``flush()`` sends what is held and waits for every answer; leaving the ``with``
    block flushes too, also when an exception leaves it (what was validated is never dropped).
    An add with a branch whose factual trace came before flushes first, so that the branch
    goes where its factual went. A trace a shard refuses (an id it already stores, a branch
    whose factual trace is gone) raises at the next wait once every answer up to there is
    counted (``on_error="raise"``), or goes to ``rejected``. A writer used without ``with``
    must be closed (``close()``): held traces are sent only by a flush."""

    def __init__(self, buffer: RayGraphBuffer, *, flush_traces: int, max_in_flight: int, on_error: OnError) -> None:
        if on_error not in ("raise", "skip"):
            raise InvalidArgumentError(f"on_error must be 'raise' or 'skip', not {on_error!r}")
        flush_traces, max_in_flight = whole("flush_traces", flush_traces, low=1), whole("max_in_flight", max_in_flight, low=1)
        self.flush_traces, self.max_in_flight, self.on_error = flush_traces, max_in_flight, on_error
        self._buffer = buffer
        # Per shard: validated canonical tables not sent yet.
        self._held: list[list[pa.Table]] = [[] for _ in range(buffer.shards)]
        self._in_flight: deque[tuple[ray.ObjectRef, int]] = deque()  # (answer, traces sent)
        #: Traces the shards have taken (answers received so far).
        self.added = 0
        #: (trace_id, error) of every trace set aside (``on_error="skip"``).
        self.rejected: list[tuple[str | None, Exception]] = []
        self._refused: list[tuple[str | None, Exception]] = []  # answered, not yet raised
        self._closed = False

    @property
    def pending(self) -> int:
        """Traces validated but not yet taken by a shard (held here, or sent and unanswered)."""
        held = sum(table.num_rows for tables in self._held for table in tables)
        return held + sum(traces for _, traces in self._in_flight)

    def add(self, traces: Any) -> int:
        """Validates ``traces`` (anything ``masreplay.load_traces`` accepts) and queues them;
        returns how many were accepted here."""
        if self._closed:
            raise InvalidArgumentError("this BufferWriter is closed")
        batch, load_rejected = self._buffer._validated(traces, self.on_error)
        self.rejected += [(trace_id, error) for _, trace_id, error in load_rejected]
        for shard, part, _ in self._buffer._parts(batch, settle=self._settle):
            held = self._held[shard]
            held.append(part)
            if sum(table.num_rows for table in held) >= self.flush_traces:
                self._send(shard)
        self._wait(self.max_in_flight)
        self._raise_refused()
        return len(batch)

    def flush(self) -> int:
        """Sends the held traces and waits for every shard's answer; returns ``added``."""
        self._settle()
        self._raise_refused()
        return self.added

    def _settle(self) -> None:
        for shard in range(len(self._held)):
            self._send(shard)
        self._wait(0)

    def close(self) -> int:
        """Flushes, then refuses further adds; returns ``added``."""
        self._closed = True
        return self.flush()

    def __enter__(self) -> BufferWriter:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _send(self, shard: int) -> None:
        held, self._held[shard] = self._held[shard], []
        if held:
            table = pa.concat_tables(held)  # chunks side by side: the stream holds one batch each
            self._in_flight.append((self._buffer._send(shard, table), table.num_rows))

    def _wait(self, limit: int) -> None:
        """Takes answers, oldest first, until at most ``limit`` calls are unanswered."""
        while len(self._in_flight) > limit:
            answer, _ = self._in_flight.popleft()
            added, problems = _get(answer)
            self.added += added
            self._refused += [(trace_id, error) for _, trace_id, error in problems]

    def _raise_refused(self) -> None:
        """Raises the first refusal answered so far (``on_error="raise"``), or records them."""
        refused, self._refused = self._refused, []
        if refused and self.on_error == "raise":
            raise refused[0][1]
        self.rejected += refused


def _read_manifest(directory: pathlib.Path) -> dict[str, Any]:
    try:
        manifest = json.loads((directory / _MANIFEST).read_text())
    except OSError as error:
        raise StorageError(error.errno, f"not a saved RayGraphBuffer: {error.strerror}", os.fspath(directory)) from error
    except ValueError as error:
        raise StorageError(f"not a saved RayGraphBuffer ({directory / _MANIFEST}): {error}") from error
    if not isinstance(manifest, dict) or len(manifest.get("files", ())) != manifest.get("shards"):
        raise StorageError(f"not a saved RayGraphBuffer: {directory / _MANIFEST} lists no shard files")
    # Checked as the constructor's arguments are: the file may come from anywhere.
    try:
        settings = _settings(*(manifest.get(key) for key in ("capacity", "unit", "shards", "seed", "max_staleness")))
        names = [manifest.get("snapshot"), *manifest["files"]]
        if not all(
            isinstance(name, str) and name not in ("", os.curdir, os.pardir) and pathlib.PurePath(name).name == name
            for name in names
        ):
            raise InvalidArgumentError(f"the snapshot and its files must be names inside {directory}, got {names}")
        paths = [os.fspath((directory / manifest["snapshot"] / name).resolve()) for name in manifest["files"]]
    except (InvalidArgumentError, TypeError) as error:
        raise StorageError(f"not a saved RayGraphBuffer: {directory / _MANIFEST}: {error}") from None
    return {**manifest, "settings": settings, "paths": paths}


class _ShardSample:
    """A sample whose traces stay on the shards that drew them, read column by column: it
    answers what TraceBatch asks of a buffer's selection (``flat``, ``event_field``,
    ``collect``, shape), fetching only what is read, one call per shard, all at once.

    ``parts`` are (shard actor, the key its draws are kept under, how many leading traces
    of them belong to the sample, None: all); ``order`` puts the parts' traces,
    concatenated, in sample order."""

    def __init__(
        self,
        parts: list[tuple[Any, str, int | None]],
        lengths: np.ndarray,
        order: np.ndarray | None,
        released: list[str],
        sent: dict[str, list[np.ndarray | pa.Array]] | None = None,
    ):
        self._parts = parts
        # Per-event fields already here, by part (sent with the draws, or fetched once).
        self._columns = dict(sent or {})
        self._order = np.arange(len(lengths)) if order is None else order
        self._lengths = lengths.astype(np.int64)
        self._offsets = np.zeros(len(self._order) + 1, np.int64)
        np.cumsum(self._lengths[self._order], out=self._offsets[1:])
        self._ids: list[str] | None = None
        # A sample nobody can read any more frees its traces on the shards (on the handle's
        # next draw: a call of its own per sample would cost the shards as much as the draw).
        weakref.finalize(self, released.extend, [key for _, key, _ in parts]).atexit = False

    def _fetch(self, method: str, *args: Any) -> list[Any]:
        return _get([getattr(shard, method).remote(key, rows, *args) for shard, key, rows in self._parts])

    def __len__(self) -> int:
        return len(self._order)

    @property
    def trace_ids(self) -> list[str]:
        if self._ids is None:
            ids = pa.concat_arrays(self._fetch("trace_ids")) if self._parts else pa.array([], pa.string())
            self._ids = ids.take(pa.array(self._order)).to_pylist()
        return list(self._ids)

    @property
    def event_offsets(self) -> np.ndarray:
        return self._offsets.copy()

    @property
    def num_events(self) -> int:
        return int(self._offsets[-1])

    def _event_order(self) -> np.ndarray | None:
        """Where each event of the sample sits in the parts' events concatenated (None: in
        place, the sample is the parts in their order)."""
        if np.array_equal(self._order, np.arange(len(self._order))):
            return None
        starts = np.zeros(len(self._lengths), np.int64)
        np.cumsum(self._lengths[:-1], out=starts[1:])
        shift = starts[self._order] - self._offsets[:-1]
        return np.repeat(shift, self._lengths[self._order]) + np.arange(self.num_events)

    def flat(self, column: str) -> tuple[np.ndarray | pa.Array, np.ndarray]:
        _check_event_field(column)
        if column not in self._columns:
            self._columns[column] = [_decoded(answer) for answer in self._fetch("flat", column)]
        parts = self._columns[column]
        if not parts:
            return pa.array(_core.empty_batch().event_field(column)), self.event_offsets
        if all(isinstance(part, np.ndarray) for part in parts):
            values = _widened(np.concatenate(parts))
        else:  # a shard holding nulls sent Arrow
            values = pa.concat_arrays([pa.array(_widened(p) if isinstance(p, np.ndarray) else p) for p in parts])
        if len(values) != self.num_events:
            raise DataFormatError(f"shards sent {len(values)} values of {column!r} for {self.num_events} events")
        order = self._event_order()
        if order is not None:
            values = values[order] if isinstance(values, np.ndarray) else values.take(pa.array(order))
        return values, self.event_offsets

    def event_field(self, column: str) -> pa.Array:
        values, _ = self.flat(column)
        return pa.array(values)

    def padded(self, column: str, pad_value: int | float) -> None:
        """No fast path: TraceBatch.padded pads the flat column the shards send."""
        return None

    def collect(self) -> _core.TraceBatch:
        """The sample as one canonical batch (whole traces from every shard)."""
        cores = [_core.TraceBatch.restore(_from_wire(answer)) for answer in self._fetch("collect")]
        if not cores:
            return _core.empty_batch()
        sources = np.repeat(np.arange(len(cores)), [len(core) for core in cores])[self._order]
        rows = np.concatenate([np.arange(len(core)) for core in cores])[self._order]
        return _core.TraceSelection.of_batches(cores, sources.tolist(), rows.tolist()).collect()


def _keys(shards: int) -> list[str]:
    """One key per shard for the draws of one sample (a shard lets go of its own)."""
    sample = uuid.uuid4().hex
    return [f"{sample}-{shard}" for shard in range(shards)]


def _widened(values: np.ndarray) -> np.ndarray:
    """Integers sent narrowed (see _narrowed) as the int64 of the field."""
    return values.astype(np.int64) if values.dtype.kind == "i" else values


def _decoded(answer: np.ndarray | pa.Buffer) -> np.ndarray | pa.Array:
    """A shard's column as sent (see _column): numpy as is, Arrow IPC as its array."""
    if isinstance(answer, np.ndarray):
        return answer
    return _from_wire(answer).column(0).combine_chunks()
