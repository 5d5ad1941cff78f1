"""Shared helpers for the Python interop tests: generate stubs from proto/
at test time with grpc_tools, start a daemon on 127.0.0.1:0, stop it.

Run with Debian's /usr/bin/python3 (python3-grpcio, python3-grpc-tools).
"""
import atexit
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

SOURCE_ROOT = os.environ.get(
    "PS_SOURCE_ROOT",
    os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))
BUILD_ROOT = os.environ.get("PS_BUILD_ROOT", os.path.join(SOURCE_ROOT, "build"))


def generate_stubs():
    """Compiles proto/*.proto into a temporary package and imports it."""
    from grpc_tools import protoc  # noqa: imported late: only tests need it
    out = tempfile.mkdtemp(prefix="ps-stubs-")
    atexit.register(shutil.rmtree, out, True)
    proto_dir = os.path.join(SOURCE_ROOT, "proto")
    for name in ("ps.proto", "health.proto"):
        rc = protoc.main(["protoc", "-I" + proto_dir, "--python_out=" + out,
                          "--grpc_python_out=" + out,
                          os.path.join(proto_dir, name)])
        if rc != 0:
            raise RuntimeError("grpc_tools.protoc failed on %s" % name)
    sys.path.insert(0, out)
    import ps_pb2, ps_pb2_grpc, health_pb2, health_pb2_grpc  # noqa: E401
    return ps_pb2, ps_pb2_grpc, health_pb2, health_pb2_grpc


# Python's grpcio keeps gRPC's 4 MiB receive default; tensors need more.
CHANNEL_OPTIONS = [("grpc.max_receive_message_length", 1 << 30),
                   ("grpc.max_send_message_length", 1 << 30)]


def channel(address):
    import grpc
    return grpc.insecure_channel(address, options=CHANNEL_OPTIONS)


class Daemon:
    """A real process that prints "PORT <n>" on stdout once serving."""

    def __init__(self, argv, env=None, timeout=20.0, stderr=None):
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE,
                                     stderr=stderr, env=env, text=True)
        atexit.register(self.kill)
        deadline = time.monotonic() + timeout
        self.port = None
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            if line.startswith("PORT "):
                self.port = int(line.split()[1])
                break
        if self.port is None:
            self.kill()
            raise RuntimeError(self.port_error(argv))
        self.address = "127.0.0.1:%d" % self.port

    def port_error(self, argv):
        """The message when the daemon never printed its port."""
        return "%s did not report its port" % argv[0]

    def stop(self, sig=signal.SIGTERM, timeout=20.0):
        """Sends sig and waits; returns the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


class Results:
    """Counts checks and prints the closing 'N passed, N failed' line."""

    def __init__(self, name):
        self.name = name
        self.passed = 0
        self.failed = 0

    def check(self, cond, what):
        if cond:
            self.passed += 1
            print("ok   %s" % what, flush=True)
        else:
            self.failed += 1
            print("FAIL %s" % what, flush=True)

    def refused(self, what, call, code, *words):
        """Checks that call() fails with code (a grpc.StatusCode) and a
        message that holds each of words; what names the case."""
        import grpc
        try:
            call()
            self.check(False, "%s is refused" % what)
        except grpc.RpcError as e:
            self.check(e.code() == code and all(w in e.details() for w in words),
                       "%s is %s (%s)" % (what, code.name, e.details()))

    def run(self, tests, *args):
        """Calls each of tests with args; one that raises is a failed check
        (with its traceback) and the rest still run."""
        for t in tests:
            try:
                t(*args)
            except Exception as e:  # noqa: BLE001 - one failing part must not hide the rest
                import traceback
                traceback.print_exc()
                name = getattr(t, "__name__", "<lambda>")
                self.check(False, "%sraised %s: %s" % ("" if name == "<lambda>" else name + " ",
                                                        type(e).__name__, e))

    def finish(self):
        print("%s: %d passed, %d failed" % (self.name, self.passed, self.failed))
        sys.exit(0 if self.failed == 0 else 1)


def run_all(name, tests):
    """A test file's whole main: runs each of tests with one Results, named
    name, passed to it, then prints the closing line and exits with it."""
    r = Results(name)
    r.run(tests, r)
    r.finish()


def need_programs(*names, apt):
    """The paths of programs names on PATH, or exit 77 (skipped) naming
    them and the Debian package apt that has them."""
    import shutil
    paths = [shutil.which(n) for n in names]
    if None in paths:
        print("skipped: %s not found (apt install %s)" % (" or ".join(names), apt))
        sys.exit(77)
    return paths[0] if len(paths) == 1 else paths


def need_file(path, apt):
    """Exits 77 (skipped) unless path exists, naming the package apt."""
    if not os.path.exists(path):
        print("skipped: %s is missing (apt-get install %s)" % (os.path.dirname(path), apt))
        sys.exit(77)


def psd_path():
    return os.path.join(BUILD_ROOT, "server", "psd")


def start_psd(data_dir, *args, wrapper=None):
    """Starts a real psd on 127.0.0.1:0 with data_dir; returns a Daemon."""
    argv = [psd_path(), "--data-dir", data_dir, "--listen", "127.0.0.1:0",
            "--log-level", os.environ.get("PSD_LOG_LEVEL", "warn")] + list(args)
    return Daemon((wrapper or []) + argv)


def start_psd_local(tmp, *args, suffix="", wrapper=None):
    """start_psd with its data in TMP/data<suffix>, also serving on the unix
    socket TMP/psd<suffix>.sock (shared memory goes over nothing else).
    Returns (Daemon, the socket's path)."""
    sock = os.path.join(tmp, "psd%s.sock" % suffix)
    d = start_psd(os.path.join(tmp, "data" + suffix), "--local-socket", sock, *args,
                  wrapper=wrapper)
    return d, sock


def stop_all(daemons, kill=False):
    """Stops each of daemons (SIGTERM and a wait, or with kill SIGKILL): the
    end of a test's main, for every process it started."""
    for d in daemons:
        if kill:
            d.kill()
        else:
            d.stop()


def durability_modes():
    """For a test run once write-behind and once with --durable: yields
    (durable, mode name, a new data directory, psd's extra arguments)."""
    for durable in (False, True):
        yield (durable, "durable" if durable else "write-behind", tmpdir(),
               ["--durable"] if durable else [])


def in_threads(fn, n, timeout):
    """Runs fn(i) for i in range(n), each on a thread of its own, all at
    once; waits up to timeout seconds for each. Returns what they raised."""
    import threading
    errors = []

    def run(i):
        try:
            fn(i)
        except Exception as e:  # noqa: BLE001 - returned to the caller's check
            errors.append(e)
    ts = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout)
    return errors


