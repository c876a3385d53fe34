"""One list per vocabulary: the core's names (what it parses arguments and trace fields by)
equal the Python Literal types' arguments, name for name and in order."""

import typing

import pytest

import masreplay
from masreplay import _core, vocabulary
from masreplay.errors import InvalidArgumentError

PAIRS = [
    ("EVENT_TYPES", vocabulary.EventType),
    ("EDGE_TYPES", vocabulary.EdgeType),
    ("TOPOLOGIES", vocabulary.Topology),
    ("COUNTERFACTUAL_KINDS", vocabulary.CounterfactualKind),
    ("ESTIMATORS", vocabulary.Estimator),
    ("STRATA", vocabulary.Stratum),
    ("UNITS", vocabulary.Unit),
    ("RETURN_KINDS", vocabulary.ReturnKind),
    ("SAMPLERS", vocabulary.Sampler),
    ("BASELINES", vocabulary.Baseline),
    ("SHAPLEY_METHODS", vocabulary.ShapleyMethod),
    ("SHAPLEY_SURROGATES", vocabulary.ShapleySurrogate),
]


@pytest.mark.parametrize(("name", "literal"), PAIRS, ids=[name for name, _ in PAIRS])
def test_core_names_equal_the_literal(name, literal):
    core = getattr(_core, name)
    assert isinstance(core, tuple) and all(isinstance(entry, str) for entry in core)
    assert core == typing.get_args(literal) == getattr(vocabulary, name)


def test_package_exports_the_contract_vocabularies():
    for name in ("EVENT_TYPES", "EDGE_TYPES", "TOPOLOGIES", "ESTIMATORS", "STRATA"):
        assert getattr(masreplay, name) == getattr(_core, name)
        assert name in masreplay.__all__
    assert masreplay.EVENT_TYPES[0] == "orchestrator_decision" and masreplay.STRATA[-1] == "event_type"


def test_an_unknown_name_is_refused_with_the_names_allowed():
    with pytest.raises(InvalidArgumentError, match="unknown sampler 'greedy': expected one of 'uniform', 'prioritized'"):
        masreplay.GraphBuffer(4, unit="traces")._core.sample(1, sampler="greedy")
    with pytest.raises(InvalidArgumentError, match="unknown unit 'bytes'"):
        _core.GraphBuffer(4, unit="bytes")
    batch = masreplay.sim.generate(2, seed=0)
    with pytest.raises(InvalidArgumentError, match="unknown baseline 'median': expected one of 'mean', 'loo'"):
        _core.counterfactual_credit(batch._core, channel="team", baseline="median")


def test_a_name_that_is_not_a_string_is_a_type_error():
    with pytest.raises(TypeError):
        _core.GraphBuffer(4, unit=3)
