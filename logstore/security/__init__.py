"""Security as Kafka models it, with no I/O: ACL bindings and the ``Authorizer`` that judges
requests by them (``acl.py``, ``authorizer.py``), the per-action authorization declarations a
Route carries (``access.py``), SCRAM credentials and the SASL exchanges (``scram.py``,
``sasl.py``), and the broker's and clients' security settings (``config.py``).

Must not: do network or file I/O, or import Arrow Flight (the transport's side of TLS and the
handshake is ``logstore/rpc/auth.py`` and ``logstore/rpc/client.py``), kazoo or the broker.
"""
