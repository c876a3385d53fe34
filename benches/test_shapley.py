"""Shapley estimators against shapiq and pyDVL, measured side by side (issues 5 and 23).

Cells: game families of n = 10, 30, 100, 300 players: SOUM with 100 unanimity terms,
coefficients uniform in [-1, 1], "low" order (term sizes 1-3) and "full" order (sizes 1..n);
weighted voting (integer weights 1-5, quota 60% of the total); "pairwise" (an additive game
plus a random interaction on every pair, as a SOUM of sizes 1 and 2; its numpy twin a
quadratic form); "trace": the spawn tree of a simulated trace with n agents
(``sim.branches``), where v(S) sums the ground-truth values of the agents whose whole spawn
chain is in S (a SOUM with one term per agent, of sizes 1-4). Budgets of 1,000 and 10,000
coalition evaluations. Truth: the closed form (SOUM), a dynamic program over weight sums
(voting). Each side runs seeds 0-4 (the slow shapiq
sides, SVARM 25-35 s a run at n = 100, run seed 0 only at n = 300, and the table's ``seeds``
column says so: one seed's MAE is no figure to compare a five-seed mean with, as SVARM's
seed 0 was 0.65x its five-seed mean on full-order games at n = 30; kADD-SHAP, whose pairwise
regression has n(n-1)/2 columns, stops at n = 100); the time is the median run. Every anchor values coalitions with the same
vectorised numpy game (a matrix product); so do the masreplay sides named
"games.function(numpy game)", the reference of the summary's speed ratios (a user's value
function is a Python callable). The sides named "built-in game" value masreplay's native game
in Rust: their times show the estimators' own cost, not a speed a user's game gets.

masreplay's sides: antithetic permutations, KernelSHAP, stratified, regression-adjusted MSR
(``msr``) and ``auto``. shapiq 1.4.1 ships no RegressionMSR, so MSR has no anchor of its own.
pyDVL 0.10.0's sides: antithetic permutations, antithetic Owen sampling and uniform subsets
(each through ``ShapleyValuation``). Its ``MSRSampler`` is left out: it estimates Banzhaf
values (``MSRBanzhafValuation``); under ``ShapleyValuation`` its error did not fall with the
budget (n = 30: MAE 0.26 at 1,000 and 0.39 at 10,000 evaluations, 35 s a run). Its stratified
sampler spent 59 evaluations on 100 samples in a trial, a cost the budget cannot be matched
to, and is left out too.

Accuracy on the same footing: ``MAE`` compares what each side's estimator produced before
any projection onto efficiency (masreplay's returned values less its recorded
``efficiency_gap`` / n; the anchors' values as returned), ``MAE proj`` projects every side
onto sum = v(N) - v(empty) first; ``gap`` is |sum - (v(N) - v(empty))| before projection
(the largest over seeds); ``cover`` is the share of masreplay's value +- 1.96 stderr
intervals that hold the truth.

``test_mae_against_budget`` draws MAE against budget (1,000-10,000, n = 100, every family,
5 seeds) for masreplay's ``auto`` and permutations and the anchors installed, and writes the
plot to benches/shapley_mae_budget.svg (matplotlib, from benches/requirements.txt).

``test_trace_game_precedence`` credits the trace games with the spawn tree respected
(``method="precedence"``), exact and with evaluation noise (sigma = 0.1 of the value range),
against the simulator's ground truth (each agent's own value) and a numpy sampler of
tree-respecting orderings.
Also measured: a batched Python callable's overhead (total time over the callable's own time,
chunk sizes 256-4096, and a callable that waits 100 us per evaluation) and per-trace credit of
10,000 traces of 8 agents. The per-cell table
(MAE, gap, time) is printed at the end of the module; nothing is asserted on times.
"""

from __future__ import annotations

import importlib
import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import pytest

import masreplay
from masreplay import games

SEEDS = (0, 1, 2, 3, 4)
N_TERMS = 100
FAMILIES = ("low", "full", "voting", "pairwise", "trace")
CELLS = [(n, family, budget) for n in (10, 30, 100, 300) for family in FAMILIES for budget in (1_000, 10_000)]
ROWS: list[dict] = []


class NumpySoum:
    """v(S) = sum_T c_T [T subset of S], vectorised: count each term's members in S. Integer
    arithmetic keeps BLAS threads (erratic on a loaded 2-core machine) out of the timings."""

    def __init__(self, game: masreplay.games.Game) -> None:
        terms = game.terms()
        self.n = game.n_players
        self.members = np.zeros((len(terms), self.n), dtype=np.int32)
        for t, (players, _) in enumerate(terms):
            self.members[t, players] = 1
        self.sizes = self.members.sum(axis=1)
        self.coefficients = np.array([c for _, c in terms])
        self.evaluations = 0

    def __call__(self, masks: np.ndarray) -> np.ndarray:
        masks = np.asarray(masks, dtype=np.int32).reshape(-1, self.n)
        self.evaluations += len(masks)
        return (masks @ self.members.T == self.sizes) @ self.coefficients


class NumpyPairwise:
    """v(S) = sum_i a_i x_i + sum_{i<j} b_ij x_i x_j as a quadratic form: at n = 300 the SOUM
    form has 45,150 terms and makes every numpy-game side minutes slower."""

    def __init__(self, game: masreplay.games.Game) -> None:
        self.n = game.n_players
        self.linear = np.zeros(self.n)
        self.pairs = np.zeros((self.n, self.n))
        for players, c in game.terms():
            if len(players) == 1:
                self.linear[players[0]] += c
            else:
                self.pairs[players[0], players[1]] += c
        self.evaluations = 0

    def __call__(self, masks: np.ndarray) -> np.ndarray:
        x = np.asarray(masks, dtype=np.float64).reshape(-1, self.n)
        self.evaluations += len(x)
        return x @ self.linear + ((x @ self.pairs) * x).sum(axis=1)


