"""Hypothesis settings profiles, registered in one place.

``register_profiles()`` is called by the pytest plugin and the runners;
importing this module registers nothing. ``ci`` replaces Hypothesis's own
built-in ``ci`` profile. Only ``fuzz`` runs Hypothesis's target phase, which
climbs the properties' ``target()`` scores (tokens, width doublings) towards
bigger steps and wider W: with a few dozen examples that phase spends them
on near-copies of the biggest step.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, Phase, settings

SLOW_DRAWS = [HealthCheck.too_slow, HealthCheck.data_too_large]
DEFAULT_PROFILE = "dev"
CI_PROFILE = "ci"
PROFILES = ("ci", "dev", "fuzz", "gpu")
WITHOUT_TARGET_PHASE = [Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink, Phase.explain]


def register_profiles() -> None:
    # Deterministic: the same examples on every CI run, no database, no deadline
    # (the Triton interpreter and first compiles are slow and uneven).
    settings.register_profile(
        "ci",
        derandomize=True,
        database=None,
        max_examples=25,
        deadline=None,
        print_blob=True,
        phases=WITHOUT_TARGET_PHASE,
        suppress_health_check=SLOW_DRAWS,
    )
    # Local work: random, remembers failures in .hypothesis/.
    settings.register_profile(
        "dev",
        max_examples=40,
        deadline=None,
        print_blob=True,
        phases=WITHOUT_TARGET_PHASE,
        suppress_health_check=SLOW_DRAWS,
    )
    # Long runs: many examples, the database keeps every failure, steering on.
    settings.register_profile(
        "fuzz",
        max_examples=100_000,
        deadline=None,
        print_blob=True,
        phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink],
        suppress_health_check=SLOW_DRAWS,
    )
    # A GPU runs examples fast: search wider.
    settings.register_profile(
        "gpu",
        max_examples=300,
        deadline=None,
        print_blob=True,
        phases=WITHOUT_TARGET_PHASE,
        suppress_health_check=SLOW_DRAWS,
    )


def in_ci() -> bool:
    return bool(os.environ.get("CI"))


def default_profile() -> str:
    return CI_PROFILE if in_ci() else DEFAULT_PROFILE
