"""Recipes whose credit lives on a rollout tree shared by a group's traces: MAGRPO (returns
on the tree, sibling baselines), C3 (leave-one-out over replayed siblings), MALT (node values
of a generator/verifier/refiner tree) and MarsRL (GRPO among the samples of one input).

The tree is an input a trace cannot carry: ``node`` labels each acting event with the tree
node (joint action, message, role output) it belongs to. Each trace is one root-to-leaf path;
traces of a group that share a prefix repeat its nodes with the same labels. A node's parent
is the node before it on any path through it (all paths must agree). Without ``node``, each
trace is a single node and its siblings are its group: the flat GRPO group, which is the
one-turn case of every method here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from masreplay._args import checked
from masreplay.advantages import Advantages
from masreplay.errors import InvalidArgumentError
from masreplay.recipes._events import Events, cell_stats, dense, grpo, nested_weights, result


@dataclass(frozen=True)
class Tree:
    """Nodes of the group trees: ``node`` per event (-1: not on the tree), and per node its
    parent (-1: a root), siblings key, depth, the traces through it and whether it ends one."""

    node: np.ndarray
    parent: np.ndarray
    siblings: np.ndarray
    depth: np.ndarray
    traces: np.ndarray  # (node, trace) pairs: column 0 node, column 1 trace
    last: np.ndarray  # per (node, trace) pair: the node is the trace's last

    @property
    def n_nodes(self) -> int:
        return len(self.parent)

    def children_mean(self, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per node: the mean of ``values`` over its children, and whether it has any."""
        has_parent = self.parent >= 0
        counts = np.bincount(self.parent[has_parent], minlength=self.n_nodes)
        sums = np.bincount(self.parent[has_parent], weights=values[has_parent], minlength=self.n_nodes)
        return np.divide(sums, counts, out=np.zeros(self.n_nodes), where=counts > 0), counts > 0

    def backup(self, own: np.ndarray, gamma: float) -> np.ndarray:
        """``R_j = own_j + gamma * mean(R of j's children)``, leaves first."""
        values = own.astype(np.float64).copy()
        for level in range(int(self.depth.max(initial=0)), 0, -1):
            at = self.depth == level
            sums = np.bincount(self.parent[at], weights=values[at], minlength=self.n_nodes)
            counts = np.bincount(self.parent[at], minlength=self.n_nodes)
            up = np.flatnonzero(counts)
            values[up] += gamma * sums[up] / counts[up]
        return values

    def per_pair_mean(self, per_trace: np.ndarray) -> np.ndarray:
        """Per node: the mean of a per-trace value over the traces through it."""
        nodes, traces = self.traces[:, 0], self.traces[:, 1]
        return np.bincount(nodes, weights=per_trace[traces], minlength=self.n_nodes) / np.bincount(nodes, minlength=self.n_nodes)


def build_tree(events: Events, node: Any) -> Tree:
    """The group trees of ``node`` labels (None: each trace is its own single node)."""
    if node is None:
        labels = events.trace.copy()
        on_tree = events.acting
    else:
        labels = events.labels("node", node)
        on_tree = events.acting & (labels >= 0)
    node_of_event = np.full(events.n_events, -1, np.int64)
    rows = events.time_order[on_tree[events.time_order]]
    if len(rows) == 0:
        return Tree(node_of_event, *(np.zeros(0, np.int64),) * 3, np.zeros((0, 2), np.int64), np.zeros(0, bool))
    codes = dense(events.group[rows], labels[rows])
    node_of_event[rows] = codes
    n_nodes = int(codes.max()) + 1
    # (trace, node) pairs in the order the trace reaches them: a path.
    trace_of_row = events.trace[rows]
    first = np.r_[True, (trace_of_row[1:] != trace_of_row[:-1]) | (codes[1:] != codes[:-1])]
    pair_trace, pair_node = trace_of_row[first], codes[first]
    if dense(pair_trace, pair_node).max(initial=-1) + 1 != len(pair_node):
        raise InvalidArgumentError("a trace returns to a tree node after leaving it: node labels must follow the path")
    new_trace = np.r_[True, pair_trace[1:] != pair_trace[:-1]]
    pair_parent = np.where(new_trace, -1, np.r_[-1, pair_node[:-1]])
    if dense(pair_node, pair_parent).max(initial=-1) + 1 != n_nodes:
        raise InvalidArgumentError("a tree node has different parents on different traces: node labels do not form a tree")
    parent = np.empty(n_nodes, np.int64)
    parent[pair_node] = pair_parent
    depth = np.zeros(n_nodes, np.int64)
    position = np.arange(len(pair_node)) - np.maximum.accumulate(np.where(new_trace, np.arange(len(pair_node)), 0))
    depth[pair_node] = position
    node_group = np.zeros(n_nodes, np.int64)
    node_group[codes] = events.group[rows]
    siblings = dense(np.where(parent >= 0, parent, -1 - node_group))
    last = np.r_[new_trace[1:], True]
    return Tree(node_of_event, parent, siblings, depth, np.stack([pair_node, pair_trace], 1), last)


