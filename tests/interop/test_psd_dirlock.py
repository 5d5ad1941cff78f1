"""Issue 17, item 4: one directory, one daemon.

Two psd processes given one --data-dir used to serve it at once, and an
acknowledged push to one was lost when the other's write-behind flushed over
it. Now the second exits 1 with one line naming the pid that holds the
directory, the first goes on serving with its value intact, and after a
kill -9 of the holder the lock is gone with it: a new psd starts at once
and finds the pushed value. Likewise for pscoord's --state-dir.
"""
import os
import signal
import subprocess
import sys

sys.path.insert(0, os.path.dirname(__file__))
import pstest  # noqa: E402

pb, pb_grpc, _, _ = pstest.generate_stubs()
R = pstest.Results("dirlock")
BIN = pstest.BUILD_ROOT


def second(argv):
    """Runs a second daemon that must refuse: (exit status, stderr)."""
    p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True, timeout=20)
    return p.returncode, p.stderr


def psd_case():
    d = pstest.tmpdir()
    first = pstest.start_psd(d)
    stub = pb_grpc.ParameterServerStub(pstest.channel(first.address))
    stub.CreateVariable(pb.CreateVariableRequest(spec=pstest.spec(pb, "w", [4], lr=1.0)))
    stub.Push(pb.PushRequest(grads=[pstest.grad(pb, "w", [1, 2, 3, 4])]))
    rc, err = second([pstest.psd_path(), "--data-dir", d, "--listen", "127.0.0.1:0"])
    lines = err.strip().splitlines()
    R.check(rc == 1, "a second psd on one --data-dir exits 1 (got %d)" % rc)
    R.check(len(lines) == 1 and str(first.proc.pid) in lines[0] and d in lines[0],
            "its one line names the directory and the holder's pid: %r" % err.strip())
    got = pstest.value(stub.Pull(pb.PullRequest(items=[pb.PullItem(name="w")])).values[0])
    R.check(list(got) == [-1, -2, -3, -4], "the first psd still serves its value")
    first.stop(signal.SIGKILL)
    again = pstest.start_psd(d)
    stub = pb_grpc.ParameterServerStub(pstest.channel(again.address))
    got = pstest.value(stub.Pull(pb.PullRequest(items=[pb.PullItem(name="w")])).values[0])
    R.check(list(got) == [-1, -2, -3, -4],
            "after kill -9 of the holder a new psd starts and has the value")
    again.stop()
    rc, err = second([pstest.psd_path(), "--data-dir", "/proc/self/nonexistent",
                      "--listen", "127.0.0.1:0"])
    R.check(rc == 1 and len(err.strip().splitlines()) == 1 and "cannot lock" in err,
            "an unusable --data-dir is one line and exit 1: %r" % err.strip())


def pscoord_case():
    s = pstest.tmpdir()
    argv = [os.path.join(BIN, "coordinator", "pscoord"), "--state-dir", s,
            "--listen", "127.0.0.1:0", "--log-level", "warn"]
    first = pstest.Daemon(argv)
    rc, err = second(argv)
    R.check(rc == 1 and str(first.proc.pid) in err and
            len(err.strip().splitlines()) == 1,
            "a second pscoord on one --state-dir exits 1 naming the pid: %r" % err.strip())
    R.check(first.proc.poll() is None, "the first pscoord goes on")
    first.stop(signal.SIGKILL)
    again = pstest.Daemon(argv)
    R.check(again.port is not None, "after kill -9 a new pscoord takes the directory")
    again.stop()


psd_case()
pscoord_case()
R.finish()
