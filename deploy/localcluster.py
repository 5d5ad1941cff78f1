"""A local cluster on loopback: pscoord, psd shards, workerd workers and an
evaluator, each a real process, for `make demo` and the fault tests.

    cluster = LocalCluster(build_dir, root_dir, num_ps=2, num_workers=2)
    cluster.start()              # coordinator, shards, evaluator, workers
    cluster.kill("worker", 1)    # SIGKILL one task
    cluster.restart("worker", 1) # the same task again, same flags
    cluster.wait_workers()       # until every worker exits
    cluster.stop()               # SIGTERM everything, then SIGKILL stragglers

With tls=True every daemon serves and calls with mutual TLS, and checks
tokens (tokens=False leaves them out): ROOT/tokens holds one per role made
by `psctl token` and the servers' table of them. A CA and a
certificate per task (SANs localhost and 127.0.0.1) are made into
ROOT/certs by tools/pscerts, and each task gets --tls-cert, --tls-key and
--tls-ca (security_args, where the tokens' flags go too).

Each psd also serves a unix socket, ROOT/ps<i>.sock (--local-socket; off
with local_socket=False), which it tells pscoord of: the workers, on the same
host, reach their shards there and move their tensors through shared
memory. ps_stats() reads a shard's Stats (shm_bytes says how many went so).
worker_env adds variables to the workers' environment (PS_HOST_ID: another
host, as far as the workers can tell).

Every process runs in its own process group and is killed by stop(), also
when the caller is interrupted. Ports are 0 (each process prints PORT <n>),
except psd's, which must keep its address across a restart: those are
taken from the kernel once and reused.
"""
import json
import os
import signal
import socket
import subprocess
import sys
import time


def free_port():
    """A port that is free now, below Linux's ephemeral range (32768-60999 by
    default) so that no outgoing connection takes it while its psd restarts."""
    import random
    lo, hi = 20000, 32000
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            first = int(f.read().split()[0])
            if first > lo + 1000:
                hi = min(hi, first)
    except (OSError, ValueError):
        pass
    for _ in range(200):
        port = random.randrange(lo, hi)
        s = socket.socket()
        try:
            s.bind(("127.0.0.1", port))
            return port
        except OSError:
            continue
        finally:
            s.close()
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class Task:
    def __init__(self, role, index, argv, log_path, wait_port, env=None):
        self.role, self.index, self.argv = role, index, argv
        self.env = env
        self.log_path = log_path
        self.wait_port = wait_port
        self.proc = None
        self.port = None
        self.output = []

    def start(self, timeout=60):
        log = open(self.log_path, "a")
        env = dict(os.environ, **self.env) if self.env else None
        self.proc = subprocess.Popen(self.argv, stdout=subprocess.PIPE, stderr=log,
                                     text=True, start_new_session=True, env=env)
        log.close()
        if self.wait_port:
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                line = self.proc.stdout.readline()
                if not line:
                    raise RuntimeError("%s[%d] exited at start; see %s"
                                       % (self.role, self.index, self.log_path))
                if line.startswith("PORT "):
                    self.port = int(line.split()[1])
                    return
            raise RuntimeError("%s[%d] did not start" % (self.role, self.index))

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig):
        if self.alive():
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                pass

    def wait(self, timeout=None):
        out, _ = self.proc.communicate(timeout=timeout)
        if out:
            self.output.extend(out.splitlines())
        return self.proc.returncode


