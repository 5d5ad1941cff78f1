"""A Python training process as a task of a pscoord job: RegisterTask as a
worker (or chief, or evaluator), then a heartbeat thread that reports the
step and loss the process sets, registers again when pscoord asks
(REREGISTER), and notes a STOP. The task secret RegisterTask answers with
goes with every heartbeat and with Place, which pscoord takes only from a
registered task (or an operator token), since the first placement fixes the
job's for good.

Which task this process is comes from the environment when the caller
does not say (from_environment): TF_CONFIG, as TensorFlow and Kubeflow's
TFJob set it, else RANK and WORLD_SIZE, as torchrun and Kubeflow's
PyTorchJob set them.

Threads and lifetime: the heartbeat thread runs from register() until
close(); progress() may be called from the training thread.
"""
from __future__ import annotations

import json
import logging
import os
import threading
from dataclasses import dataclass, field
from typing import List, Mapping, Optional

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


@dataclass
class TaskEnv:
    """This process's task as its environment names it. coordinator: the
    chief's address (pscoord does the chief's duties) or $PSCOORD_ADDR;
    ps: the ps addresses by index; source: "TF_CONFIG" or "RANK"."""
    role: str
    index: int
    num_workers: int
    source: str
    coordinator: Optional[str] = None
    ps: List[str] = field(default_factory=list)
    job_id: str = ""


def from_environment(env: Optional[Mapping[str, str]] = None) -> Optional[TaskEnv]:
    """The task of TF_CONFIG, else of RANK and WORLD_SIZE, else None.
    Raises ValueError with one line naming the variable when it is not
    what TensorFlow (or torchrun) would accept: a chief or ps task (their
    duties are pscoord's and psd's), an index out of range."""
    env = os.environ if env is None else env
    raw = env.get("TF_CONFIG", "")
    if raw.strip():
        try:
            tf = json.loads(raw)
            cluster = tf["cluster"]
            task = tf.get("task", {})
            role = task.get("type", "worker")
            index = int(task.get("index", 0))
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise ValueError("TF_CONFIG: not a TensorFlow cluster spec (%s)" % e) from None
        if role in ("chief", "ps"):
            raise ValueError("TF_CONFIG names this task %s[%d]: run %s for it" % (
                role, index, "psd" if role == "ps" else "pscoord (the chief's duties)"))
        if role not in ROLES:
            raise ValueError("TF_CONFIG: task type %r is not worker or evaluator" % role)
        n = len(cluster.get(role, []))
        # An evaluator may be outside the training cluster, as TensorFlow has it.
        if not 0 <= index < n and not (role == "evaluator" and n == 0 and index >= 0):
            raise ValueError("TF_CONFIG: task %s[%d], but the cluster lists %d %s task(s)"
                             % (role, index, n, role))
        chief = cluster.get("chief", [])
        return TaskEnv(role=role, index=index, source="TF_CONFIG",
                       num_workers=max(len(cluster.get("worker", [])), 1),
                       coordinator=chief[0] if chief else env.get("PSCOORD_ADDR") or None,
                       ps=list(cluster.get("ps", [])), job_id=str(tf.get("job_id", "")))
    if "RANK" in env or "WORLD_SIZE" in env:
        try:
            rank, size = int(env.get("RANK", "")), int(env.get("WORLD_SIZE", ""))
        except ValueError:
            raise ValueError("RANK=%r, WORLD_SIZE=%r: expected two integers, "
                             "0 <= RANK < WORLD_SIZE" % (env.get("RANK"), env.get("WORLD_SIZE"))
                             ) from None
        if not 0 <= rank < size:
            raise ValueError("RANK=%d is out of range for WORLD_SIZE=%d" % (rank, size))
        return TaskEnv(role="worker", index=rank, num_workers=size, source="RANK",
                       coordinator=env.get("PSCOORD_ADDR") or None)
    return None