class Pushers:
    """One thread per request maker: thread i sends reqs[i]() with
    SparsePush over and over until join(), or until a call fails (the
    daemon was killed), noting in acks[i] when each call was acknowledged
    and in sent[i] how many it sent."""

    def __init__(self, address, reqs, timeout=10):
        import threading
        self.address, self.reqs, self.timeout = address, reqs, timeout
        self.acks = [[] for _ in reqs]
        self.sent = [0] * len(reqs)
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self.run, args=(i,))
                        for i in range(len(reqs))]
        for t in self.threads:
            t.start()

    def run(self, i):
        import grpc
        _, pbg, _, _ = generate_stubs()
        ch = channel(self.address)
        stub = pbg.ParameterServerStub(ch)
        while not self.stop.is_set():
            req = self.reqs[i]()
            self.sent[i] += 1
            try:
                stub.SparsePush(req, timeout=self.timeout)
            except grpc.RpcError:
                break
            self.acks[i].append(time.monotonic())
        ch.close()

    def join(self):
        self.stop.set()
        for t in self.threads:
            t.join()


def lag_mark(pb, stub):
    """Asked of psd just before a kill -9: its write-behind lag
    (Stats.write_behind_lag_ms), dated by Stats.taken_unix_ms, as a time on
    time.monotonic()'s clock. Every push acknowledged at or before the mark
    was durable when psd took its figures, however long the call waited to
    be served, so a test bounds what a kill may lose by the earlier of the
    mark and its promise (doc/operating.md: a busy disk stretches a commit,
    and the window with it, by what psd itself reports). Returns (mark,
    lag_ms); (inf, None) when Stats did not answer in 5 s."""
    import grpc
    try:
        st = stub.Stats(pb.StatsRequest(), timeout=5)
    except grpc.RpcError:
        return float("inf"), None
    wall_to_mono = time.time() - time.monotonic()
    # Both ms figures are truncated: the oldest update may be 2 ms older.
    mark = (st.taken_unix_ms - st.write_behind_lag_ms - 2) / 1000.0 - wall_to_mono
    return mark, st.write_behind_lag_ms


