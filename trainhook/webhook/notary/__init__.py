"""The notary: the webhook's second listener that gives gang members their key and records on their gang's behalf
(docs/operate/security.md). service.py is the HTTP side and the order of I/O; membership.py and records.py the pure
decisions; authority.py what it asks of the cluster; cluster.py and local.py the two authorities.
"""
