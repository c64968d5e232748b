"""Hypothesis profiles shared by every test module.

- ``ci``: what ``make test`` runs; derandomized and without an example database,
  so two runs of the same commit test exactly the same examples.
- ``dev``: Hypothesis' defaults, for working locally (the default here).
- ``deep``: many more and longer runs, on demand: ``HYPOTHESIS_PROFILE=deep make test``.
"""

import os

from hypothesis import settings

settings.register_profile(
    "ci",
    derandomize=True,
    database=None,
    deadline=None,
    print_blob=True,
    max_examples=200,
    stateful_step_count=50,
)
settings.register_profile("dev")
settings.register_profile("deep", max_examples=5000, stateful_step_count=200, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))