def _node_weights(events: Events, tree: Tree) -> np.ndarray:
    """Each node of a group weighs the same; copies of a node on several paths share it."""
    on = tree.node >= 0
    return nested_weights(events, on, [np.where(on, tree.node, -1)], by_tokens=False)


def _node_rewards(events: Events, tree: Tree, channel: str) -> np.ndarray:
    """Per node: its events' ``channel`` rewards plus, where it ends a trace, the trace's
    ``channel`` reward, averaged over the traces through it."""
    on = tree.node >= 0
    event_part = np.bincount(tree.node[on], weights=events.event_reward(channel)[on], minlength=tree.n_nodes)
    outcome = events.trace_reward(channel)
    nodes, traces = tree.traces[:, 0], tree.traces[:, 1]
    ends = np.bincount(nodes, weights=np.where(tree.last, outcome[traces], 0.0), minlength=tree.n_nodes)
    return (event_part + ends) / np.bincount(nodes, minlength=tree.n_nodes)


def _per_event(tree: Tree, node_values: np.ndarray) -> np.ndarray:
    on = tree.node >= 0
    out = np.zeros(len(tree.node))
    out[on] = node_values[tree.node[on]]
    return out


@checked
def magrpo(
    batch: Any,
    *,
    node: Any = None,
    channel: str = "team",
    gamma: float = 0.9,
    advantage_mode: Literal["mean", "raw", "max", "rloo"] = "mean",
) -> Advantages:
    """MAGRPO (arXiv 2508.04652, CoMLRL's defaults): returns on the rollout tree with
    sibling baselines.

    A joint action ``j`` (tree node: the events of all agents at one node of the tree, labelled
    by ``node``) earns ``r_j``: its events' ``channel`` rewards plus, at a leaf, the trace's
    ``channel`` reward. ``R_j = r_j + gamma * mean(R of the joint actions expanded from j)``;
    ``A_j = R_j - mean of R over j's siblings`` (``advantage_mode="mean"``; ``"raw"``: R,
    ``"max"``: R - max R, ``"rloo"``: (G R_j - sum R) / (G - 1)), broadcast to every agent's
    events of ``j`` (aligned joint mode). ``node=None`` is a flat group: one turn,
    ``A_i = R_i - mean_G R``. Weights: each node of a group equally.
    """
    events = Events(batch)
    tree = build_tree(events, node)
    returns = tree.backup(_node_rewards(events, tree, channel), gamma)
    n, mean, _ = cell_stats(returns, tree.siblings)
    if advantage_mode == "mean":
        advantage = returns - mean
    elif advantage_mode == "raw":
        advantage = returns
    elif advantage_mode == "max":
        top = np.full(tree.siblings.max(initial=-1) + 1, -np.inf)
        np.maximum.at(top, tree.siblings, returns)
        advantage = returns - top[tree.siblings]
    elif advantage_mode == "rloo":
        advantage = np.where(n > 1, (n * returns - n * mean) / np.maximum(n - 1, 1), 0.0)
    else:
        raise InvalidArgumentError(f"advantage_mode must be 'mean', 'raw', 'max' or 'rloo', got {advantage_mode!r}")
    return result(events, "magrpo", _per_event(tree, advantage), _node_weights(events, tree), ("node",))


def _loo(values: np.ndarray, siblings: np.ndarray) -> np.ndarray:
    """Mean of the other siblings (NaN for a node without siblings)."""
    n = np.bincount(siblings)[siblings].astype(np.float64)
    total = np.bincount(siblings, weights=values)[siblings]
    with np.errstate(invalid="ignore", divide="ignore"):
        return (total - values) / (n - 1)


