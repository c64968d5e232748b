"""Hypothesis profiles shared by every test module.

- ``ci``: what ``make test`` runs; derandomized and without an example database,
  so two runs of the same commit test exactly the same examples.
- ``dev``: Hypothesis' defaults, for working locally (the default here).
- ``deep``: many more and longer runs, on demand: ``HYPOTHESIS_PROFILE=deep make test``.
"""

import os
from collections.abc import Iterator

import pytest
from hypothesis import settings

from pg_cluster import NoPostgres, PgCluster

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


# --------------------------------------------------------------------------
# A real PostgreSQL server, once per pytest session (tests/pg_cluster.py)
# --------------------------------------------------------------------------


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[PgCluster]:
    """A throwaway cluster started on first use and stopped (fast) at the end.

    Without server binaries every test using it FAILS with what to install:
    a PostgreSQL store that was never run must not look green.
    """
    try:
        cluster = PgCluster()
    except NoPostgres as exc:
        pytest.fail(str(exc), pytrace=False)
    with cluster:
        yield cluster
