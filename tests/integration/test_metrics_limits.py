"""/metrics against a slow-trickling client (slowloris), on a real psd on
127.0.0.1:0: 64 connections from 127.0.0.1 that each send a header byte
every second (so that the idle timeout never fires) once held every slot of
the endpoint, and scrapes from anywhere waited for as long as they went on.
Now one address holds at most 8 connections: a scrape from 127.0.0.2 (also
loopback) is answered at once, and gRPC serves as before. A non-loopback
--metrics-listen logs a warning that the page is plaintext and open.
"""
import os
import socket
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "interop"))
import pstest  # noqa: E402

TRICKLERS = 64


def metrics_port(d):
    line = d.proc.stdout.readline()
    if not line.startswith("METRICS_PORT "):
        raise RuntimeError("psd printed %r after PORT, not METRICS_PORT" % line)
    return int(line.split()[1])


def scrape_from(src, port, timeout=5.0):
    """Seconds a whole GET /metrics from source address src took, or None."""
    t0 = time.monotonic()
    s = socket.socket()
    s.settimeout(timeout)
    try:
        s.bind((src, 0))
        s.connect(("127.0.0.1", port))
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        data = pstest.recv_all(s)
        ok = data.startswith(b"HTTP/1.1 200") and b"psd_" in data
        return time.monotonic() - t0 if ok else None
    except OSError:
        return None
    finally:
        s.close()


def trickle(port, stop, opened):
    """One slowloris connection: a request line, then a header byte a second."""
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", 0))
        s.connect(("127.0.0.1", port))
        s.sendall(b"GET /metrics HTTP/1.1\r\nX-a: ")
        opened.append(s)
        while not stop.wait(1.0):
            s.sendall(b"a")
    except OSError:
        pass  # closed by psd: the per-address cap
    finally:
        s.close()


def main():
    pb, pbg, _, _ = pstest.generate_stubs()
    r = pstest.Results("metrics-limits")
    d = pstest.start_psd(pstest.tmpdir(), "--metrics-listen", "127.0.0.1:0")
    port = metrics_port(d)
    r.check(scrape_from("127.0.0.2", port) is not None, "a scrape is answered")
    stop, opened = threading.Event(), []
    threads = [threading.Thread(target=trickle, args=(port, stop, opened), daemon=True)
               for _ in range(TRICKLERS)]
    for t in threads:
        t.start()
    time.sleep(2.5)
    took = scrape_from("127.0.0.2", port)
    r.check(took is not None and took < 2.0,
            "with %d trickling connections from 127.0.0.1, a scrape from 127.0.0.2 is "
            "answered in %s s" % (TRICKLERS, "%.2f" % took if took is not None else "no"))
    ch = pstest.channel(d.address)
    st = pbg.ParameterServerStub(ch).Stats(pb.StatsRequest(), timeout=5)
    r.check(st is not None, "gRPC answers Stats meanwhile")
    ch.close()
    stop.set()
    for t in threads:
        t.join(5)
    r.check(d.stop() == 0, "psd exits 0 on SIGTERM")

    # A non-loopback metrics address: served, with a warning.
    log = os.path.join(pstest.tmpdir("metrics-log-"), "stderr")
    with open(log, "w") as f:
        w = pstest.Daemon([pstest.psd_path(), "--data-dir", pstest.tmpdir(), "--listen",
                           "127.0.0.1:0", "--metrics-listen", "0.0.0.0:0"], stderr=f)
        time.sleep(0.3)
        w.stop()
    lines = [l for l in open(log).read().splitlines() if "--metrics-listen 0.0.0.0:0" in l]
    r.check(len(lines) == 1 and "WARN" in lines[0] and "not a loopback address" in lines[0],
            "--metrics-listen 0.0.0.0:0 logs one warning: %s" % lines)
    r.finish()


if __name__ == "__main__":
    main()
