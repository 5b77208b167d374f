"""The in-pod launcher (`trainhook-launch`)."""
