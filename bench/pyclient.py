"""psclient's step time for a 4 MiB variable (push with the values back),
over TCP, psd's unix socket, and the unix socket with shared memory, against
a real psd on 127.0.0.1:0. Run: /usr/bin/python3 bench/pyclient.py [BUILD]
(installs python/ into BUILD/venv-py as the tests do)."""
import os
import sys
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
if len(sys.argv) > 1:
    os.environ["PS_BUILD_ROOT"] = os.path.abspath(sys.argv[1])
sys.path.insert(0, os.path.join(ROOT, "tests", "python"))
import pyenv  # noqa: E402

pyenv.reexec()

import numpy as np  # noqa: E402

import pstest  # noqa: E402
from psclient import Client, Optimizer, Variable  # noqa: E402

N = 1 << 20  # floats: 4 MiB
STEPS = 100


def main():
    sock = os.path.join(pstest.tmpdir(), "psd.sock")
    d = pstest.start_psd(pstest.tmpdir(), "--local-socket", sock)
    g = np.full(N, 1e-6, np.float32)
    for mode, addr, shm in (("tcp", d.address, False), ("unix", "unix:" + sock, False),
                            ("unix+shm", "unix:" + sock, True)):
        with Client([addr], shm=shm) as c:
            c.create_variables([Variable(mode, (N,))], optimizer=Optimizer.sgd(0.1))
            for _ in range(5):
                c.push({mode: g}, return_values=True)
            t = time.perf_counter()
            for _ in range(STEPS):
                c.push({mode: g}, return_values=True)
            dt = (time.perf_counter() - t) / STEPS
            print("pyclient %-9s 4 MiB push+values: %.2f ms/step, %.0f MB/s each way"
                  % (mode, dt * 1e3, 4 * N / dt / 1e6), flush=True)
    d.stop()


if __name__ == "__main__":
    main()