class LocalCluster:
    def __init__(self, build, root, num_ps=2, num_workers=2, evaluator=True,
                 model="mlp:784-256-256-10", epochs=3, batch=64, lr=0.1,
                 consistency="async", seed=1, checkpoint_every_steps=0,
                 checkpoint_every="0", heartbeat_timeout="2s", worker_args=(),
                 job_id="demo", logdir=None, tls=False, tokens=None,
                 local_socket=True, worker_env=None):
        self.build, self.root = os.path.abspath(build), os.path.abspath(root)
        self.num_ps, self.num_workers = num_ps, num_workers
        self.evaluator = evaluator
        self.model, self.epochs, self.batch, self.lr = model, epochs, batch, lr
        self.consistency, self.seed = consistency, seed
        self.ckpt_steps, self.ckpt_every = checkpoint_every_steps, checkpoint_every
        self.heartbeat_timeout = heartbeat_timeout
        self.worker_args = list(worker_args)
        self.job_id = job_id
        # TensorBoard event files: the chief (worker 0) and the evaluator
        # write them under logdir (the other workers ignore the flag).
        self.logdir = logdir
        self.tls = tls
        self.certs = os.path.join(self.root, "certs") if tls else None
        # Tokens come with TLS unless told otherwise: psd and pscoord check
        # every call against ROOT/tokens/server (one line per role), and each
        # task sends its role's token (security_args).
        self.tokens = tls if tokens is None else tokens
        self.token_dir = os.path.join(self.root, "tokens") if self.tokens else None
        self.local_socket = local_socket
        self.worker_env = dict(worker_env or {})
        self.tasks = {}
        self.coord_addr = None
        self.ps_ports = [free_port() for _ in range(num_ps)]
        self.coord_port = free_port()
        os.makedirs(os.path.join(root, "logs"), exist_ok=True)

    def _bin(self, *p):
        return os.path.join(self.build, *p)

    def _log(self, role, index):
        return os.path.join(self.root, "logs", "%s-%d.log" % (role, index))

    def _task_name(self, role, index):
        return "coordinator" if role == "coordinator" else "%s%d" % (role, index)

    def make_certs(self):
        """A CA and one certificate per task, with tools/pscerts."""
        names = [self._task_name("coordinator", 0)]
        names += [self._task_name("ps", i) for i in range(self.num_ps)]
        names += [self._task_name("worker", i) for i in range(self.num_workers)]
        names += [self._task_name("evaluator", 0), "client"]
        subprocess.run([self._bin("tools", "pscerts"), "--out", self.certs] +
                       ["%s=localhost,127.0.0.1" % n for n in names],
                       check=True, stdout=subprocess.DEVNULL, timeout=120)

    def make_tokens(self):
        """One token per role with `psctl token`, each in its own file (mode
        0600), and the servers' table of the three (plain tokens, so 0600 as
        well: psd refuses a table others may read)."""
        os.makedirs(self.token_dir, mode=0o700, exist_ok=True)
        lines = []
        for role in ("reader", "worker", "operator"):
            out = subprocess.run([self._bin("tools", "psctl"), "token", role],
                                 check=True, capture_output=True, text=True,
                                 timeout=30).stdout
            lines.append(out)
            path = os.path.join(self.token_dir, role)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(out)
        fd = os.open(os.path.join(self.token_dir, "server"),
                     os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write("".join(lines))

    def token(self, role):
        """The token of a role ("reader", "worker", "operator"), or None."""
        if not self.tokens:
            return None
        return open(os.path.join(self.token_dir, role)).read().split()[1]

    def security_args(self, role, index):
        """The flags that make a task secure: mutual TLS with its own
        certificate, and tokens: the servers check every call against the
        table, and each task sends its role's token (pscoord an operator's,
        for it checkpoints and restores the shards; psd and the workers a
        worker's)."""
        args = []
        if self.tls:
            name = self._task_name(role, index)
            args += ["--tls-cert", os.path.join(self.certs, name + ".pem"),
                     "--tls-key", os.path.join(self.certs, name + ".key"),
                     "--tls-ca", os.path.join(self.certs, "ca.pem")]
        if self.tokens:
            if role in ("coordinator", "ps"):
                args += ["--tokens", os.path.join(self.token_dir, "server")]
            sends = "operator" if role == "coordinator" else "worker"
            args += ["--token-file", os.path.join(self.token_dir, sends)]
        return args

    def client_args(self, role="reader"):
        """psctl's global flags for this cluster: the client certificate and
        a token of the role asked for."""
        args = []
        if self.tls:
            args += ["--tls-ca", os.path.join(self.certs, "ca.pem"),
                     "--tls-cert", os.path.join(self.certs, "client.pem"),
                     "--tls-key", os.path.join(self.certs, "client.key")]
        if self.tokens:
            args += ["--token-file", os.path.join(self.token_dir, role)]
        return args

    def channel(self, address, role="reader"):
        """A Python gRPC channel to a task, with the cluster's transport and,
        when tokens are on, a token of the role asked for on every call."""
        import grpc
        if not self.tls:
            if self.tokens:
                raise ValueError("tokens without TLS: grpcio sends call "
                                 "credentials over TLS only")
            return grpc.insecure_channel(address)
        read = lambda n: open(os.path.join(self.certs, n), "rb").read()  # noqa: E731
        creds = grpc.ssl_channel_credentials(read("ca.pem"), read("client.key"),
                                             read("client.pem"))
        if self.tokens:
            creds = grpc.composite_channel_credentials(
                creds, grpc.access_token_call_credentials(self.token(role)))
        return grpc.secure_channel(address, creds)

    def _argv(self, role, index):
        return self._argv_plain(role, index) + self.security_args(role, index)

    def _argv_plain(self, role, index):
        if role == "coordinator":
            spec = {"job_id": self.job_id, "cluster": {
                "ps": ["127.0.0.1:%d" % p for p in self.ps_ports],
                "worker": ["worker-%d" % i for i in range(self.num_workers)]}}
            # Workers serve nothing; the spec still needs host:port entries,
            # so give each a placeholder port that is never dialled.
            spec["cluster"]["worker"] = ["127.0.0.1:%d" % (1 + i) for i in
                                         range(self.num_workers)]
            if self.evaluator:
                spec["cluster"]["evaluator"] = ["127.0.0.1:%d" % (1 + self.num_workers)]
            path = os.path.join(self.root, "cluster.json")
            with open(path, "w") as f:
                json.dump(spec, f)
            return [self._bin("coordinator", "pscoord"), "--cluster", path,
                    "--listen", "127.0.0.1:%d" % (self.coord_port or 0),
                    "--state-dir", os.path.join(self.root, "coord"),
                    "--heartbeat-timeout", self.heartbeat_timeout,
                    "--checkpoint-every-steps", str(self.ckpt_steps),
                    "--checkpoint-every", str(self.ckpt_every),
                    "--log-level", "info"]
        if role == "ps":
            return [self._bin("server", "psd"),
                    "--data-dir", os.path.join(self.root, "ps%d" % index),
                    "--checkpoint-root", os.path.join(self.root, "ckpt", "ps%d" % index),
                    "--listen", "127.0.0.1:%d" % self.ps_ports[index],
                    "--coordinator", self.coord_addr, "--job-id", self.job_id,
                    "--task-index", str(index), "--log-level", "info"
                    ] + self._local_socket_args(index)
        common = [self._bin("worker", "workerd"), "--coordinator", self.coord_addr,
                  "--job-id", self.job_id, "--task-index", str(index),
                  "--model", self.model, "--log-level", "info"]
        if self.logdir:
            common += ["--logdir", self.logdir]
        if role == "evaluator":
            return common + ["--role", "evaluator", "--eval-interval", "1s", "--json"]
        return common + ["--epochs", str(self.epochs), "--batch", str(self.batch),
                         "--lr", str(self.lr), "--consistency", self.consistency,
                         "--seed", str(self.seed), "--json", "--progress", "0",
                         "--retry-budget", "120s"] + self.worker_args

    def _local_socket_args(self, index):
        """psd's --local-socket in the root directory, unless off or too
        long for a unix socket's path (107 bytes): then TCP alone."""
        path = os.path.join(self.root, "ps%d.sock" % index)
        if not self.local_socket or len(path.encode()) > 107:
            return ["--local-socket", "off"]  # psd opens one by default
        return ["--local-socket", path]

    def start_task(self, role, index):
        t = Task(role, index, self._argv(role, index), self._log(role, index),
                 wait_port=role in ("coordinator", "ps"),
                 env=self.worker_env if role in ("worker", "evaluator") else None)
        t.start()
        self.tasks[(role, index)] = t
        if role == "coordinator":
            self.coord_port = t.port
            self.coord_addr = "127.0.0.1:%d" % t.port
        return t

    def start(self, workers=True):
        if self.tls and not os.path.exists(os.path.join(self.certs, "ca.pem")):
            self.make_certs()
        if self.tokens and not os.path.exists(os.path.join(self.token_dir, "server")):
            self.make_tokens()
        self.start_task("coordinator", 0)
        for i in range(self.num_ps):
            self.start_task("ps", i)
        if self.evaluator:
            self.start_task("evaluator", 0)
        if workers:
            for i in range(self.num_workers):
                self.start_task("worker", i)

    def kill(self, role, index, sig=signal.SIGKILL):
        t = self.tasks[(role, index)]
        t.signal(sig)
        try:
            t.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            t.signal(signal.SIGKILL)
            t.proc.wait()

    def restart(self, role, index):
        return self.start_task(role, index)

    def workers(self):
        return [t for (r, _), t in sorted(self.tasks.items()) if r == "worker"]

    def wait_workers(self, timeout=600):
        """Waits for every worker; returns their JSON summaries by index."""
        deadline = time.monotonic() + timeout
        out = {}
        for t in self.workers():
            rc = t.wait(timeout=max(1, deadline - time.monotonic()))
            summary = None
            for line in reversed(t.output):
                if line.startswith("{"):
                    summary = json.loads(line)
                    break
            out[t.index] = (rc, summary)
        return out

    def cluster_state(self):
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                        "..", "tests", "interop"))
        import pstest  # noqa: E402
        pb, pbg, _, _ = pstest.generate_stubs()
        ch = self.channel(self.coord_addr)
        try:
            return pbg.CoordinatorStub(ch).GetCluster(
                pb.GetClusterRequest(job_id=self.job_id), timeout=5)
        finally:
            ch.close()

    def ps_stats(self, index):
        """Shard index's Stats (a ps.v1 StatsResponse), over TCP."""
        pb, pbg = self._stubs()
        ch = self.channel("127.0.0.1:%d" % self.ps_ports[index])
        try:
            return pbg.ParameterServerStub(ch).Stats(pb.StatsRequest(), timeout=5)
        finally:
            ch.close()

    def _stubs(self):
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                        "..", "tests", "interop"))
        import pstest  # noqa: E402
        pb, pbg, _, _ = pstest.generate_stubs()
        return pb, pbg

    def stop(self):
        """SIGTERM in dependency order (workers and evaluator, then the
        shards, then the coordinator), so that workers stop while the shards
        still answer; SIGKILL whatever is left after its grace."""
        order = [("worker", "evaluator"), ("ps",), ("coordinator",)]
        for roles in order:
            group = [t for (r, _), t in self.tasks.items() if r in roles]
            for t in group:
                t.signal(signal.SIGTERM)
            deadline = time.monotonic() + 15
            for t in group:
                if t.proc is None:
                    continue
                try:
                    t.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    t.signal(signal.SIGKILL)
                    t.proc.wait()
        for t in self.tasks.values():
            if t.proc is not None and t.proc.stdout:
                t.proc.stdout.close()
