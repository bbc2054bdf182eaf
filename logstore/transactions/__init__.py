"""The transaction coordinator (KIP-98 with KIP-447's group fencing, KIP-890 part 1's
verification, and two-phase participation in the spirit of KIP-939), as pure state machines
over the partitions of ``__transaction_state``: ``state.py`` (one id's metadata and its
transitions), ``log_records.py`` (the topic's records), ``coordinator.py`` (a partition's shard,
its replay, the marker jobs owed, the admin reads), ``handlers.py`` (the API) and
``timeouts.py`` (the tick). The broker side (routes, marker sending, verification) is
``broker/txn_*.py``; the log side (markers, LSO, read_committed) is ``segments/``.
"""