@checked
def c3(
    batch: Any,
    *,
    node: Any = None,
    values: Any = None,
    channel: str = "team",
    alpha: float = 1.0,
) -> Advantages:
    """C3, contextual counterfactual credit (arXiv 2603.06859), ``value_assisted`` variant:
    ``A_i = r_i - [(1 - alpha) LOO(r)_i + alpha LOO(Q)_i]``, ``LOO(v)_i = (sum v - v_i) / (n - 1)``
    over the siblings (messages replayed from the same frozen prefix).

    ``r`` of a message node is the mean ``channel`` reward of the leaves (traces) below it.
    ``values`` is the centralised Q-critic's score of each prefix, an input per event (the
    node's Q is the mean over its events); required for ``alpha > 0`` (default 1: the
    baseline is the siblings' Q). ``alpha=0`` is ``reward_only``: ``r - LOO(r)``. A node
    without siblings gets 0. Weights: each node of a group equally.
    """
    events = Events(batch)
    tree = build_tree(events, node)
    reward = tree.per_pair_mean(events.trace_reward(channel))
    baseline = (1.0 - alpha) * _loo(reward, tree.siblings) if alpha != 1.0 else np.zeros(tree.n_nodes)
    if alpha != 0.0:
        if values is None:
            raise InvalidArgumentError("c3 with alpha > 0 needs the Q-critic's values per event (or alpha=0: reward_only)")
        q = events.amounts("values", values)
        on = tree.node >= 0
        q_node = np.bincount(tree.node[on], weights=q[on], minlength=tree.n_nodes) / np.bincount(
            tree.node[on], minlength=tree.n_nodes
        )
        baseline = baseline + alpha * _loo(q_node, tree.siblings)
    advantage = np.nan_to_num(reward - baseline, nan=0.0)
    return result(events, "c3", _per_event(tree, advantage), _node_weights(events, tree), ("message",))


@checked
def malt(batch: Any, *, node: Any = None, channel: str = "team") -> Advantages:
    """MALT (arXiv 2412.01928): values on the generator -> verifier -> refiner tree.

    ``V(leaf) = 1[answer correct]`` (the trace's ``channel`` reward, 0/1), ``V(n) = mean of
    V over n's children``; ``per_event`` holds V of the event's node (a value, not an
    advantage). A node is a positive example where ``V > 0.5``; DPO pairs are siblings on
    either side of 0.5. Weights: each node of a group equally.
    """
    events = Events(batch)
    tree = build_tree(events, node)
    nodes, traces = tree.traces[:, 0], tree.traces[:, 1]
    outcome = events.trace_reward(channel)
    leaf = np.bincount(nodes, weights=np.where(tree.last, outcome[traces], 0.0), minlength=tree.n_nodes)
    # A node's own value only counts at a leaf; backup with gamma 1 then averages the children.
    _, has_children = tree.children_mean(np.zeros(tree.n_nodes))
    value = tree.backup(np.where(has_children, 0.0, leaf / np.bincount(nodes, minlength=tree.n_nodes)), 1.0)
    return result(events, "malt", _per_event(tree, value), _node_weights(events, tree), ("node",))


@checked
def marsrl(batch: Any, *, node: Any = None, channel: str = "correct", eps: float = 1e-6) -> Advantages:
    """MarsRL (arXiv 2511.11373): agent-specific rewards, GRPO within each group of samples
    of one input.

    Each role output (a node) is rewarded by its own per-event ``channel`` (1 for a correct
    solution or correction, or a verdict agreeing with the truth; 0 otherwise: the pipeline's
    checks, recorded on the events), summed over the node's events; its group is its
    siblings, the samples drawn from the same parent output: ``A = (r - mean) / (std + eps)``
    (unbiased std; the paper's GRPO leaves it unstated). Without ``node``, every (trace,
    owner) is a node and its group is the same owner in the other rollouts of the task.
    """
    events = Events(batch)
    if node is None:
        rows = np.flatnonzero(events.acting)
        unit = np.full(events.n_events, -1, np.int64)
        unit[rows] = dense(events.trace[rows], events.owner[rows])
        n_units = int(unit.max(initial=-1)) + 1
        reward = np.bincount(unit[rows], weights=events.event_reward(channel)[rows], minlength=n_units)
        cells = np.zeros(n_units, np.int64)
        cells[unit[rows]] = dense(events.group[rows], events.owner[rows])
        advantage = grpo(reward, cells, eps=eps)
        per_event = np.where(unit >= 0, advantage[unit], 0.0)
        weights = nested_weights(events, events.acting, [unit], by_tokens=False)
        return result(events, "marsrl", per_event, weights, ("role",))
    tree = build_tree(events, node)
    on = tree.node >= 0
    reward = np.bincount(tree.node[on], weights=events.event_reward(channel)[on], minlength=tree.n_nodes)
    copies = np.bincount(tree.traces[:, 0], minlength=tree.n_nodes)
    advantage = grpo(reward / np.maximum(copies, 1), tree.siblings, eps=eps)
    return result(events, "marsrl", _per_event(tree, advantage), _node_weights(events, tree), ("role",))
