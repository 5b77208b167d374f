"""The gang model's one home: every key and TRAINHOOK_* name (keys.py), the shape (`role=count`, `min:max`, ranks;
shape.py) and the lookup of a setting across a workload and its pod template (lookup.py). Shared by the webhook,
the launcher, `trainhook local`, the CLI and the SDK, so none of them parses these itself.

Part of the in-pod set with launcher/ (launcher/deliver.py): the standard library only, and Python 3.8.
"""
