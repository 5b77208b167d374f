"""The CLI room: `trainhook` render, convert, explain, status/list/logs over the objects an API server returns,
and the Python SDK, without a cluster (the same commands against a real API server are in tests/cluster).
Rendered manifests are checked by tests/support/rendered.py. No fixture of its own."""
