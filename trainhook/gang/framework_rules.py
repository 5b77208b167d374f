"""The launcher's table of each framework's shape rules: the launcher runs in the user's image and cannot import
webhook/admission/frameworks/, where each framework module declares its own (`ELASTIC = True` in pytorch.py).
tests/launcher/test_gang_model.py checks that the two say the same.
"""

from __future__ import annotations

from trainhook.gang import keys

# Frameworks whose gangs may change size while they run (PyTorch: torchrun's c10d rendezvous forms the world), so
# their pods read `trainhook.dev/elastic` (TRAINHOOK_ELASTIC) and are wired for the range's maximum.
ELASTIC = frozenset({keys.PYTORCH})


def is_elastic(framework: str) -> bool:
    return framework in ELASTIC