class NumpyVoting:
    """v(S) = 1 when the weights of S reach the quota: one matrix-vector product."""

    def __init__(self, weights: np.ndarray, quota: float) -> None:
        self.n, self.weights, self.quota = len(weights), weights, quota
        self.evaluations = 0

    def __call__(self, masks: np.ndarray) -> np.ndarray:
        masks = np.asarray(masks, dtype=np.int64).reshape(-1, self.n)
        self.evaluations += len(masks)
        return (masks @ self.weights >= self.quota).astype(np.float64)


def voting_shapley(weights: np.ndarray, quota: float) -> np.ndarray:
    """Exact Shapley values of a weighted voting game with integer weights: for each player,
    count the coalitions of each size and weight sum without it (a knapsack table), and sum
    the Shapley weights of those it swings. Players of equal weight are symmetric, so one of
    each weight is counted (five tables at n = 300, not 300)."""
    n, total = len(weights), int(weights.sum())
    phi = np.full(n, np.nan)
    weight_of_size = np.array([math.factorial(s) * math.factorial(n - s - 1) / math.factorial(n) for s in range(n)])
    for w_i in np.unique(weights):
        i = int(np.flatnonzero(weights == w_i)[0])
        counts = np.zeros((n, total + 1))  # counts[size, weight sum] over coalitions without i
        counts[0, 0] = 1
        for j in (j for j in range(n) if j != i):
            w = int(weights[j])
            counts[1:, w:] += counts[:-1, : total + 1 - w].copy()
        swing = np.arange(total + 1)
        swings = (swing < quota) & (swing + weights[i] >= quota)
        phi[weights == w_i] = (counts[:, swings].sum(axis=1) * weight_of_size).sum()
    return phi


