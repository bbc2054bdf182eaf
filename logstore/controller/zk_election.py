"""The controller election of the ZooKeeper store, in Kafka's way.

Owns: standing for controller (the ephemeral ``/controller`` created and ``/controller_epoch``
moved on in one transaction, so each win has its own epoch), whether this broker is controller
and at which epoch, reading ``/controller_epoch`` (which fences the partition-state writes of a
replaced controller), and resigning (when ``/controller`` names another broker, the session
expires or the store closes), each reported to the candidate's callbacks under the election
lock. Must not: cache or watch ``/controller`` (``zookeeper.py`` does, and calls ``check``
when it changes), or let kazoo exceptions out.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from kazoo.exceptions import BadVersionError, NodeExistsError

from logstore.controller import zk_paths as zp
from logstore.controller.store import ElectedCallback, ResignedCallback
from logstore.controller.zk_session import MAX_CAS_ATTEMPTS, ZkSession
from logstore.errors import RequestTimedOutError

log = logging.getLogger(__name__)


class ZkElection:
    """This broker's candidacy; ``controller_id`` reads ``/controller`` (cached), ``announce``
    reads it back after a win and tells the metadata listeners."""

    def __init__(self, zk: ZkSession, lock: threading.RLock,
                 controller_id: Callable[[], int | None], announce: Callable[[], None]) -> None:
        self._zk = zk
        self._lock = lock  # shared with the store's registration state
        self._controller_id = controller_id
        self._announce = announce
        self._candidate: tuple[ElectedCallback, ResignedCallback | None] | None = None
        self._is_controller = False
        self._won_epoch = 0

    def elect(self, on_elected: ElectedCallback,
              on_resigned: ResignedCallback | None = None) -> None:
        with self._lock:
            self._candidate = (on_elected, on_resigned)
        self.check()

    def is_controller(self) -> bool:
        return self._is_controller

    @property
    def controller_epoch(self) -> int:
        return self._won_epoch

    def check(self) -> None:
        """Resign if ``/controller`` names someone else; stand if it is vacant. The callbacks
        run under the election lock, so an election is always reported before its end."""
        elected = False
        with self._lock:
            if self._candidate is None:
                return
            current = self._controller_id()
            if self._is_controller and current != self._zk.broker_id:
                self.resign(f"broker {current} is controller now")
            if current is None or (current == self._zk.broker_id and not self._is_controller):
                elected = self._stand(self._candidate[0])
        if elected:
            self._announce()

    def _stand(self, on_elected: ElectedCallback) -> bool:
        epoch = self._try_become_controller()
        if epoch is None:
            return False
        self._is_controller, self._won_epoch = True, epoch
        log.info("broker %d: elected controller at epoch %d", self._zk.broker_id, epoch)
        on_elected(epoch)
        return True

    def _try_become_controller(self) -> int | None:
        """Create /controller and move /controller_epoch on in one transaction; the new epoch,
        or None if another broker is controller."""
        node = zp.encode_controller(zp.ControllerZNode(self._zk.broker_id, int(time.time() * 1000)))
        for _ in range(MAX_CAS_ATTEMPTS):
            epoch, version = self.read_controller_epoch()
            tx = self._zk.transaction()
            tx.create(zp.CONTROLLER, node, ephemeral=True)
            tx.set_data(zp.CONTROLLER_EPOCH, zp.encode_controller_epoch(epoch + 1),
                        version=version)
            error = self._zk.commit(tx, "elect a controller")
            if error is None:
                return epoch + 1
            if isinstance(error, NodeExistsError):
                # Ours if an earlier attempt's answer was lost; then the epoch is ours too.
                return epoch if self._zk.owned_by_us(zp.CONTROLLER) else None
            if not isinstance(error, BadVersionError):
                raise self._zk.unexpected(error, "elect a controller")
        raise RequestTimedOutError(f"controller election lost {MAX_CAS_ATTEMPTS} races")

    def read_controller_epoch(self) -> tuple[int, int]:
        data, stat = self._zk.get(zp.CONTROLLER_EPOCH)
        return zp.decode_controller_epoch(data), stat.version

    def resign(self, reason: str) -> None:
        with self._lock:
            if not self._is_controller:
                return
            self._is_controller = False
            log.info("broker %d: no longer controller (epoch %d): %s", self._zk.broker_id,
                     self._won_epoch, reason)
            if self._candidate is not None and self._candidate[1] is not None:
                self._candidate[1]()
