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

    def finish(self):
        print("%s: %d passed, %d failed" % (self.name, self.passed, self.failed))
        sys.exit(0 if self.failed == 0 else 1)


def psd_path():
    return os.path.join(BUILD_ROOT, "server", "psd")


def start_psd(data_dir, *args, wrapper=None):
    """Starts a real psd on 127.0.0.1:0 with data_dir; returns a Daemon."""
    argv = [psd_path(), "--data-dir", data_dir, "--listen", "127.0.0.1:0",
            "--log-level", os.environ.get("PSD_LOG_LEVEL", "warn")] + list(args)
    return Daemon((wrapper or []) + argv)


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