def numpy_antithetic(values: NumpySoum, budget: int, seed: int) -> np.ndarray:
    """Antithetic permutation sampling in plain numpy: all prefixes of m/2 random orderings
    and their reverses valued in one call."""
    n = values.n
    pairs = max(1, budget // (2 * (n + 1)))
    rng = np.random.default_rng(seed)
    orders = np.argsort(rng.random((pairs, n)), axis=1)
    orders = np.concatenate([orders, orders[:, ::-1]])
    ranks = np.argsort(orders, axis=1)
    prefixes = ranks[:, None, :] < np.arange(n + 1)[None, :, None]  # (orders, n + 1, n)
    worth = values(prefixes.reshape(-1, n)).reshape(len(orders), n + 1)
    marginal = np.diff(worth, axis=1)
    phi = np.zeros(n)
    np.add.at(phi, orders.ravel(), marginal.ravel())
    return phi / len(orders)


def shapiq_runner(kind: str):
    def run(values: NumpySoum, budget: int, seed: int) -> np.ndarray:
        import shapiq  # at run time: the suite must collect without the anchor installed

        n = values.n
        if kind == "permutation":
            approximator = shapiq.PermutationSamplingSV(n=n, random_state=seed)
        elif kind == "kernel":
            approximator = shapiq.KernelSHAP(n=n, pairing_trick=True, random_state=seed)
        elif kind == "unbiased kernel":
            approximator = shapiq.UnbiasedKernelSHAP(n=n, pairing_trick=True, random_state=seed)
        elif kind == "kadd":
            from shapiq.approximator.regression.kadd_shap import kADDSHAP

            approximator = kADDSHAP(n=n, max_order=2, pairing_trick=True, random_state=seed)
        elif kind == "stratified":
            approximator = shapiq.StratifiedSamplingSV(n=n, random_state=seed)
        else:
            approximator = shapiq.SVARM(n=n, random_state=seed)
        result = approximator.approximate(budget=budget, game=values)
        return np.array([result[(i,)] for i in range(n)])

    return run


def pydvl_valuation(values, sampler, samples: int) -> np.ndarray:
    """pyDVL's ShapleyValuation of the numpy game with ``sampler``, stopped after ``samples``
    samples (what one sample costs in evaluations depends on the sampler)."""
    from pydvl.valuation import MaxSamples, ShapleyValuation
    from pydvl.valuation.games import Game

    class Soum(Game):
        def _score(self, x: np.ndarray) -> float:
            mask = np.zeros((1, values.n), dtype=bool)
            mask[0, x[:, 0].astype(int)] = True
            return float(values(mask)[0])

    game = Soum(values.n)
    valuation = ShapleyValuation(game.u, sampler, MaxSamples(sampler, samples), progress=False)
    valuation.fit(game.data)
    result = valuation.result
    ordered = np.zeros(values.n)
    ordered[np.asarray(result.indices, dtype=int)] = result.values
    return ordered


def pydvl_antithetic(values: NumpySoum, budget: int, seed: int) -> np.ndarray:
    from pydvl.valuation import AntitheticPermutationSampler

    # pyDVL values every prefix of each ordering once: n evaluations per sampled ordering.
    return pydvl_valuation(values, AntitheticPermutationSampler(seed=seed), max(2, budget // values.n))


def pydvl_owen(values: NumpySoum, budget: int, seed: int) -> np.ndarray:
    """Antithetic Owen sampling (Okhrati & Lipani 2021) on a grid of inclusion probabilities:
    each player gets outer x inner x 2 samples of two evaluations each, so the grid is sized to
    the budget (the evaluations actually spent are in the table's ``evals`` column)."""
    from pydvl.valuation import AntitheticOwenSampler
    from pydvl.valuation.samplers import GridOwenStrategy

    outer = max(1, budget // (8 * values.n))
    sampler = AntitheticOwenSampler(GridOwenStrategy(n_samples_outer=outer), n_samples_inner=2, seed=seed)
    return pydvl_valuation(values, sampler, budget)


def pydvl_uniform(values: NumpySoum, budget: int, seed: int) -> np.ndarray:
    """Uniform subsets, one marginal contribution (two evaluations) per sample."""
    from pydvl.valuation import UniformSampler

    return pydvl_valuation(values, UniformSampler(seed=seed), max(1, budget // 2))


def masreplay_runner(method: str):
    def run(game, budget: int, seed: int):
        return masreplay.shapley(game, method=method, budget=budget, seed=seed)

    return run


def function_runner(method: str):
    """masreplay on the anchors' own numpy game through ``games.function``: what a user's
    value function (a Python callable) gets, so the speed figure to quote beside the anchors."""

    def run(values, budget: int, seed: int):
        return masreplay.shapley(games.function(values, values.n), method=method, budget=budget, seed=seed)

    return run


@dataclass
class Side:
    name: str
    run: object
    package: str | None = None  # the module the anchor imports, checked before it runs
    native: bool = False  # runs on masreplay's native game (else on the numpy SOUM)
    slow: bool = False
    max_n: int | None = None  # beyond it the side cannot run (memory), and says so
    least_budget: object = None  # n -> the fewest evaluations the side accepts, below which it says so
    reference: bool = False  # the side the summary's ratios are taken against


SIDES = [
    Side("masreplay permutation, built-in game", masreplay_runner("permutation"), native=True),
    Side("masreplay kernel, built-in game", masreplay_runner("kernel"), native=True),
    Side(
        "masreplay stratified, built-in game",
        masreplay_runner("stratified"),
        native=True,
        least_budget=lambda n: 2 + 2 * n + 2 * (n - 3),  # sizes 1 and n - 1 whole, two draws of the others
    ),
    Side("masreplay msr, built-in game", masreplay_runner("msr"), native=True),
    Side("masreplay auto, built-in game", masreplay_runner("auto"), native=True),
    Side("masreplay permutation, games.function(numpy game)", function_runner("permutation"), reference=True),
    Side("masreplay auto, games.function(numpy game)", function_runner("auto")),
    Side("numpy antithetic permutation (vectorised)", numpy_antithetic),
    Side("shapiq PermutationSamplingSV", shapiq_runner("permutation"), "shapiq"),
    Side("shapiq KernelSHAP (pairing)", shapiq_runner("kernel"), "shapiq"),
    Side("shapiq UnbiasedKernelSHAP (pairing)", shapiq_runner("unbiased kernel"), "shapiq"),
    Side("shapiq kADD-SHAP (k=2, pairing)", shapiq_runner("kadd"), "shapiq", slow=True, max_n=100),
    Side("shapiq StratifiedSamplingSV", shapiq_runner("stratified"), "shapiq", slow=True),
    Side("shapiq SVARM", shapiq_runner("svarm"), "shapiq", slow=True),
    Side("pyDVL antithetic permutation", pydvl_antithetic, "pydvl.valuation"),
    Side("pyDVL antithetic Owen", pydvl_owen, "pydvl.valuation"),
    Side("pyDVL uniform", pydvl_uniform, "pydvl.valuation"),
]


def spawn_tree_trace(n: int, seed: int) -> tuple[list[int], list[float]]:
    """A simulated trace with exactly ``n`` agents (``sim.branches``, spawn trees three levels
    deep): each agent's spawner (-1 for the orchestrator) and its ground-truth value (the sum
    of its events' contributions to the team reward). The simulator's agent count is a request
    (idle agents author no event), so the request grows until a trace has ``n``."""
    for requested in range(n - 1, 2 * n):
        truth = masreplay.sim.branches(
            8, branches=1, branch_points=1, agents=(requested, requested), depth=3, fan_out=(2, 6), noise=0.0, seed=1000 + seed
        )
        players = masreplay.trace_players(truth.batch)
        for trace_id in players["trace_id"].unique().to_pylist():
            own = players.filter(pc.equal(players["trace_id"], trace_id))
            if len(own) == n:
                values = truth.agent_values.filter(pc.equal(truth.agent_values["trace_id"], trace_id))
                value_of = dict(zip(values["agent"].to_pylist(), values["value"].to_pylist(), strict=True))
                return own["parent"].to_pylist(), [value_of[label] for label in own["label"].to_pylist()]
    raise RuntimeError(f"no simulated trace with {n} agents")


def trace_game(parents: list[int], values: list[float]) -> masreplay.games.Game:
    """v(S) = the values of the agents whose whole spawn chain (the agent and its ancestors) is in
    S: a sub-agent whose spawner is absent never runs (sim.branches' no_spawn branch). A SOUM with
    one term per agent; its Shapley value splits each agent's value over its chain, and its
    precedence value (orderings that respect the tree) is the agent's own value."""
    terms = []
    for agent, value in enumerate(values):
        chain = [agent]
        while parents[chain[-1]] >= 0:
            chain.append(parents[chain[-1]])
        terms.append((sorted(chain), value))
    return games.soum(len(values), terms)


def make_game(n: int, family: str, seed: int):
    """(native game, numpy twin for the anchors, exact values)."""
    rng = np.random.default_rng(1000 + seed)
    if family == "trace":
        game = trace_game(*spawn_tree_trace(n, seed))
        return game, NumpySoum(game), game.shapley_values()
    if family == "voting":
        weights = rng.integers(1, 6, size=n).astype(np.float64)
        quota = 0.6 * weights.sum()
        return games.weighted_voting(weights, quota), NumpyVoting(weights, quota), voting_shapley(weights, quota)
    if family == "pairwise":
        terms = [([i], float(rng.uniform(0, 1))) for i in range(n)]
        terms += [([i, j], float(rng.uniform(-1, 1)) / n) for i in range(n) for j in range(i + 1, n)]
        game = games.soum(n, terms)
        return game, NumpyPairwise(game), game.shapley_values()
    game = games.soum(n, N_TERMS, 3 if family == "low" else n, seed=1000 + seed)
    return game, NumpySoum(game), game.shapley_values()


def unprojected(output, n: int) -> np.ndarray:
    """What an estimator produced before any projection onto efficiency: masreplay's values
    with the projection's share taken back out, an anchor's as returned."""
    if hasattr(output, "efficiency_gap"):
        return output.values - output.efficiency_gap / n
    return np.asarray(output, dtype=float)


@pytest.fixture(scope="module")
def soums():
    made = {}
    for n, family, _ in CELLS:
        for seed in SEEDS:
            if (n, family, seed) not in made:
                made[(n, family, seed)] = make_game(n, family, seed)
    return made


@pytest.fixture(scope="module", autouse=True)
def cell_table(request):
    """Prints the per-cell table (MAE, efficiency gap, time) once the module's cells ran."""
    yield
    if not ROWS:
        return
    lines = [
        "",
        "Shapley estimators: MAE before / after projection onto efficiency (mean of seeds), gap before"
        + " projection (max), interval coverage (masreplay), median time",
        f"  {'cell':<22} {'side':<52} {'MAE':>8} {'MAE proj':>8} {'gap':>8} {'cover':>6} {'time':>11} {'evals':>7} {'seeds':>5}",
    ]
    for row in ROWS:
        lines.append(
            f"  {row['cell']:<22} {row['side']:<52} {row['mae']:8.4f} {row.get('mae_projected', float('nan')):8.4f} "
            f"{row['gap']:8.1e} {row.get('coverage', float('nan')):6.3f} {row['seconds'] * 1e3:9.2f}ms {row['evaluations']:>7} "
            f"{row.get('seeds', '-'):>5}"
        )
    capture = request.config.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled():
        print("\n".join(lines))


def missing_module(side: Side) -> str | None:
    """The module a side's anchor cannot import: its package, or one the package needs that is
    not installed (pyDVL's valuation imports cvxpy); None when it imports."""
    if side.package is None:
        return None
    try:
        importlib.import_module(side.package)
    except ImportError as error:
        return error.name or side.package
    return None


def skip_without_anchor(side: Side, missing_anchor) -> None:
    """Skips a side whose anchor cannot be imported, naming the missing module in the summary."""
    missing = missing_module(side)
    if missing is not None:
        missing_anchor(missing, "pip install -r benches/requirements-anchors.txt")
        pytest.skip(f"{side.name}: {missing} is not installed (pip install -r benches/requirements-anchors.txt)")


@pytest.mark.parametrize("side", SIDES, ids=[s.name for s in SIDES])
@pytest.mark.parametrize(("n", "order", "budget"), CELLS, ids=[f"n{n}-{o}-{b}" for n, o, b in CELLS])
def test_game_cell(benchmark, measure, dataset_type, missing_anchor, soums, side, n, order, budget):
    skip_without_anchor(side, missing_anchor)
    if side.max_n is not None and n > side.max_n:
        pytest.skip(f"{side.name} stops at n = {side.max_n} (a regression on every pair: n(n-1)/2 columns)")
    if side.least_budget is not None and budget < side.least_budget(n):
        pytest.skip(f"{side.name} refuses {budget:,} evaluations at n = {n} (needs {side.least_budget(n):,})")
    seeds = SEEDS[:1] if side.slow and n > 100 else SEEDS
    inputs = []
    for seed in seeds:
        game, twin, truth = soums[(n, order, seed)]
        twin.evaluations = 0
        inputs.append((game if side.native else twin, truth, seed))
    queue = iter(inputs)
    outputs = []

    def setup():
        subject, _, seed = next(queue)
        return (subject, seed), {}

    def run(subject, seed):
        outputs.append(side.run(subject, budget, seed))

    data = dataset_type(
        f"{order} game n={n}, {budget:,} evaluations",
        None,
        0,
        0,
        0,
        goal="ratios against masreplay on games.function; issue 5's speed goals (>= 100x shapiq permutation, >= 500x pyDVL) "
        "are on the built-in game"
        if (n, budget) == (100, 10_000)
        else "",
        suite="shapley",
    )
    measure(run, data=data, side=side.name, rounds=len(seeds), warmup_rounds=0, unit="ms", setup=setup, ours=side.reference)
    for subject, _, seed in inputs[len(outputs) :]:  # --benchmark-disable calls the measured function once
        run(subject, seed)
    maes, projected, gaps, covered, evaluations = [], [], [], [], []
    for (subject, truth, _), output in zip(inputs, outputs, strict=True):
        total = float(truth.sum())  # v(N) - v(empty) = the sum of the Shapley values
        raw = unprojected(output, n)
        if hasattr(output, "stderr"):
            covered.append(np.mean(np.abs(output.values - truth) <= 1.96 * output.stderr + 1e-12))
        maes.append(np.abs(raw - truth).mean())
        projected.append(np.abs(raw + (total - raw.sum()) / n - truth).mean())
        gaps.append(abs(raw.sum() - total))
        evaluations.append(output.evaluations if side.native else subject.evaluations)
    stats = getattr(benchmark, "stats", None)
    ROWS.append(
        {
            "cell": f"n={n} {order} {budget}",
            "side": side.name + (f" [{outputs[0].method}]" if hasattr(outputs[0], "method") else ""),
            "mae": float(np.mean(maes)),
            "mae_projected": float(np.mean(projected)),
            "coverage": float(np.mean(covered)) if covered else float("nan"),
            "gap": float(np.max(gaps)),
            "seconds": stats.stats.median if stats is not None else float("nan"),
            "evaluations": int(np.median(evaluations)),
            "seeds": len(seeds),
        }
    )


# ---- MAE against budget: the plot -------------------------------------------------------------

PLOT_N = 100
PLOT_BUDGETS = (1_000, 2_000, 5_000, 10_000)
PLOT_SIDES = (
    "masreplay auto, built-in game",
    "masreplay permutation, built-in game",
    "numpy antithetic permutation (vectorised)",
    "shapiq PermutationSamplingSV",
    "shapiq KernelSHAP (pairing)",
    "pyDVL antithetic permutation",
)
FIGURE = Path(__file__).with_name("shapley_mae_budget.svg")


def test_mae_against_budget(measure, dataset_type, missing_anchor, soums):
    try:
        import matplotlib
    except ImportError:
        missing_anchor("matplotlib", "pip install -r benches/requirements.txt")
        pytest.skip("matplotlib is not installed (pip install -r benches/requirements.txt)")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sides = []
    for side in (s for s in SIDES if s.name in PLOT_SIDES):
        missing = missing_module(side)
        if missing is not None:
            missing_anchor(missing, "pip install -r benches/requirements-anchors.txt")
            continue
        sides.append(side)
    curves: dict[tuple[str, str], list[float]] = {}

    def run():
        for side in sides:
            for family in FAMILIES:
                for budget in PLOT_BUDGETS:
                    maes = []
                    for seed in SEEDS:
                        game, twin, truth = soums[(PLOT_N, family, seed)]
                        output = side.run(game if side.native else twin, budget, seed)
                        maes.append(float(np.abs(unprojected(output, PLOT_N) - truth).mean()))
                    curves.setdefault((family, side.name), []).append(float(np.mean(maes)))

    data = dataset_type(f"MAE against budget, n={PLOT_N}, {len(SEEDS)} seeds", None, 0, 0, 0, goal="the plot", suite="shapley")
    measure(run, data=data, side="every side of the plot", rounds=1, warmup_rounds=0, unit="ms")
    figure, axes = plt.subplots(1, len(FAMILIES), figsize=(4 * len(FAMILIES), 3.6), sharex=True)
    for ax, family in zip(axes, FAMILIES, strict=True):
        for side in sides:
            ax.loglog(PLOT_BUDGETS, curves[(family, side.name)], marker="o", label=side.name.replace(", built-in game", ""))
        ax.set_title(f"{family}, n = {PLOT_N}")
        ax.set_xlabel("coalition evaluations")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel(f"MAE (mean of {len(SEEDS)} seeds, before projection)")
    axes[-1].legend(fontsize=7, loc="lower left")
    figure.tight_layout()
    figure.savefig(FIGURE, metadata={"Date": None})  # no timestamp: the file changes only with the figures
    plt.close(figure)
    for (family, name), maes in curves.items():
        for budget, mae in zip(PLOT_BUDGETS, maes, strict=True):
            ROWS.append(
                {
                    "cell": f"plot n={PLOT_N} {family} {budget}",
                    "side": name,
                    "mae": mae,
                    "gap": float("nan"),
                    "seconds": float("nan"),
                    "evaluations": budget,
                }
            )


# ---- a batched Python callable: masreplay's overhead over the callable's own time ----------
# Every real value function is a Python callable, so this is masreplay's speed that matters
# (issue 18): the numpy game the anchors use, wrapped by games.function, at n = 100 and
# 10,000 evaluations, for each estimator; the chunk size swept for permutation sampling.
# MSR (and auto, which runs it here) fits its interaction surrogate by default, a deliberate
# ~30 ms per run after the callable's last call (2 cores, quiet) that buys a quarter of the
# error per evaluation (issue 23); the linear surrogate's cell shows the estimator's own
# bookkeeping beside it. The numpy game costs ~6 us an evaluation, far below a rollout's; the
# cells with a wait (the callable sleeps that long per coalition, as one waiting on a model or
# a judge does) show the same estimators where an evaluation costs 100 us, still a cheap one.

CALLABLE_N = 100
CALLABLE_BUDGET = 10_000
CALLABLE_CELLS = [(method, 1024, None, 0) for method in ("permutation", "kernel", "stratified", "msr", "auto")]
CALLABLE_CELLS += [("msr", 1024, "linear", 0), ("permutation", 256, None, 0), ("permutation", 4096, None, 0)]
CALLABLE_CELLS += [(method, 1024, None, 100) for method in ("permutation", "msr", "auto")]


def callable_cell_id(method: str, chunk: int, surrogate: str | None, wait_us: int) -> str:
    name = f"{method}-{surrogate}-chunk{chunk}" if surrogate else f"{method}-chunk{chunk}"
    return f"{name}-wait{wait_us}us" if wait_us else name


@pytest.mark.parametrize(
    ("method", "chunk", "surrogate", "wait_us"), CALLABLE_CELLS, ids=[callable_cell_id(*c) for c in CALLABLE_CELLS]
)
def test_callable_overhead(measure, record, dataset_type, method, chunk, surrogate, wait_us):
    options = {"surrogate": surrogate} if surrogate else {}
    label = f"{method} ({surrogate} surrogate)" if surrogate else method
    label += f", {wait_us} us waited per evaluation" if wait_us else ""
    game = games.soum(CALLABLE_N, N_TERMS, 3, seed=7)
    values = NumpySoum(game)
    # The callable's own wall time and its thread's CPU time, summed over a run, and when its
    # last call ended (what comes after is masreplay's alone: the fits after the last chunk).
    spent = [0.0, 0.0]
    span = [0.0]

    def timed(masks):
        started, cpu = time.perf_counter(), time.thread_time()
        out = values(masks)
        if wait_us:
            time.sleep(wait_us * 1e-6 * len(masks))
        span[0] = time.perf_counter()
        spent[0] += span[0] - started
        spent[1] += time.thread_time() - cpu
        return out

    own_times, own_cpu, after = [], [], []

    def run():
        spent[0] = spent[1] = 0.0
        function = games.function(timed, CALLABLE_N, chunk_size=chunk)
        result = masreplay.shapley(function, method=method, budget=CALLABLE_BUDGET, **options)
        after.append(time.perf_counter() - span[0])
        own_times.append(spent[0])
        own_cpu.append(spent[1])
        return result

    data = dataset_type(
        f"games.function(numpy SOUM n={CALLABLE_N}), {CALLABLE_BUDGET:,} evaluations, {label}, chunk {chunk}",
        None,
        0,
        0,
        0,
        goal="goal: total <= 1.1x the callable's own time (issue 18)",
        suite="shapley",
    )
    totals, cpu_totals = [], []

    def timed_run():
        started, cpu = time.perf_counter(), time.process_time()
        result = run()
        totals.append(time.perf_counter() - started)
        # The process's CPU time: the estimator's worker thread beside the game counts too.
        cpu_totals.append(time.process_time() - cpu)
        return result

    result = measure(timed_run, data=data, side="masreplay", rounds=7, warmup_rounds=1, unit="ms")
    own = float(np.median(own_times[1:]))  # the timed rounds, warm-up left out
    record(own, data=data, side="the callable's own time inside those runs", unit="ms", ours=False)
    per_round = np.array(totals[1:]) / np.array(own_times[1:])
    cpu_per_round = np.array(cpu_totals[1:]) / np.array(own_cpu[1:])
    # The same estimator on the built-in game: the same coalitions, so the same values.
    native = masreplay.shapley(game, method=method, budget=CALLABLE_BUDGET, **options)
    np.testing.assert_allclose(result.values, native.values, atol=1e-9)
    ROWS.append(
        {
            "cell": f"callable {label} chunk {chunk}",
            # A wait is no CPU time of the callable's: the CPU ratio means nothing there.
            "side": f"masreplay total / callable time: {np.median(per_round):.3f} wall"
            + ("" if wait_us else f", {np.median(cpu_per_round):.3f} CPU")
            + f" (median of rounds; {np.median(after[1:]) * 1e3:.2f} ms of it after the callable's last call)",
            "mae": float(np.abs(result.values - game.shapley_values()).mean()),
            "gap": abs(result.efficiency_gap),
            "seconds": own,
            "evaluations": result.evaluations,
        }
    )


# ---- per-trace credit: 10,000 traces of 8 agents --------------------------------------------

N_TRACES = 10_000


@pytest.fixture(scope="module")
def eight_agent_traces():
    # The orchestrator and 7 sub-agents; a sub-agent the simulator leaves idle authors no event
    # and is no player, so keep the first N_TRACES traces where all 8 act.
    batch = masreplay.sim.generate(N_TRACES * 8 // 5, agents=7, depth=2, fan_out=(1, 3), events_per_agent=(2, 4), seed=5)
    counts = np.bincount(masreplay.trace_players(batch)["trace_index"].to_numpy(), minlength=len(batch))
    batch = batch[[int(i) for i in np.flatnonzero(counts == 8)[:N_TRACES]]]
    assert len(batch) == N_TRACES
    rng = np.random.default_rng(0)
    own = rng.uniform(0, 1, size=(len(batch), 8))
    synergy = rng.normal(0, 0.1, size=(len(batch), 8, 8))
    spent = [0.0]

    def value_fn(trace_index, masks):
        started = time.perf_counter()
        m = masks.astype(np.float64)
        out = (m * own[trace_index]).sum(axis=1) + np.einsum("ri,rij,rj->r", m, synergy[trace_index], m)
        spent[0] += time.perf_counter() - started
        return out

    return batch, value_fn, spent


def _eight_agent_data(dataset_type, batch, variant: str, goal: str):
    """The summary's entry for a run over the eight-agent traces."""
    name = f"trace_shapley, {N_TRACES:,} traces of 8 agents{variant}"
    return dataset_type(name, None, N_TRACES, int(batch.num_events), 0, goal=goal, suite="shapley")


@pytest.mark.parametrize("respect_spawn_tree", [True, False], ids=["spawn-tree", "plain"])
def test_trace_credit(measure, record, dataset_type, eight_agent_traces, respect_spawn_tree):
    batch, value_fn, spent = eight_agent_traces
    data = _eight_agent_data(dataset_type, batch, "", "goal: < 1 s on 2 cores")
    side = "masreplay" if respect_spawn_tree else "masreplay, respect_spawn_tree=False (exact over 256 coalitions)"

    own_times = []

    def run():
        spent[0] = 0.0
        credit = masreplay.trace_shapley(batch, value_fn, respect_spawn_tree=respect_spawn_tree)
        own_times.append(spent[0])
        return credit

    credit = measure(run, data=data, side=side, rounds=3, warmup_rounds=1, unit="ms", ours=respect_spawn_tree)
    own = float(np.median(own_times[1:]))
    record(own, data=data, side=f"  of which value_fn ({'spawn-tree' if respect_spawn_tree else 'plain'})", unit="ms", ours=False)
    sums = np.bincount(credit.events["trace_index"].to_numpy(), weights=credit.credit, minlength=N_TRACES)
    totals = np.bincount(credit.players["trace_index"].to_numpy(), weights=credit.players["value"].to_numpy())
    np.testing.assert_allclose(sums, totals, atol=1e-9)
    ROWS.append(
        {
            "cell": f"{N_TRACES} traces x 8",
            "side": f"trace_shapley {side} [{credit.methods[0]}], value_fn time",
            "mae": float("nan"),
            "gap": 0.0,
            "seconds": own,
            "evaluations": credit.total_evaluations,
        }
    )


# ---- noisy games: sigma = 0.1 of the value range, every evaluation a fresh draw -------------

NOISY_SEEDS = range(5)
NOISY_CELLS = [(n, family, budget) for n in (10, 30, 100) for family in FAMILIES for budget in (1_000, 10_000)]


class Noisy:
    """A numpy twin plus Gaussian noise of ``sigma``, a fresh draw per row (a live rollout)."""

    def __init__(self, twin, sigma: float, seed: int) -> None:
        self.twin, self.n, self.sigma = twin, twin.n, sigma
        self.rng = np.random.default_rng(seed)
        self.evaluations = 0

    def __call__(self, masks: np.ndarray) -> np.ndarray:
        masks = np.asarray(masks, dtype=bool).reshape(-1, self.n)
        self.evaluations += len(masks)
        return self.twin(masks) + self.rng.normal(0.0, self.sigma, len(masks))


def value_range(twin) -> float:
    """max - min of the game over the empty, the grand and 4,096 random coalitions."""
    rng = np.random.default_rng(0)
    masks = np.vstack([np.zeros(twin.n, bool), np.ones(twin.n, bool), rng.random((4096, twin.n)) < rng.random((4096, 1))])
    values = twin(masks)
    return float(values.max() - values.min())


def anchor_on_noise(run):
    """An anchor's runner as a noisy side: it is not told the noise."""
    return lambda game, budget, seed, sigma: run(game, budget, seed)


NOISY_SIDES = [
    Side(
        "masreplay noise='auto'",
        lambda game, budget, seed, sigma: masreplay.shapley(
            games.function(game, game.n, chunk_size=1 << 16), budget=budget, seed=seed, noise="auto"
        ),
        reference=True,
    ),
    Side(
        "masreplay noise=sigma",
        lambda game, budget, seed, sigma: masreplay.shapley(
            games.function(game, game.n, chunk_size=1 << 16), budget=budget, seed=seed, noise=sigma
        ),
    ),
    # Noise ignored: the cache keeps one draw per coalition and stderr leaves the noise out.
    Side(
        "masreplay, noise ignored",
        lambda game, budget, seed, sigma: masreplay.shapley(
            games.function(game, game.n, chunk_size=1 << 16), budget=budget, seed=seed
        ),
    ),
    Side("numpy antithetic permutation", anchor_on_noise(numpy_antithetic)),
    # The anchors that use every evaluation for every player (regression, stratification)
    # average noise as MSR does: the ones to beat under noise.
    Side("shapiq PermutationSamplingSV", anchor_on_noise(shapiq_runner("permutation")), "shapiq"),
    Side("shapiq KernelSHAP (pairing)", anchor_on_noise(shapiq_runner("kernel")), "shapiq"),
    Side("shapiq UnbiasedKernelSHAP (pairing)", anchor_on_noise(shapiq_runner("unbiased kernel")), "shapiq"),
    Side("shapiq SVARM", anchor_on_noise(shapiq_runner("svarm")), "shapiq"),
    Side("pyDVL antithetic permutation", anchor_on_noise(pydvl_antithetic), "pydvl.valuation"),
    Side("pyDVL uniform", anchor_on_noise(pydvl_uniform), "pydvl.valuation"),
]


@pytest.mark.parametrize("side", NOISY_SIDES, ids=[s.name for s in NOISY_SIDES])
@pytest.mark.parametrize(("n", "family", "budget"), NOISY_CELLS, ids=[f"n{n}-{f}-{b}" for n, f, b in NOISY_CELLS])
def test_noisy_game(measure, dataset_type, missing_anchor, side, n, family, budget):
    skip_without_anchor(side, missing_anchor)
    made = [make_game(n, family, seed) for seed in NOISY_SEEDS]
    sigmas = [0.1 * value_range(twin) for _, twin, _ in made]
    data = dataset_type(
        f"noisy {family} n={n}, {budget:,} evaluations (sigma = 0.1 of the value range)",
        None,
        0,
        0,
        0,
        goal="goal (issue 23): MAE at least 2x below the best anchor's, coverage 93-97%",
        suite="shapley",
    )
    outcomes = []

    def run():
        outcomes.clear()
        for seed, ((_, twin, truth), sigma) in enumerate(zip(made, sigmas, strict=True)):
            game = Noisy(twin, sigma, seed)
            outcomes.append((side.run(game, budget, seed, sigma), truth, game.evaluations))

    measure(run, data=data, side=side.name, rounds=1, warmup_rounds=0, unit="ms", ours=side.reference)
    record_outcomes(f"noisy n{n} {family} {budget}", side.name, outcomes)


def record_outcomes(cell: str, side: str, outcomes: list) -> None:
    """The summary's row for one side's runs over the seeds, each (result, truth, evaluations
    spent): MAE, interval coverage (values estimated exactly, stderr 0, count as covered up to
    rounding) and the estimators masreplay picked."""
    maes, covered, spent, methods = [], [], [], set()
    for result, truth, evaluations in outcomes:
        values = getattr(result, "values", result)
        maes.append(float(np.abs(values - truth).mean()))
        spent.append(evaluations)
        if hasattr(result, "stderr"):
            methods.add(result.method)
            covered.extend(np.abs(values - truth) <= 1.96 * result.stderr + 1e-12)
    ROWS.append(
        {
            "cell": cell,
            "side": f"{side} [{'/'.join(sorted(methods))}]" if methods else side,
            "mae": float(np.mean(maes)),
            "coverage": float(np.mean(covered)) if covered else float("nan"),
            "gap": float("nan"),
            "seconds": float("nan"),
            "evaluations": int(np.median(spent)),
        }
    )


# ---- evaluations saved by fixing the orchestrator -----------------------------------------


def test_fixed_orchestrator_saves_evaluations(measure, dataset_type, eight_agent_traces):
    batch, value_fn, _ = eight_agent_traces
    data = _eight_agent_data(
        dataset_type, batch, ", orchestrator fixed", "goal: no evaluation of a coalition without the orchestrator"
    )
    plain = masreplay.trace_shapley(batch, value_fn)
    fixed = measure(
        lambda: masreplay.trace_shapley(batch, value_fn, fixed=["orchestrator"]), data=data, side="masreplay", rounds=3, unit="ms"
    )
    for label, credit in [("spawn tree", plain), ("spawn tree, fixed=['orchestrator']", fixed)]:
        ROWS.append(
            {
                "cell": f"{N_TRACES} traces x 8",
                "side": f"evaluations, {label}",
                "mae": float("nan"),
                "gap": float("nan"),
                "seconds": float("nan"),
                "evaluations": credit.total_evaluations,
            }
        )
    assert fixed.total_evaluations < plain.total_evaluations


# ---- trace games with the spawn tree respected: the simulator's ground truth -----------------

TRACE_CELLS = [(n, budget, sigma) for n in (10, 30, 100, 300) for budget in (1_000, 10_000) for sigma in (0.0, 0.1)]


def numpy_tree_orderings(values, parents: list[int], budget: int, seed: int) -> np.ndarray:
    """The precedence value by plain numpy sampling: orderings drawn uniformly among those that
    put every agent after its spawner (the next agent is any whose spawner came already, with
    probability proportional to its subtree's size), all prefixes valued in one call."""
    n = len(parents)
    subtree = np.ones(n)
    for agent in sorted(range(n), key=lambda a: -depth_of(parents, a)):
        if parents[agent] >= 0:
            subtree[parents[agent]] += subtree[agent]
    children = [[] for _ in range(n)]
    for agent, parent in enumerate(parents):
        if parent >= 0:
            children[parent].append(agent)
    rng = np.random.default_rng(seed)
    orders = []
    for _ in range(max(1, budget // (n + 1))):
        ready, order = [a for a in range(n) if parents[a] < 0], []
        while ready:
            weights = subtree[ready]
            pick = int(rng.choice(len(ready), p=weights / weights.sum()))
            order.append(ready.pop(pick))
            ready.extend(children[order[-1]])
        orders.append(order)
    orders = np.array(orders)
    ranks = np.argsort(orders, axis=1)
    prefixes = ranks[:, None, :] < np.arange(n + 1)[None, :, None]
    worth = values(prefixes.reshape(-1, n)).reshape(len(orders), n + 1)
    phi = np.zeros(n)
    np.add.at(phi, orders.ravel(), np.diff(worth, axis=1).ravel())
    return phi / len(orders)


def depth_of(parents: list[int], agent: int) -> int:
    depth = 0
    while parents[agent] >= 0:
        agent, depth = parents[agent], depth + 1
    return depth


TRACE_SIDES = {
    "masreplay precedence": lambda game, parents, budget, seed, sigma: masreplay.shapley(
        games.function(game, game.n, chunk_size=1 << 16),
        method="precedence",
        parents=parents,
        budget=budget,
        seed=seed,
        noise=sigma or None,
    ),
    "numpy tree-respecting orderings": lambda game, parents, budget, seed, sigma: numpy_tree_orderings(
        game, parents, budget, seed
    ),
}


@pytest.mark.parametrize("side", list(TRACE_SIDES))
@pytest.mark.parametrize(
    ("n", "budget", "sigma"), TRACE_CELLS, ids=[f"n{n}-{b}-{'noisy' if s else 'exact'}" for n, b, s in TRACE_CELLS]
)
def test_trace_game_precedence(measure, dataset_type, side, n, budget, sigma):
    """Precedence credit (orderings that respect the spawn tree) on the trace games, against the
    simulator's ground truth: each agent's own value, the sum of its events' contributions."""
    made = []
    for seed in SEEDS:
        parents, values = spawn_tree_trace(n, seed)
        twin = NumpySoum(trace_game(parents, values))
        made.append((twin, parents, np.array(values), sigma * value_range(twin)))
    data = dataset_type(
        f"trace game n={n}, {budget:,} evaluations, spawn tree respected"
        + (f", noisy (sigma = {sigma} of the value range)" if sigma else ""),
        None,
        0,
        0,
        0,
        goal="lower MAE than the anchor, coverage 93-97%",
        suite="shapley",
    )
    outcomes = []

    def run():
        outcomes.clear()
        for seed, (twin, parents, truth, noise) in enumerate(made):
            game = Noisy(twin, noise, seed) if noise else twin
            game.evaluations = 0
            outcomes.append((TRACE_SIDES[side](game, parents, budget, seed, noise), truth, game.evaluations))

    measure(run, data=data, side=side, rounds=1, warmup_rounds=0, unit="ms", ours=side == "masreplay precedence")
    record_outcomes(f"trace n{n} {budget}" + (" noisy" if sigma else ""), side, outcomes)
