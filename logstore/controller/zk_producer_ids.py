"""Producer id blocks in ZooKeeper (``/latest_producer_id_block``), as Kafka hands them out.

Owns: claiming the next block of producer ids with a compare-and-set of the znode that records
the last block handed out (creating it for the first block), retried when another broker won.
Must not: hand out ids within a block (the transaction coordinator does), or let kazoo
exceptions out.
"""

from __future__ import annotations

from kazoo.exceptions import BadVersionError, NodeExistsError

from logstore.controller import zk_paths as zp
from logstore.controller.zk_session import MAX_CAS_ATTEMPTS, ZkSession
from logstore.errors import RequestTimedOutError


class ZkProducerIds:
    """Producer id blocks claimed for this broker on the store's session."""

    def __init__(self, zk: ZkSession) -> None:
        self._zk = zk

    def next_block(self, size: int) -> int:
        if size <= 0:
            raise ValueError(f"producer id block size must be positive, got {size}")
        for _ in range(MAX_CAS_ATTEMPTS):
            start = self._try_claim_block(size)
            if start is not None:
                return start
        raise RequestTimedOutError(f"producer id allocation lost {MAX_CAS_ATTEMPTS} races")

    def _try_claim_block(self, size: int) -> int | None:
        """One compare-and-set of /latest_producer_id_block; None if another broker won."""
        path = zp.PRODUCER_ID_BLOCK
        found = self._zk.get_or_none(path)
        if found is None:
            block = zp.ProducerIdBlock(self._zk.broker_id, 0, size - 1)
            try:
                self._zk.op(f"create {path}", self._zk.client.create_async, path,
                            zp.encode_producer_id_block(block))
                return 0
            except NodeExistsError:
                return None
        start, stat = zp.decode_producer_id_block(found[0]).block_end + 1, found[1]
        block = zp.ProducerIdBlock(self._zk.broker_id, start, start + size - 1)
        try:
            self._zk.op(f"update {path}", self._zk.client.set_async, path,
                        zp.encode_producer_id_block(block), stat.version)
        except BadVersionError:
            return None
        return start
