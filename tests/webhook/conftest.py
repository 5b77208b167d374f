"""The webhook room: admission and mutation (webhook/), the frameworks' environments, the notary's decisions, the
scale check, certificates, and the server over real HTTPS (no cluster: reviews are sent as kube-apiserver sends
them). The real server is the `webhook` fixture of tests/conftest.py; objects as the controllers make them come
from tests/support/objects.py, whole expected objects from tests/support/expected.py. No fixture of its own."""
