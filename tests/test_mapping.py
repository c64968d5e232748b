"""SpecMapper is to_spec and from_spec, only faster: the same answer on every state.

The conformance check maps states through :class:`SpecMapper`, which keeps
each part's image by identity and interns the values it hands out; every
other checker calls the plain functions.  So the two must agree on every
state of a graph and every successor the reference takes from it, in the
models that give each part of the state something to say (renumbered turns
and the stored ids, forgotten keys and passed windows, key answers,
decision rows with and without their inputs), and must keep agreeing when
the part caches are emptied under them (a tiny ``limit``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from checker_support import dump_graph, model_config
from toolledger.check.mapping import SpecMapper, from_spec, spec_key, to_spec
from toolledger.check.stategraph import StateGraph
from toolledger.check.system import initial_states, successors
from toolledger.check.tlc import Outcome

MODELS = ["Renumbered", "KeyExpiry", "KeyAnswers", "LostConversation"]


@pytest.fixture(scope="module", params=MODELS)
def model(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
          ) -> tuple[str, StateGraph]:
    name: str = request.param
    result, graph = dump_graph(name, tmp_path_factory.mktemp(name))
    assert result.outcome is Outcome.PASS
    return name, graph


@pytest.mark.parametrize("limit", [100_000, 3])
def test_the_mapper_gives_the_functions_answers(model: tuple[str, StateGraph],
                                                limit: int) -> None:
    name, graph = model
    cfg = model_config(name)
    mapper = SpecMapper(cfg, limit=limit)
    mapper.adopt(graph.states.values())
    nodes = sorted(graph.states)
    if limit < 100:  # the cache emptied at every few entries: a sample is enough
        nodes = nodes[::7]
    steps = 0
    for node in nodes:
        spec_state = graph.states[node]
        ref = mapper.from_spec(spec_state)
        assert ref == from_spec(cfg, spec_state), node
        k = mapper.key(ref)
        assert k == spec_key(spec_state), node
        # interned: the key is made of the one object of each value
        assert all(a is b for a, b in zip(k, mapper.canonical(spec_key(spec_state)),
                                          strict=True)), node
        for action, nxt in successors(cfg, ref):
            assert mapper.key(nxt) == spec_key(to_spec(cfg, nxt)), (node, action)
            steps += 1
    assert mapper.to_spec(ref) == to_spec(cfg, ref)
    assert steps >= len(nodes)


def test_a_part_changed_in_place_would_be_a_different_part() -> None:
    """The caches key a part by its identity and hold it, so a state built
    anew with equal parts is mapped again, and to the same key."""
    cfg = model_config("Renumbered")
    mapper = SpecMapper(cfg)
    init = initial_states(cfg)[0]
    first = mapper.key(init)
    again = from_spec(cfg, to_spec(cfg, init))  # equal parts, new objects
    assert again.session is not init.session
    assert mapper.key(again) == first == spec_key(to_spec(cfg, init))


def test_a_broken_part_shows_in_the_mapper_too(tmp_path: Path) -> None:
    """The mapper is no second translation: a broken part function breaks
    the mapper's keys as it breaks to_spec's (the conformance check, which
    uses the mapper, relies on it to see a mapping bug)."""
    from toolledger.check import mapping

    cfg = model_config("Renumbered")
    _, graph = dump_graph("Renumbered", tmp_path)
    spec_state = graph.states[min(graph.states)]
    ref = from_spec(cfg, spec_state)
    real = mapping._rewrite_part
    mapping._rewrite_part = lambda t, s: (*real(t, s)[:2], s.renumbers + 1, s.repairs)
    try:
        assert SpecMapper(cfg).key(ref) != spec_key(spec_state)
        assert spec_key(to_spec(cfg, ref)) != spec_key(spec_state)
    finally:
        mapping._rewrite_part = real
    assert SpecMapper(cfg).key(ref) == spec_key(spec_state)
