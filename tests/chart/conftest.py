"""Fixtures of the chart tests; the helpers are in chartlib (a unique module name: every tests folder
has a conftest)."""

from __future__ import annotations

import pytest

from chartlib import CHART, CI_VALUES


@pytest.fixture(params=[p.name for p in CI_VALUES])
def ci_file(request) -> str:
    """Each example values file in charts/baton/ci."""
    return str(CHART / "ci" / request.param)
