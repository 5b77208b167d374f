"""The chart room: charts/trainhook rendered by the real Helm (tests/support/chart_render.py) and checked against
Kubernetes' API schemas; the chart's values files are in tests/chart/data/. No fixture of its own."""
