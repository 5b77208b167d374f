"""The local room: `trainhook local` and the real trainings it runs. Most tests here need root and create network
namespaces: run them under `flock -s /tmp/trainhook-node.lock` (never while the node of tests/e2e has pods, which
is why tests/conftest.py runs tests/e2e first). Test data: tests/local/data/ (a rendezvous training and a forger).
No fixture of its own; the real webhook is tests/conftest.py's `webhook`."""
