"""Shared pytest configuration: one BLAS thread per test process, and one hypothesis
profile for the whole suite.

The suite runs one pytest-xdist worker per core (setup.cfg); a worker whose BLAS also
started a thread per core would fight the other workers (and the ranks the tests
start) for them, so each uses one, as every rank of a parallel job does (parallel.launch).
The variables are set here, before anything imports numpy, and the workers inherit them.

The suite must finish in about three minutes on a 2-core laptop, so property tests draw
a modest number of examples, derandomised (the same examples every run, so a failure
reproduces); `HYPOTHESIS_PROFILE=deep` draws ten times as many, also derandomised (CI
must not pass or fail by luck), and .ci/run runs the suite that way after the everyday
command. The learner track's checks (tutorials/exercises) run with
`HYPOTHESIS_PROFILE=exercises`: the default examples, minus the explain phase, which can
take half a minute to annotate a failure that is a stub's NotImplementedError.
"""
import os

for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(var, "1")

from hypothesis import HealthCheck, Phase, settings  # noqa: E402

settings.register_profile(
    "default",
    max_examples=10,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile("deep", settings.get_profile("default"), max_examples=100)
settings.register_profile("exercises", settings.get_profile("default"),
                          phases=[p for p in Phase if p is not Phase.explain])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))
