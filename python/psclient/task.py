"""A Python training process as a task of a pscoord job: RegisterTask as a
worker (or chief, or evaluator), then a heartbeat thread that reports the
step and loss the process sets, registers again when pscoord asks
(REREGISTER), and notes a STOP. The task secret RegisterTask answers with
goes with every heartbeat and with Place, which pscoord takes only from a
registered task (or an operator token), since the first placement fixes the
job's for good.

Threads and lifetime: the heartbeat thread runs from register() until
close(); progress() may be called from the training thread.
"""
from __future__ import annotations

import logging
import threading
from typing import Optional

from ._proto import pb
from ._rpc import Connection, PsError

log = logging.getLogger("psclient")

ROLES = {"chief": 1, "worker": 2, "evaluator": 4}


class Task:
    """This process's registration in a job (see the module's doc)."""

    def __init__(self, coord: Connection, job_id: str, role: str = "worker",
                 index: int = -1, address: str = "") -> None:
        if role not in ROLES:
            raise ValueError("role %r: expected one of %s" % (role, ", ".join(ROLES)))
        self.coord = coord
        self.job_id = job_id
        self.role = ROLES[role]
        self.want_index = index
        self.address = address
        self.index = -1
        self.incarnation = 0
        self.secret = ""
        self.interval = 1.0
        self.step = 0
        self.loss = 0.0
        self.examples_per_second = 0.0
        self.stop_requested = False
        self._quit = threading.Event()
        self._lock = threading.Lock()
        self._thread: Optional[threading.Thread] = None

    def register(self) -> None:
        """RegisterTask (retried while pscoord is unavailable), then starts
        the heartbeat thread."""
        r = self.coord.call("ps.v1.Coordinator", "RegisterTask", pb.RegisterRequest(
            job_id=self.job_id, role=self.role,
            index=self.index if self.index >= 0 else self.want_index,
            address=self.address, task_secret=self.secret), pb.RegisterResponse)
        self.index = r.index
        self.incarnation = r.incarnation
        self.secret = r.task_secret
        if not self.job_id:
            self.job_id = r.cluster.job_id
        if r.heartbeat_interval_ms > 0:
            self.interval = r.heartbeat_interval_ms / 1000.0
        if self._thread is None:
            self._thread = threading.Thread(target=self._beat, name="psclient-heartbeat",
                                            daemon=True)
            self._thread.start()

    def progress(self, step: int, loss: float = 0.0, examples_per_second: float = 0.0) -> None:
        """What the next heartbeat reports."""
        with self._lock:
            self.step, self.loss, self.examples_per_second = step, loss, examples_per_second

    def _beat(self) -> None:
        while not self._quit.wait(self.interval):
            with self._lock:
                req = pb.HeartbeatRequest(job_id=self.job_id, role=self.role,
                                          index=self.index, incarnation=self.incarnation,
                                          step=self.step, loss=self.loss,
                                          examples_per_second=self.examples_per_second,
                                          task_secret=self.secret)
            try:
                resp = self.coord.call("ps.v1.Coordinator", "Heartbeat", req,
                                       pb.HeartbeatResponse, timeout=max(self.interval, 5.0),
                                       retry=False)
            except PsError as e:
                log.debug("heartbeat: %s", e)
                continue
            for d in resp.directives:
                if d.kind == pb.Directive.STOP:
                    log.info("the coordinator asks this task to stop")
                    self.stop_requested = True
                elif d.kind == pb.Directive.REREGISTER:
                    try:
                        self.register()
                    except PsError as e:
                        log.warning("registering again: %s", e)

    def close(self) -> None:
        self._quit.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
