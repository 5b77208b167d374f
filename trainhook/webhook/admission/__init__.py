"""Admission: the pure mutation and refusals of trainhook's webhook (AdmissionReview in, AdmissionReview
out). No I/O, no API call, no aiohttp, no kubernetes client, no notary: the import contracts in pyproject.toml hold it.
"""
