"""A client of a whole psd job: the shards from a list of addresses or from
pscoord, the model's variables placed over them as workerd places them
(split by rows when large), numpy arrays in and out, push with the values
back in one round trip, sync steps, and retries across a psd restart.

    from psclient import Client, Variable, Initializer, Optimizer
    with Client(["127.0.0.1:7070", "127.0.0.1:7071"]) as c:
        c.create_variables([Variable("w", (784, 10), Initializer.glorot_uniform(1)),
                            Variable("b", (10,))], optimizer=Optimizer.sgd(0.1))
        values = c.pull()                              # {"w": ndarray, "b": ndarray}
        res = c.push({"w": gw, "b": gb}, return_values=True)
        res.values["w"], res.versions["w"]

Threads and lifetime: one Client is used by one thread at a time (it keeps
the sync step and the shared-memory regions); give each thread its own.
Calls to different shards run in parallel on the client's own threads.
close() (or leaving the with block) ends every channel.
"""
from __future__ import annotations

import concurrent.futures
import logging
import time
import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import grpc
import numpy as np

from . import half as _half
from . import placement as _place
from . import sparse as _sparse
from ._proto import health, pb
from ._rpc import Connection, PsError, Retry, TLS, read_token
from .shm import Region, is_local_socket, local_route
from .sparse import SparsePushResult, SparseValues
from .specs import Initializer, Optimizer, SparseTable, Variable, consistency_pb, row_dtype_pb
from .task import Task, TaskEnv, from_environment

log = logging.getLogger("psclient")

# A failed call whose answer never came: it may have reached psd, which
# applies what it has received whatever the client's deadline.
_MAYBE_APPLIED = (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED,
                  grpc.StatusCode.UNKNOWN)

PS = "ps.v1.ParameterServer"
COORD = "ps.v1.Coordinator"
# How long a task that is not the chief waits for the chief's placement.
PLACEMENT_WAIT_S = 120.0


class Values(_sparse.Versioned):
    """Variables' values by name, with the version each was read at
    (`versions`; for a split variable, the lowest of its parts')."""


@dataclass
class PushResult:
    """What a push did: each variable's version once the push was applied
    (for a split variable, the lowest of its parts'), the values when asked
    for (return_values), the step it was pushed as, and whether it was a
    sync push refused as stale (the client then rejoined at the variables'
    step and pushed the gradient again at it, as workerd does; `values`
    holds the values after that step)."""
    versions: Dict[str, int]
    values: Optional[Values]
    step: int
    stale: bool = False


class _Shard:
    """One psd of the job: its connection, its sync step, its shm region."""

    def __init__(self, index: int, conn: Connection, shm: bool) -> None:
        self.index = index
        self.conn = conn
        self.want_shm = shm and is_local_socket(conn.address)
        self.region: Optional[Region] = None
        self.offsets: Dict[str, int] = {}   # part name -> byte offset (gradient half)
        self.half = 0                       # bytes of the gradient half
        self.sync_step = 0

    def call(self, name: str, req: Any, resp_cls: Any, timeout: Optional[float] = None,
             retry: bool = True, token: Optional[str] = None) -> Any:
        return self.conn.call(PS, name, req, resp_cls, timeout=timeout, retry=retry,
                              token=token)

    def layout(self, parts: Sequence[Tuple[str, int]]) -> None:
        """Lays the parts (name, bytes) of this shard out in its region."""
        at = 0
        for name, nbytes in parts:
            self.offsets[name] = at
            at += (nbytes + 63) // 64 * 64
        self.half = at

    def shm_region(self) -> Optional[Region]:
        if not self.want_shm or self.half == 0:
            return None
        if self.region is None:
            self.region = Region(2 * self.half)
        return self.region

    def shm_refused(self, e: PsError) -> bool:
        """Turns shm off for good if psd refused it; whether it did."""
        if e.code == grpc.StatusCode.FAILED_PRECONDITION and \
                e.details.startswith("shared memory"):
            log.warning("psd at %s cannot use this process's shared memory (%s); "
                        "sending tensors inline", self.conn.address, e.details)
            self.want_shm = False
            if self.region is not None:
                self.region.close()
                self.region = None
            return True
        return False


@dataclass
class Checkpoint:
    """One shard's checkpoint: the directory psd wrote (absolute, on its
    host), the step it was taken at, and its size."""
    shard: int
    address: str
    path: str
    step: int
    bytes: int


@dataclass
class Restored:
    """One shard's restore: the checkpoint's step and how many variables
    (dense and sparse tables) it held."""
    shard: int
    address: str
    step: int
    variables: int
    sparse_tables_converted: int = 0   # with sparse_row/slot_dtype: tables of another dtype
    sparse_rows_converted: int = 0


@dataclass
class VariableInfo:
    """A variable or sparse table on one shard (a split variable has one
    per part; `name` is the part's). shape: the part's ([dim] for a sparse
    table); optimizer, consistency: their proto names in lower case. For a
    sparse table: its rows stored, their bytes as stored, and the rows the
    RAM tier holds and their bytes (0 for a dense variable)."""
    shard: int
    address: str
    name: str
    shape: Tuple[int, ...]
    sparse: bool
    version: int
    value_bytes: int
    slot_bytes: int
    optimizer: str
    consistency: str
    sparse_rows: int = 0
    sparse_disk_bytes: int = 0
    sparse_ram_rows: int = 0
    sparse_ram_bytes: int = 0


