"""A gang on a real cluster, for `trainhook submit/status/list/logs/delete` and the SDK.

client.py is the only I/O (Kubernetes API calls); status.py decides what the answers mean (ranks, outcome,
tables) as pure functions on dicts; logs.py reads a gang's logs, its pods gone or not; commands.py is the CLI.
errors.py holds what a failed call raises; reach.py words a server that cannot be reached or refuses (one line
naming it and the fix) and bounds the client's retries and timeouts.
"""
