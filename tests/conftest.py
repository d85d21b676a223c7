"""Shared pytest configuration: one hypothesis profile for the whole suite.

The suite must finish in minutes on a 2-core laptop, so property tests draw a
modest number of examples; `HYPOTHESIS_PROFILE=thorough` draws many more.
The learner track's checks (tutorials/exercises) run with `HYPOTHESIS_PROFILE=exercises`:
the same examples, minus the explain phase, which can take half a minute to annotate a
failure that is a stub's NotImplementedError.
"""
import os

from hypothesis import HealthCheck, Phase, settings

settings.register_profile(
    "default",
    max_examples=20,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile("thorough", max_examples=300, deadline=None)
settings.register_profile("exercises", settings.get_profile("default"),
                          phases=[p for p in Phase if p is not Phase.explain])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))