def _stats_class() -> Any:
    """A dataclass of proto/ps.proto's StatsResponse (its fields as plain
    ints, floats, bools and strings) with the shard's index and address
    first: made from the descriptor so that fields psd gains appear."""
    kinds = {"TYPE_DOUBLE": float, "TYPE_FLOAT": float, "TYPE_BOOL": bool,
             "TYPE_STRING": str}
    fields: List[Any] = [("shard", int), ("address", str)]
    for f in pb.StatsResponse.DESCRIPTOR.fields:
        tname = next((k for k in kinds if getattr(f, k, None) == f.type), None)
        fields.append((f.name, kinds[tname] if tname else int))
    cls = dataclasses.make_dataclass("ShardStats", fields)
    cls.__doc__ = ("One shard's Stats (proto/ps.proto's StatsResponse, field by field), "
                   "with its index and address.")
    cls.__module__ = __name__
    return cls


ShardStats = _stats_class()


def _token_arg(token_file: Optional[str]) -> Optional[str]:
    from ._rpc import read_token as _read
    return _read(token_file) if token_file is not None else None


def _tensor(a: np.ndarray) -> Any:
    return pb.Tensor(dtype=pb.DTYPE_FLOAT32, shape=list(a.shape), data=a.tobytes())


class Client:
    """A client of one psd job.

    addresses: the psd shards in index order ("host:port" or "unix:PATH"),
    or coordinator: pscoord's address, whose GetCluster gives them (and
    whose Place gives the placement). worker: this process's task index
    (sync steps count distinct workers by it; default 0, or with register
    the one pscoord assigns). register: "worker", "chief" or "evaluator":
    join the coordinator's job as that task (RegisterTask and heartbeats,
    see psclient.task), which pscoord requires of whoever proposes the
    job's placement first (Place). tls / token_file (or token):
    transport security and the bearer token sent as "authorization: Bearer
    ..." with every call. timeout: seconds per call (a sync push waits six
    times as long for the other workers). retry: backoff for UNAVAILABLE.
    split_threshold: variables above it (bytes) are split by rows over all
    shards, as pscoord's --split-threshold (without a coordinator).
    shm: move tensors through shared memory with shards reached over a unix
    socket; a shard given by its TCP address, or by a coordinator, that runs
    on this host (the same host id, common/hostid.h) and advertises its
    socket (psd's default, --local-socket; Stats.local_address) is reached
    through that socket.
    wire_dtype: "bf16" or "fp16" sends gradients and takes values in half
    precision (half the bytes; psd keeps float32 values and optimizer
    state), "f32" (default) float32; shared memory is always float32.
    error_feedback: with a half wire_dtype, keep each variable's rounding
    residual and add it to its next gradient (default), so that nothing is
    lost over time; False rounds each gradient alone. A push that raises
    leaves the gradients psd did not apply in the residuals, for the next
    push to send: do not push the same gradients again (doc/python.md).

    Given neither addresses nor coordinator, the task comes from the
    environment (psclient.task.from_environment): TF_CONFIG's chief is the
    coordinator (else its ps tasks are the addresses), its task the role
    and index; or RANK and WORLD_SIZE, with $PSCOORD_ADDR. An argument that
    disagrees with it raises ValueError naming both.
    """

    def __init__(self, addresses: Optional[Sequence[str]] = None, *,
                 coordinator: Optional[str] = None, job_id: str = "",
                 worker: Optional[int] = None, register: Optional[str] = None,
                 tls: Optional[TLS] = None, token_file: Optional[str] = None,
                 token: Optional[str] = None, timeout: float = 30.0,
                 retry: Retry = Retry(), split_threshold: int = _place.SPLIT_DEFAULT,
                 shm: bool = False, wait_for_shards: float = 60.0,
                 wire_dtype: str = "f32", error_feedback: bool = True) -> None:
        self.task_env: Optional[TaskEnv] = None
        if addresses is None and coordinator is None:
            self.task_env = from_environment()
        if self.task_env is not None:
            te = self.task_env
            if worker is not None and worker != te.index:
                raise ValueError("%s names this task %s[%d] but worker=%d"
                                 % (te.source, te.role, te.index, worker))
            if te.coordinator:
                coordinator = te.coordinator
                if register is None:
                    register = te.role
            elif te.ps:
                addresses = te.ps
            if worker is None:
                worker = te.index
            if not job_id:
                job_id = te.job_id
        if (addresses is None) == (coordinator is None):
            raise ValueError("give either addresses (the psd shards) or coordinator "
                             "(pscoord's address), not both or neither")
        if token_file is not None:
            if token is not None:
                raise ValueError("give token or token_file, not both")
            token = read_token(token_file)
        self._conn_args = dict(tls=tls, token=token, retry=retry, timeout=timeout)
        self.wire_dtype = _half.wire_dtype(wire_dtype)
        self.feedback = _half.ErrorFeedback() if error_feedback else None
        self._shm = shm
        self.worker = worker if worker is not None else 0
        self.job_id = job_id
        self.task: Optional[Task] = None
        self.timeout = timeout
        self.split_threshold = split_threshold
        self.step = 0
        self.consistency = "async"
        self.variables: Dict[str, _place.Placement] = {}
        self.sparse_tables: Dict[str, int] = {}   # sparse table -> dim
        self.sparse_row_dtypes: Dict[str, int] = {}   # sparse table -> ps.v1.DType of its rows
        self.sparse_step = 0
        self._part_shapes: Dict[str, Tuple[int, ...]] = {}
        self.coord: Optional[Connection] = None
        if coordinator is not None:
            self.coord = Connection(coordinator, **self._conn_args)  # type: ignore[arg-type]
            if register is not None:
                if not self.job_id:  # RegisterTask must name it
                    self.job_id = self.cluster().job_id
                self.task = Task(self.coord, self.job_id, register,
                                 worker if worker is not None else -1)
                self.task.register()
                self.worker = self.task.index
                self.job_id = self.task.job_id
            addresses = self._learn_shards(wait_for_shards)
        elif register is not None:
            raise ValueError("register needs a coordinator")
        assert addresses is not None
        if len(addresses) == 0:
            raise ValueError("no psd addresses")
        if coordinator is None and shm:
            addresses = [self._route_local(i, a) for i, a in enumerate(addresses)]
        self.shards = [_Shard(i, Connection(a, **self._conn_args), shm)  # type: ignore[arg-type]
                       for i, a in enumerate(addresses)]
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=len(self.shards), thread_name_prefix="psclient")

    # ---- the job ----------------------------------------------------------

    def _learn_shards(self, wait: float) -> List[str]:
        """The ps addresses by index from pscoord, once every ps task of the
        job has one (waiting up to `wait` seconds)."""
        assert self.coord is not None
        until = time.monotonic() + wait
        while True:
            cs = self.coord.call(COORD, "GetCluster", pb.GetClusterRequest(job_id=self.job_id),
                                 pb.ClusterState)
            n = cs.num_ps
            got: Dict[int, str] = {}
            why: Dict[int, str] = {}
            for t in cs.tasks:
                if t.role == pb.PS and t.index < n and t.address and t.index not in got:
                    # With shm, a shard on this host through its unix socket.
                    why[t.index] = (local_route(t.local_address, t.host_id)
                                    if self._shm else "shm off")
                    got[t.index] = t.local_address if not why[t.index] else t.address
            if n > 0 and len(got) == n:
                for i in range(n):
                    log.info("ps[%d]: %s%s", i, got[i], " (on this host: shared memory)"
                             if not why[i] else " over TCP (%s)" % why[i])
                if not self.job_id:
                    self.job_id = cs.job_id
                return [got[i] for i in range(n)]
            if time.monotonic() >= until:
                raise PsError(grpc.StatusCode.UNAVAILABLE,
                              "%d of %d ps tasks have an address after %.0f s"
                              % (len(got), n, wait), self.coord.address, "GetCluster")
            time.sleep(0.2)

    def _route_local(self, index: int, address: str) -> str:
        """The psd at address through its unix socket when it advertises one
        in Stats with this host's id (as workerd and libpsclient do:
        ps_client_local_route), else address."""
        if is_local_socket(address):
            return address
        conn = Connection(address, **self._conn_args)  # type: ignore[arg-type]
        try:
            st = conn.call(PS, "Stats", pb.StatsRequest(), pb.StatsResponse,
                           timeout=min(self.timeout, 5.0), retry=False)
            why = (local_route(st.local_address, st.host_id) if st.local_address
                   else "psd advertises no local socket (--local-socket off)")
        except PsError as e:
            why = "Stats: %s" % e.details
        finally:
            conn.close()
        if why:
            log.info("ps[%d]: %s over TCP (%s)", index, address, why)
            return address
        log.info("ps[%d]: %s through its unix socket %s (on this host: shared memory)",
                 index, address, st.local_address)
        return str(st.local_address)

    @property
    def addresses(self) -> List[str]:
        return [s.conn.address for s in self.shards]

    def _placement(self, variables: Sequence[Variable]) -> List[_place.Placement]:
        pairs = [(v.name, v.shape) for v in variables]
        _place.check(pairs)
        if self.coord is None:
            return _place.place(pairs, len(self.shards), self.split_threshold)
        # The job's placement when it is made already and holds this model
        # (GetCluster is open to readers; Place, which fixes it, may need a
        # worker's task secret or an operator token), else Place.
        want = {n: tuple(int(d) for d in s) for n, s in pairs}
        placed = {vp.name: vp for vp in self.cluster().placement}
        # pscoord makes the first placement only for the chief (worker 0 or
        # a chief task) or an operator: another task waits for it.
        chief = self.task is None or self.task.role == 1 or (
            self.task.role == 2 and self.task.index == 0)
        deadline = time.monotonic() + PLACEMENT_WAIT_S
        while not placed and not chief and time.monotonic() < deadline:
            time.sleep(0.25)
            placed = {vp.name: vp for vp in self.cluster().placement}
        if placed and all(n in placed and tuple(placed[n].shape) == s
                          for n, s in want.items()):
            answer = [placed[n] for n, _ in pairs]
        else:
            req = pb.PlaceRequest(job_id=self.job_id, variables=[
                pb.VariablePlacement(name=n, shape=list(s)) for n, s in pairs])
            # pscoord with task secrets takes Place only from a registered
            # task, named by its role and index (older contracts have no
            # such fields).
            fields = req.DESCRIPTOR.fields_by_name
            if self.task is not None and "task_secret" in fields:
                setattr(req, "task_secret", self.task.secret)
            if self.task is not None and "role" in fields:
                setattr(req, "role", self.task.role)
                setattr(req, "index", self.task.index)
            answer = list(self.coord.call(COORD, "Place", req, pb.PlaceResponse).placement)
        out = []
        for vp in answer:
            parts = tuple(_place.Part(p.name, p.shard, p.row_begin, p.row_end)
                          for p in vp.parts)
            for p in parts:
                if p.shard >= len(self.shards):
                    raise PsError(grpc.StatusCode.FAILED_PRECONDITION,
                                  "the placement puts '%s' on shard %d; the job has %d"
                                  % (p.name, p.shard, len(self.shards)),
                                  self.coord.address, "Place")
            out.append(_place.Placement(vp.name, tuple(vp.shape), parts))
        return out

    def create_variables(self, variables: Sequence[Variable], *,
                         optimizer: Optimizer = Optimizer(),
                         consistency: str = "async", num_workers: int = 0,
                         staleness: int = 0) -> Dict[str, _place.Placement]:
        """Places the variables over the shards (as workerd would, or as
        pscoord answers) and creates each part on its shard. Idempotent: every
        worker of a job calls it with the same model; a variable that exists
        with another spec raises PsError ALREADY_EXISTS naming the difference.
        consistency: "async", "sync" (num_workers pushes per step; 0 = psd's
        --workers) or "bounded_staleness". Returns the placement by name."""
        cons = consistency_pb(consistency)
        placed = self._placement(variables)
        byname = {v.name: v for v in variables}
        jobs: Dict[int, List[Any]] = {}
        for pl in placed:
            v = byname[pl.name]
            init = v.initializer or Initializer.zeros()
            opt = (v.optimizer or optimizer).to_pb()
            for k, part in enumerate(pl.parts):
                shape = list(pl.shape)
                if shape:
                    shape[0] = part.row_end - part.row_begin
                spec = pb.VariableSpec(
                    name=part.name, dtype=pb.DTYPE_FLOAT32, shape=shape,
                    initializer=init.for_part(k, len(pl.parts), pl.shape).to_pb(),
                    optimizer=opt, consistency=cons, num_workers=num_workers,
                    staleness=staleness)
                jobs.setdefault(part.shard, []).append(spec)

        def create(shard: int) -> None:
            for spec in jobs[shard]:
                self.shards[shard].call("CreateVariable",
                                        pb.CreateVariableRequest(spec=spec),
                                        pb.CreateVariableResponse)
        self._each(sorted(jobs), create)
        self._adopt(placed)
        self.consistency = consistency
        return {pl.name: pl for pl in placed}

    def attach(self, variables: Sequence[Variable],
               consistency: str = "async") -> Dict[str, _place.Placement]:
        """Places the variables as create_variables does but creates
        nothing: for a reader (an evaluator) that must not fix the
        variables' specs, or a client whose psd is not up yet. A variable
        that is missing on its shard then fails the first call with
        NOT_FOUND."""
        consistency_pb(consistency)
        placed = self._placement(variables)
        self._adopt(placed)
        self.consistency = consistency
        return {pl.name: pl for pl in placed}

    def _adopt(self, placed: Sequence[_place.Placement]) -> None:
        for pl in placed:
            self.variables[pl.name] = pl
            for p in pl.parts:
                self._part_shapes[p.name] = \
                    (p.row_end - p.row_begin,) + pl.shape[1:] if pl.shape else ()
        for sh in self.shards:
            sh.layout([(p.name, 4 * _place.elements(self._part_shapes[p.name]))
                       for pl in self.variables.values() for p in pl.parts
                       if p.shard == sh.index])

    def _each(self, shards: Sequence[int], fn: Callable[[int], Any]) -> Dict[int, Any]:
        """Runs fn(shard) for each shard, in parallel when several; raises
        the first failure (by shard order)."""
        if len(shards) == 1:
            return {shards[0]: fn(shards[0])}
        futs = {s: self._pool.submit(fn, s) for s in shards}
        return {s: f.result() for s, f in futs.items()}

    # ---- pull and push ----------------------------------------------------

    def _known(self, name: str) -> _place.Placement:
        pl = self.variables.get(name)
        if pl is None:
            raise KeyError("variable '%s' is not one of this client's (create_variables "
                           "first; it has %d)" % (name, len(self.variables)))
        return pl

    def _check_grad(self, name: str, g: Any) -> np.ndarray:
        """The gradient as a C-ordered little-endian float32 array, refused
        before it is sent when its dtype or shape is not the variable's."""
        pl = self._known(name)
        a = np.asarray(g)
        if a.dtype != np.float32:
            raise TypeError("variable '%s': gradient dtype is %s, the variable is float32"
                            % (name, a.dtype))
        if tuple(a.shape) != pl.shape:
            raise ValueError("variable '%s': gradient shape is %s, the variable's is %s"
                             % (name, list(a.shape), list(pl.shape)))
        return np.ascontiguousarray(a, dtype="<f4")

    def _value(self, sh: _Shard, v: Any, shape: Tuple[int, ...]) -> np.ndarray:
        t = v.value
        if t.shm.name:
            region = sh.region
            assert region is not None
            off = t.shm.offset // 4
            return region.floats[off:off + t.shm.length // 4].reshape(shape).copy()
        if t.dtype in (pb.DTYPE_FLOAT16, pb.DTYPE_BFLOAT16):
            return _half.from_half(np.frombuffer(t.data, dtype="<u2"),
                                   t.dtype).reshape(shape)
        return np.frombuffer(t.data, dtype="<f4").reshape(shape)

    def _assemble(self, per_shard: Dict[int, List[Tuple[str, Any]]],
                  names: Sequence[str]) -> Values:
        """Builds whole values from the parts' VariableValues."""
        out = Values()
        got = {}
        for s, items in per_shard.items():
            for (part, v) in items:
                got[part] = (s, v)
        for name in names:
            pl = self.variables[name]
            if len(pl.parts) == 1:
                s, v = got[pl.parts[0].name]
                out[name] = self._value(self.shards[s], v, pl.shape)
                out.versions[name] = v.version
                continue
            whole = np.empty(pl.shape, dtype=np.float32)
            vers: List[int] = []
            for p in pl.parts:
                s, v = got[p.name]
                rows = (p.row_end - p.row_begin,) + pl.shape[1:]
                whole[p.row_begin:p.row_end] = self._value(self.shards[s], v, rows)
                vers.append(int(v.version))
            out[name] = whole
            out.versions[name] = min(vers)
        return out

    def _parts_by_shard(self, names: Sequence[str]) -> Dict[int, List[Tuple[str, _place.Part]]]:
        by: Dict[int, List[Tuple[str, _place.Part]]] = {}
        for name in names:
            for p in self._known(name).parts:
                by.setdefault(p.shard, []).append((name, p))
        return by

    def pull(self, names: Optional[Sequence[str]] = None, *, min_version: int = 0,
             timeout: Optional[float] = None, step: int = 0,
             worker: Optional[int] = None) -> Values:
        """The values of names (default: every variable), whole, as float32
        arrays of their shapes. min_version waits (within the timeout) until
        each part has at least that version. step (bounded staleness): this
        worker's clock, the steps it has pushed; psd answers once every live
        worker is at least step - staleness, or raises PsError
        DEADLINE_EXCEEDED naming the slowest; 0 (a reader) is never held.
        worker: the worker the clock is of (None: the client's)."""
        clock = dict(worker=self.worker if worker is None else worker, step=step) \
            if step else {}
        names = list(self.variables) if names is None else list(names)
        by = self._parts_by_shard(names)

        def pull_shard(s: int) -> List[Tuple[str, Any]]:
            sh = self.shards[s]
            while True:
                region = sh.shm_region()
                items = []
                for _, p in by[s]:
                    into = None
                    if region is not None:
                        into = pb.ShmRef(name=region.name, offset=sh.half + sh.offsets[p.name],
                                         length=4 * _place.elements(self._part_shape(p)))
                    wire = self.wire_dtype if into is None else pb.DTYPE_FLOAT32
                    items.append(pb.PullItem(name=p.name, min_version=min_version, into=into,
                                             wire_dtype=wire))
                try:
                    resp = sh.call("Pull", pb.PullRequest(items=items, **clock),
                                   pb.PullResponse, timeout=timeout)
                except PsError as e:
                    if region is not None and sh.shm_refused(e):
                        continue
                    raise
                return [(p.name, v) for (_, p), v in zip(by[s], resp.values)]
        return self._assemble(self._each(sorted(by), pull_shard), names)

    def _part_shape(self, p: _place.Part) -> Tuple[int, ...]:
        return self._part_shapes[p.name]

    def push(self, grads: Mapping[str, Any], *, step: Optional[int] = None,
             return_values: bool = False, timeout: Optional[float] = None,
             delta: bool = False) -> PushResult:
        """Pushes gradients (float32 arrays of the variables' shapes, by
        name); each shard gets one PushRequest with its parts, in parallel.
        return_values: also bring each variable's value once the push is
        applied (sync: once the step's aggregate is), in the same round trip.
        step: the step to push as; None: the client's own (async: a counter;
        sync: the step the variables aggregate, which it follows; a push
        refused as stale rejoins the variables' step and is sent again at it
        instead of failing: dropped, a shard could wait for this worker's
        next push while the worker waits on another shard whose step waits
        for a worker stuck on the first).
        delta: each array is a change of the value, added as w += d with no
        optimizer (local SGD; psd refuses it for sync variables).
        With error feedback, a push that raises, or is stale twice, leaves
        what psd did not apply in the residuals, and the next push sends it."""
        checked = {n: self._check_grad(n, g) for n, g in grads.items()}
        if not checked:
            raise ValueError("push: no gradients")
        names = list(checked)
        by = self._parts_by_shard(names)
        sync = self.consistency == "sync"
        t = timeout if timeout is not None else self.timeout * (6 if sync else 1)

        def push_shard(s: int) -> Tuple[List[Tuple[str, Any]], List[Tuple[str, int]], bool]:
            sh = self.shards[s]
            st = step if step is not None else (sh.sync_step if sync else self.step)
            again = False  # sent again at the variables' step after a stale refusal
            # Each part's rounding, made once a push: a call sent again
            # carries the same bits, and a failed one gives them back.
            halves: Dict[str, np.ndarray] = {}
            while True:
                rv = return_values or again
                region = sh.shm_region()
                gs = []
                for name, p in by[s]:
                    a = checked[name]
                    rows = a[p.row_begin:p.row_end] if a.ndim else a
                    g = pb.Gradient(name=p.name)
                    if region is not None:
                        off = sh.offsets[p.name]
                        n = rows.size
                        region.floats[off // 4:off // 4 + n] = rows.reshape(-1)
                        g.grad.CopyFrom(pb.Tensor(dtype=pb.DTYPE_FLOAT32, shape=list(rows.shape),
                                                  shm=pb.ShmRef(name=region.name, offset=off,
                                                                length=4 * n)))
                        if rv:
                            g.value_into.CopyFrom(pb.ShmRef(name=region.name,
                                                            offset=sh.half + off, length=4 * n))
                    elif self.wire_dtype != pb.DTYPE_FLOAT32:
                        g.grad.CopyFrom(self._half_tensor(p.name, rows, halves))
                    else:
                        g.grad.CopyFrom(_tensor(rows))
                    gs.append(g)
                wire = self.wire_dtype if region is None else pb.DTYPE_FLOAT32
                req = pb.PushRequest(worker=self.worker, step=st, grads=gs,
                                     return_values=rv, delta=delta, wire_dtype=wire)
                try:
                    resp = sh.call("Push", req, pb.PushResponse, timeout=t)
                except PsError as e:
                    if region is not None and sh.shm_refused(e):
                        continue
                    if sync and step is None and e.code == grpc.StatusCode.FAILED_PRECONDITION:
                        rejoined = self._rejoin(sh, by[s], e)
                        if again:  # stale twice: the step ran without us
                            self._give_back(halves, [p.name for _, p in by[s]], e)
                            return rejoined
                        again = True
                        st = sh.sync_step
                        continue
                    self._give_back(halves, [p.name for _, p in by[s]], e)
                    raise
                versions = [(p.name, v) for (_, p), v in zip(by[s], resp.versions)]
                values = [(p.name, v) for (_, p), v in zip(by[s], resp.values)]
                if sync and step is None:
                    sh.sync_step = min(v for _, v in versions)
                return values, versions, again

        res = self._each(sorted(by), push_shard)
        stale = any(r[2] for r in res.values())
        part_versions = {p: v for r in res.values() for p, v in r[1]}
        versions = {n: min(part_versions[p.name] for p in self.variables[n].parts)
                    for n in names}
        values = None
        if return_values or stale:
            values = self._assemble({s: r[0] for s, r in res.items()}, names)
        pushed_as = step if step is not None else self.step
        if not sync and step is None:
            self.step += 1
        return PushResult(versions, values, pushed_as, stale)

    def _half_tensor(self, part: str, rows: np.ndarray, halves: Dict[str, np.ndarray]) -> Any:
        """rows in the client's half wire_dtype, with error feedback: the
        part's rounding in halves if this push made it already, else made
        and kept there."""
        d = self.wire_dtype
        h = halves.get(part)
        if h is None and self.feedback is not None:
            h = halves[part] = self.feedback.encode(part, rows, d)
        elif h is None:
            h, _ = _half.to_half(rows, d)
        return pb.Tensor(dtype=d, shape=list(rows.shape), data=h.tobytes())

    def _give_back(self, halves: Dict[str, np.ndarray], parts: Sequence[str],
                   e: PsError) -> None:
        """After a push to one psd that failed with e (parts: its gradients
        in order): the roundings psd did not apply go back to their
        residuals, whole, for the next push to send (doc/python.md). A
        call whose answer never came (deadline, cancelled, UNKNOWN) may
        have reached psd, which applies it: counted as applied."""
        if self.feedback is None or e.code in _MAYBE_APPLIED:
            return
        before = _half.applied_before(e.details)
        for i, part in enumerate(parts):
            if i >= before and part in halves:
                self.feedback.give_back(part, halves[part], self.wire_dtype)

    def _rejoin(self, sh: _Shard, parts: Sequence[Tuple[str, _place.Part]],
                e: PsError) -> Tuple[List[Tuple[str, Any]], List[Tuple[str, int]], bool]:
        """A sync push refused as stale: takes the variables' step (push
        sends the gradient again at it, once)."""
        log.info("step %d is not the one the variables aggregate (%s); rejoining at theirs",
                 sh.sync_step, e.details)
        resp = sh.call("Pull", pb.PullRequest(items=[pb.PullItem(name=p.name)
                                                     for _, p in parts]), pb.PullResponse)
        sh.sync_step = min(v.version for v in resp.values)
        return ([(p.name, v) for (_, p), v in zip(parts, resp.values)],
                [(p.name, v.version) for (_, p), v in zip(parts, resp.values)], True)

    # ---- sparse tables ----------------------------------------------------

    def create_sparse_tables(self, tables: Sequence[SparseTable], *,
                             optimizer: Optimizer = Optimizer()) -> None:
        """Creates each table on every shard (its rows are spread over them
        by the hash of psclient.sparse). Idempotent as create_variables;
        optimizer: for tables without their own."""
        specs = [t.to_pb(optimizer) for t in tables]

        def create(s: int) -> None:
            for spec in specs:
                self.shards[s].call("CreateVariable", pb.CreateVariableRequest(spec=spec),
                                    pb.CreateVariableResponse)
        self._each(list(range(len(self.shards))), create)
        self.attach_sparse(tables)

    def attach_sparse(self, tables: Sequence[SparseTable]) -> None:
        """Knows the tables without creating them (a reader)."""
        for t in tables:
            self.sparse_tables[t.name] = int(t.dim)
            self.sparse_row_dtypes[t.name] = row_dtype_pb(t.row_dtype)

    def _sparse_call(self, timeout: Optional[float]) -> Callable[[int, str, Any, Any], Any]:
        return lambda s, m, req, resp: self.shards[s].call(m, req, resp, timeout=timeout)

    def _sparse_dim(self, name: str) -> int:
        if name not in self.sparse_tables:
            raise KeyError("sparse table '%s' is not one of this client's "
                           "(create_sparse_tables first; it has %d)"
                           % (name, len(self.sparse_tables)))
        return self.sparse_tables[name]

    def _next_ids(self, next_ids: Optional[Mapping[str, Any]],
                  pushed: Optional[Mapping[str, Any]]) -> Optional[Dict[str, np.ndarray]]:
        """next_ids checked: each table one of this client's, and with
        pushed (a push's tables), one that the push pushes."""
        if next_ids is None:
            return None
        nxt = {n: _sparse.check_ids(n, a) for n, a in next_ids.items()}
        for n in nxt:
            self._sparse_dim(n)
            if pushed is not None and n not in pushed:
                raise ValueError("sparse table '%s': next_ids of a table this push "
                                 "does not push" % n)
        return nxt

    def sparse_pull(self, ids: Mapping[str, Any], *,
                    next_ids: Optional[Mapping[str, Any]] = None,
                    timeout: Optional[float] = None) -> SparseValues:
        """The rows of each table's ids (int64, any order, repeats allowed)
        as float32 [len(ids), dim] in request order. An id with no row
        answers its initial row (stored only with insert_on_pull).
        next_ids: each table's ids of the next pull, when known (the next
        batch): the shards start reading those on disk ahead, so that the
        next pull finds them in memory. A hint, which changes no answer."""
        checked = {n: _sparse.check_ids(n, a) for n, a in ids.items()}
        dims = {n: self._sparse_dim(n) for n in checked}
        if not checked:
            raise ValueError("sparse_pull: no tables")
        nxt = self._next_ids(next_ids, None)
        return _sparse.pull(self._sparse_call(timeout), self._each, len(self.shards),
                            dims, checked, nxt)

    def sparse_push(self, grads: Mapping[str, Tuple[Any, Any]], *, step: Optional[int] = None,
                    return_values: bool = False,
                    next_ids: Optional[Mapping[str, Any]] = None,
                    timeout: Optional[float] = None) -> SparsePushResult:
        """Pushes each table's (ids, rows): row i (float32 [len(ids), dim])
        is the gradient of ids[i]; psd sums a repeated id's rows before one
        update. Each shard gets the rows of its ids in one request, in
        parallel; when every table of a request has half-precision rows of
        one dtype, the gradients travel in it (rounded to nearest even).
        return_values: the updated rows back, in request order.
        step: the table clock (ttl_steps); None: the client's sparse_step,
        which rises by one per call.
        next_ids: each pushed table's ids of the next push, when known (the
        next batch): a shard that gets rows of the table now starts reading
        its share of them on disk ahead, so that the next push finds them
        in memory. A hint, which changes nothing a push applies or answers."""
        checked: Dict[str, Tuple[np.ndarray, np.ndarray]] = {}
        for n, (i, g) in grads.items():
            a = _sparse.check_ids(n, i)
            checked[n] = (a, _sparse.check_rows(n, g, len(a), self._sparse_dim(n)))
        if not any(len(a) for a, _ in checked.values()):
            raise ValueError("sparse_push: no ids")
        nxt = self._next_ids(next_ids, checked)
        st = self.sparse_step if step is None else step
        res = _sparse.push(self._sparse_call(timeout), self._each, len(self.shards),
                           self.worker, st, checked, return_values,
                           {n: self.sparse_row_dtypes.get(n, 1) for n in checked}, nxt)
        if step is None:
            self.sparse_step += 1
        return res

    # ---- the rest of the service ------------------------------------------

    def stats(self) -> List[Any]:
        """Each shard's Stats as a ShardStats dataclass (StatsResponse's
        fields, plus shard and address), by shard index."""
        r = self._each(list(range(len(self.shards))), lambda s: self.shards[s].call(
            "Stats", pb.StatsRequest(), pb.StatsResponse))
        out = []
        for s in range(len(self.shards)):
            vals = {f.name: getattr(r[s], f.name) for f in pb.StatsResponse.DESCRIPTOR.fields}
            out.append(ShardStats(shard=s, address=self.shards[s].conn.address, **vals))
        return out

    def list(self) -> List[VariableInfo]:
        """Every variable and sparse table of every shard, as VariableInfo
        dataclasses, shard by shard (each shard's sorted by name)."""
        r = self._each(list(range(len(self.shards))), lambda s: self.shards[s].call(
            "ListVariables", pb.ListVariablesRequest(), pb.ListVariablesResponse))
        opt = pb.Optimizer.DESCRIPTOR.fields_by_name["kind"].enum_type
        cons = pb.VariableSpec.DESCRIPTOR.fields_by_name["consistency"].enum_type

        def name_of(enum: Any, v: int) -> str:
            e = enum.values_by_number.get(v)
            return e.name.lower() if e is not None else str(v)
        return [VariableInfo(shard=s, address=self.shards[s].conn.address, name=v.spec.name,
                             shape=tuple(int(d) for d in v.spec.shape),
                             sparse=bool(v.spec.sparse), version=int(v.version),
                             value_bytes=int(v.value_bytes), slot_bytes=int(v.slot_bytes),
                             optimizer=name_of(opt, v.spec.optimizer.kind),
                             consistency=name_of(cons, v.spec.consistency),
                             sparse_rows=int(v.sparse_rows),
                             sparse_disk_bytes=int(v.sparse_disk_bytes),
                             sparse_ram_rows=int(v.sparse_ram_rows),
                             sparse_ram_bytes=int(v.sparse_ram_bytes))
                for s in range(len(self.shards)) for v in r[s].variables]

    def checkpoint(self, step: int = 0, *, keep_at_least: int = 0,
                   token_file: Optional[str] = None,
                   timeout: Optional[float] = None) -> List[Checkpoint]:
        """Has every shard write a checkpoint (psd's Checkpoint, in
        parallel): at `step` (0: each shard's highest variable version; give
        one step to have the shards' directories agree), keeping at least
        keep_at_least of them. Needs an operator's token where psd has
        --tokens: the client's own, or token_file's for these calls only.
        Returns each shard's Checkpoint by index; raises PsError
        (PERMISSION_DENIED for a token of another role)."""
        if step < 0 or keep_at_least < 0:
            raise ValueError("checkpoint: step and keep_at_least must be >= 0")
        tok = _token_arg(token_file)
        req = pb.CheckpointRequest(step=step, keep_at_least=keep_at_least)
        r = self._each(list(range(len(self.shards))), lambda s: self.shards[s].call(
            "Checkpoint", req, pb.CheckpointResponse, timeout=timeout, token=tok))
        return [Checkpoint(s, self.shards[s].conn.address, r[s].path, int(r[s].step),
                           int(r[s].bytes)) for s in range(len(self.shards))]

    def restore(self, step: int = 0, *, token_file: Optional[str] = None,
                timeout: Optional[float] = None,
                sparse_row_dtype: Optional[str] = None,
                sparse_slot_dtype: Optional[str] = None) -> List[Restored]:
        """Has every shard load a checkpoint (psd's Restore, in parallel):
        the one at `step`, or each shard's latest complete one (0). The
        variables' values, optimizer slots, versions and sparse tables
        become the checkpoint's; the client's own step counters are not
        touched. Operator token as checkpoint. Returns each shard's Restored
        by index; raises PsError (NOT_FOUND naming the step when a shard has
        no such checkpoint). sparse_row_dtype ("f32", "fp16", "bf16"): every
        sparse table comes back with rows of that dtype, converted where the
        checkpoint holds another (counted in Restored); None: as saved.
        sparse_slot_dtype: the same for the tables' optimizer slots."""
        if step < 0:
            raise ValueError("restore: step must be >= 0")
        tok = _token_arg(token_file)
        req = pb.RestoreRequest(step=step, sparse_row_dtype=(
            0 if sparse_row_dtype is None else row_dtype_pb(sparse_row_dtype)),
            sparse_slot_dtype=(0 if sparse_slot_dtype is None
                               else row_dtype_pb(sparse_slot_dtype, "sparse_slot_dtype")))
        r = self._each(list(range(len(self.shards))), lambda s: self.shards[s].call(
            "Restore", req, pb.RestoreResponse, timeout=timeout, token=tok))
        return [Restored(s, self.shards[s].conn.address, int(r[s].step), int(r[s].variables),
                         int(r[s].sparse_tables_converted), int(r[s].sparse_rows_converted))
                for s in range(len(self.shards))]

    def list_variables(self) -> List[Any]:
        """Every shard's VariableInfo, shard by shard."""
        r = self._each(list(range(len(self.shards))), lambda s: self.shards[s].call(
            "ListVariables", pb.ListVariablesRequest(), pb.ListVariablesResponse))
        return [v for s in range(len(self.shards)) for v in r[s].variables]

    def health(self) -> List[str]:
        """Each shard's grpc.health.v1 status for ps.v1.ParameterServer
        ("SERVING", "NOT_SERVING" while it restores or drains), by index."""
        def check(s: int) -> str:
            resp = self.shards[s].conn.call(
                "grpc.health.v1.Health", "Check",
                health.HealthCheckRequest(service=PS), health.HealthCheckResponse)
            enum = resp.DESCRIPTOR.fields_by_name["status"].enum_type
            v = enum.values_by_number.get(resp.status)
            return v.name if v is not None else str(resp.status)
        r = self._each(list(range(len(self.shards))), check)
        return [r[s] for s in range(len(self.shards))]

    def cluster(self) -> Any:
        """pscoord's ClusterState (with a coordinator only)."""
        if self.coord is None:
            raise ValueError("this client was given psd addresses, not a coordinator")
        return self.coord.call(COORD, "GetCluster", pb.GetClusterRequest(job_id=self.job_id),
                               pb.ClusterState)

    def progress(self, step: int, loss: float = 0.0,
                 examples_per_second: float = 0.0) -> None:
        """With register: what the next heartbeat tells pscoord (its
        ClusterState, psctl status and the checkpoint schedule use it)."""
        if self.task is not None:
            self.task.progress(step, loss, examples_per_second)

    @property
    def stop_requested(self) -> bool:
        """With register: pscoord asked this task to stop."""
        return self.task is not None and self.task.stop_requested

    def close(self) -> None:
        """Ends the heartbeats, every channel, and frees the shared memory."""
        if self.task is not None:
            self.task.close()
        self._pool.shutdown(wait=True)
        for sh in self.shards:
            if sh.region is not None:
                sh.region.close()
                sh.region = None
            sh.conn.close()
        if self.coord is not None:
            self.coord.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