CGROUP_V1_MEMORY = "/sys/fs/cgroup/memory"


def memory_cgroup(test, limit):
    """A new cgroup v1 memory group of limit bytes for test (removed at
    exit); exits 77 (skip) with one line when not root or there is no
    writable controller."""
    if os.geteuid() != 0:
        print("SKIP %s: not root: cannot make a memory cgroup" % test)
        sys.exit(77)
    if not os.access(CGROUP_V1_MEMORY, os.W_OK):
        print("SKIP %s: no writable cgroup v1 memory controller at %s"
              % (test, CGROUP_V1_MEMORY))
        sys.exit(77)
    cg = os.path.join(CGROUP_V1_MEMORY, "%s-%d" % (test, os.getpid()))
    os.mkdir(cg)
    atexit.register(rmdir_soon, cg)
    with open(os.path.join(cg, "memory.limit_in_bytes"), "w") as f:
        f.write(str(limit))
    return cg


def cgroup_wrapper(cg):
    """argv before a daemon's that starts it inside cgroup cg."""
    return ["/bin/sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', cg]


def cgroup_read(cg, name):
    with open(os.path.join(cg, name)) as f:
        return f.read()


def rmdir_soon(path, tries=50, every=0.1):
    """Removes directory path, again while it is busy (a cgroup whose last
    process is still exiting), up to tries times every seconds."""
    for _ in range(tries):
        try:
            os.rmdir(path)
            return
        except OSError:
            time.sleep(every)


def free_port():
    """A port free on 127.0.0.1 now (for a daemon told its port up front)."""
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def wait_until(pred, timeout=10.0, every=0.05):
    """Calls pred every `every` s until it returns a true value (returned)
    or timeout s pass; then returns pred() once more."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(every)
    return pred()


def pip_install(py, requirement, minutes):
    """Installs one PyPI requirement with python py, for at most `minutes`.
    Returns None, or why not ("PyPI cannot be reached (...)") for a skip."""
    try:
        pip = subprocess.run([py, "-m", "pip", "install", "--quiet",
                              "--disable-pip-version-check", "--timeout", "15",
                              "--retries", "1", requirement],
                             capture_output=True, text=True, timeout=60 * minutes)
    except subprocess.TimeoutExpired:
        return "pip install %s did not finish in %d minutes" % (requirement, minutes)
    if pip.returncode != 0:
        last = (pip.stderr or pip.stdout).strip().splitlines()
        return "PyPI cannot be reached (pip install %s: %s)" % (
            requirement, last[-1] if last else "exit %d" % pip.returncode)
    return None


def run_workerd(args, env=None, timeout=240):
    """Runs build/worker/workerd with args (env: variables over this
    process's) to its exit: (exit status, its last stdout line that is a
    JSON object, or None, stderr)."""
    import json
    p = subprocess.run([os.path.join(BUILD_ROOT, "worker", "workerd"), *args],
                       capture_output=True, text=True, timeout=timeout,
                       env=dict(os.environ, **(env or {})))
    summary = None
    for line in reversed(p.stdout.splitlines()):
        if line.startswith("{"):
            summary = json.loads(line)
            break
    return p.returncode, summary, p.stderr


def client_push(make_client, stats, host_id=None):
    """One push of ones to a new variable "pyv" (4096,) through the Python
    client that make_client() returns (closed after), with PS_HOST_ID set to
    host_id meanwhile when given. Returns the client's addresses and psd's
    Stats shm_bytes (from stats()) before and after."""
    import numpy as np
    from psclient import Initializer, Variable
    if host_id is not None:
        os.environ["PS_HOST_ID"] = host_id
    c = None
    try:
        before = stats().shm_bytes
        c = make_client()
        c.create_variables([Variable("pyv", (4096,), Initializer.constant(1.0))])
        c.push({"pyv": np.ones(4096, np.float32)})
        return c.addresses, before, stats().shm_bytes
    finally:
        if c is not None:
            c.close()
        if host_id is not None:
            del os.environ["PS_HOST_ID"]


def check_client_shm(r, what, make_client, stats, sock, tcp):
    """Checks the Python client that make_client() returns on a psd of this
    host: a push goes over the unix socket sock with shared memory (Stats'
    shm_bytes grow by its 16 KiB at least), and with another PS_HOST_ID over
    TCP (tcp, the psd's address) with none; what names the client."""
    addrs, before, after = client_push(make_client, stats)
    r.check(addrs == [sock] and after >= before + 4096 * 4,
            "python: %s on %s, shm_bytes %d -> %d" % (what, addrs, before, after))
    addrs, _, later = client_push(make_client, stats, host_id="another-host")
    r.check(addrs == [tcp] and later == after,
            "python: another host id: over TCP (%s)" % addrs)


def json_summary(p):
    """A finished workerd's --json summary (its last stdout line), or {}
    when it failed or printed none."""
    import json
    lines = p.stdout.strip().splitlines()
    return json.loads(lines[-1]) if p.returncode == 0 and lines else {}


def recv_all(sock):
    """What sock receives until the peer closes (or its timeout raises)."""
    parts = []
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            return b"".join(parts)
        parts.append(chunk)


def help_flags(path):
    """The flags that program `path` names in its --help (--[no-]x as --x)."""
    import re
    out = subprocess.run([path, "--help"], capture_output=True, text=True,
                         timeout=30).stdout
    flags = set(re.findall(r"(--[a-z][a-z0-9-]*)", out))
    return flags | {"--" + f for f in re.findall(r"--\[no-\]([a-z][a-z0-9-]*)", out)}


def host_id_oracle():
    """This host's id as common/hostid.h defines it (boot id and pid
    namespace), read here from /proc."""
    with open("/proc/sys/kernel/random/boot_id") as f:
        boot = f.read().strip()
    return "%s:%d" % (boot, os.stat("/proc/self/ns/pid").st_ino)


def sparse_pull(pb, stub, name, ids, dim, batch=4096):
    """The rows ids of sparse table name, batch ids a SparsePull, as one
    (len(ids), dim) float32 array."""
    import numpy as np
    out = []
    for k in range(0, len(ids), batch):
        b = [int(i) for i in ids[k:k + batch]]
        r = stub.SparsePull(pb.SparsePullRequest(items=[pb.SparsePullItem(
            name=name, ids=b)]), timeout=120).rows[0]
        out.append(np.frombuffer(r.values.data, dtype="<f4").reshape(len(b), dim))
    return np.concatenate(out)


def tmpdir(prefix="psd-test-"):
    d = tempfile.mkdtemp(prefix=prefix)
    atexit.register(shutil.rmtree, d, True)
    return d


def spec(pb, name, shape, lr=0.1, opt=None, init=None, **kw):
    """A float32 VariableSpec with SGD (or `opt`) and zeros (or `init`)."""
    return pb.VariableSpec(
        name=name, dtype=pb.DTYPE_FLOAT32, shape=list(shape),
        optimizer=opt or pb.Optimizer(kind=pb.Optimizer.SGD, learning_rate=lr),
        initializer=init or pb.Initializer(kind=pb.Initializer.ZEROS), **kw)


def grad(pb, name, array):
    import numpy as np
    a = np.ascontiguousarray(array, dtype="<f4")
    return pb.Gradient(name=name, grad=pb.Tensor(
        dtype=pb.DTYPE_FLOAT32, shape=list(a.shape), data=a.tobytes()))


def value(v):
    """The numpy array of a VariableValue."""
    import numpy as np
    return np.frombuffer(v.value.data, dtype="<f4").reshape(tuple(v.value.shape))


class DensePsd:
    """A psd of its own (data_dir, or a new temporary one) and a stub, with
    the dense calls the optimizer tests make: push one float32 gradient,
    pull one variable's (version, value)."""

    def __init__(self, pb, pbg, *args, data_dir=None):
        self.pb = pb
        self.dir = data_dir or tmpdir()
        self.d = start_psd(self.dir, *args)
        self.ch = channel(self.d.address)
        self.stub = pbg.ParameterServerStub(self.ch)

    def push(self, name, g):
        import numpy as np
        return self.stub.Push(self.pb.PushRequest(
            grads=[grad(self.pb, name, np.asarray(g, np.float32))]), timeout=5)

    def pull(self, name):
        v = self.stub.Pull(self.pb.PullRequest(
            items=[self.pb.PullItem(name=name)]), timeout=5).values[0]
        return v.version, value(v).copy()

    def stop(self):
        self.ch.close()
        return self.d.stop()
