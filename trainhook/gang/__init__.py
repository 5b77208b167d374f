"""The gang model's one home: the shape (`role=count`, `min:max`, ranks) and the lookup of a setting across a
workload and its pod template. Shared by the webhook, the launcher, `trainhook local`, the CLI and the SDK, so
none of them parses these itself.

Part of the in-pod set (launcher/deliver.py): the standard library only, and Python 3.8. Keys and TRAINHOOK_*
names stay in trainhook/keys.py.
"""
