"""CUDA-graph replay of the selected target: a consumer captured once at
W = C reads, at every later step, exactly what the oracle consumer reads.

The scenarios are :data:`c128a.replay.scenarios.SCENARIOS`. On the CPU the
consumer is emulated (views frozen with ``as_strided``); on a CUDA device the
same tests capture real CUDA graphs, and the tests marked ``cuda`` replay a
real graph at 1M context. All are marked ``graph`` (``pytest -m graph``).
"""

from __future__ import annotations

import pytest

from c128a.replay.scenarios import LONG_MODEL_LEN, SCENARIOS, harness_for, run_scenario

pytestmark = [pytest.mark.graph, pytest.mark.conformance("replay")]


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_replay_matches_oracle_consumer(
    c128a_target, c128a_device, c128a_strict_sentinels, scenario
):
    harness = harness_for(c128a_target, c128a_device, strict_sentinels=c128a_strict_sentinels)
    outcomes = run_scenario(harness, SCENARIOS[scenario])
    assert [o.step for o in outcomes] == list(range(1, len(outcomes) + 1))


def test_replay_at_full_context_capacity(c128a_target, c128a_device, c128a_strict_sentinels):
    """Capacity 8192 (1M context): W drops from the capture's 8192 to 128 and back."""
    harness = harness_for(
        c128a_target, c128a_device, LONG_MODEL_LEN, strict_sentinels=c128a_strict_sentinels
    )
    outcomes = run_scenario(
        harness,
        [
            ([(0, 1000), (1, 2000)], [5000]),
            ([(0, LONG_MODEL_LEN - 2), (1, 2001)], []),
            ([(0, 300_000), (1, 2002), (2, 2003)], [200]),
        ],
    )
    assert [o.width for o in outcomes] == [128, 8192, 4096]


@pytest.mark.cuda
@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_cuda_graph_replay_matches_oracle_consumer(c128a_target, c128a_device, scenario):
    harness = harness_for(c128a_target, c128a_device, LONG_MODEL_LEN, mode="cuda")
    run_scenario(harness, SCENARIOS[scenario])
