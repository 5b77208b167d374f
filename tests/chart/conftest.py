"""The chart room: charts/trainhook rendered by the real Helm (tests/support/chart_render.py) and checked against
Kubernetes' API schemas; the chart's values files are in tests/chart/data/, its value sets in chart_sets.py.
One fixture: `rendered`, every value set rendered once per session."""

import pytest

from chart_render import render_chart
from chart_sets import NAMESPACE, VALUE_SETS


@pytest.fixture(scope="session")
def rendered() -> dict[str, list[dict]]:
    return {name: render_chart(values, NAMESPACE) for name, values in VALUE_SETS.items()}
