"""One vocabulary across the binaries, their old names, and their
environment variables.

  vocabulary  each binary's --help (psd, pscoord, workerd, psctl and every
              psctl command) is read, and the table CONCEPTS below lists each
              concept that more than one place has with its one flag name:
              a place that lacks it, or that still has another name for it,
              fails; durations are DURATION flags without a unit in their
              name; every binary has the same --log-level default;
  old names   an old name still works and warns once on stderr, however
              often it is given;
  environment every option also comes from PREFIX_NAME (PSD_, PSCOORD_,
              WORKERD_); a bad value exits 2 with one line naming the
              variable; defaults < config file < environment < command line,
              checked against real daemons on 127.0.0.1:0.

Prints ok/FAIL per check and "flags: N passed, N failed".
"""
import json
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "interop"))
import pstest  # noqa: E402

B = pstest.BUILD_ROOT
BIN = {"psd": os.path.join(B, "server", "psd"),
       "pscoord": os.path.join(B, "coordinator", "pscoord"),
       "workerd": os.path.join(B, "worker", "workerd"),
       "psctl": os.path.join(B, "tools", "psctl")}
PSCTL_COMMANDS = ["list", "show", "pull", "create", "delete", "checkpoint", "restore",
                  "stats", "health", "cluster validate", "status", "top", "token"]
PSD_CALLS = ["psctl " + c for c in ["list", "show", "pull", "create", "delete",
                                    "checkpoint", "restore", "stats", "health"]]
DAEMONS = ["psd", "pscoord", "workerd"]
ALL = DAEMONS + ["psctl"]

# concept, its one name, where it must be, other names it must not have
# (anywhere, or in the places named after a colon).
CONCEPTS = [
    ("workers in the job", "--workers", ["psd", "workerd", "psctl create"],
     ["--num-workers", "--nworkers", "--worker-count"]),
    ("deadline of one call", "--rpc-timeout",
     ["workerd", "psctl", "psctl status", "psctl top"] + PSD_CALLS,
     ["--timeout", "--call-timeout", "--deadline"]),
    ("threads serving calls", "--threads", ["psd", "pscoord"],
     ["--server-threads", "--grpc-threads", "--threads:workerd"]),
    ("compute threads", "--blas-threads", ["workerd"], ["--compute-threads"]),
    ("seed of the variables' initializers", "--init-seed", ["workerd", "psctl create"],
     ["--seed:psctl create", "--initializer-seed"]),
    ("seed of the data order", "--seed", ["workerd"], ["--shuffle-seed", "--data-seed"]),
    ("log level", "--log-level", ALL, ["--loglevel", "--verbosity", "--verbose"]),
    ("log format", "--log-format", ALL, ["--log-json"]),
    ("job id", "--job-id", DAEMONS, ["--job", "--job-name"]),
    ("the coordinator's address", "--coordinator",
     ["psd", "workerd", "psctl list", "psctl stats", "psctl status", "psctl top"],
     ["--coord", "--pscoord", "--coordinator-address"]),
    ("metrics address", "--metrics-listen", DAEMONS, ["--metrics-port", "--metrics-addr"]),
    ("token file", "--token-file", ALL, ["--token"]),
    ("task index", "--task-index", ["psd", "workerd"], ["--index", "--task-id"]),
    ("shutdown grace", "--shutdown-grace", ["psd", "pscoord"], ["--grace"]),
    ("checkpoints kept", "--checkpoint-keep", ["psd", "pscoord"], ["--keep-checkpoints"]),
    ("a slowed step", "--step-delay", ["workerd"], ["--step-delay-ms"]),
    ("output format", "--output", ["psctl list", "psctl stats", "psctl status",
                                   "psctl top", "psctl cluster validate"], ["--format"]),
]
FLAG = re.compile(r"^  (--\[no-\])?(--[a-z0-9][a-z0-9-]*)(?: (\S+))?\s*(.*)$")
DURATION_NAME = re.compile(r"-(timeout|interval|delay|grace|wait|budget|after)$|^--keepalive$")
UNIT_NAME = re.compile(r"-(ms|us|ns|sec|secs|seconds|s|minutes|mb|kb|gb|mib|kib|gib)$")


def helps():
    """{place: {flag: (type, text)}} from every --help."""
    out = {}
    for name in ALL:
        out[name] = subprocess.run([BIN[name], "--help"], capture_output=True, text=True,
                                   timeout=30).stdout
    for c in PSCTL_COMMANDS:
        out["psctl " + c] = subprocess.run([BIN["psctl"], *c.split(), "--help"],
                                           capture_output=True, text=True,
                                           timeout=30).stdout
    flags = {}
    for place, text in out.items():
        fl = {}
        last = None
        for line in text.splitlines():
            if line.startswith("Commands:"):
                break
            m = FLAG.match(line)
            if m:
                kind = "BOOL" if m.group(1) else (m.group(3) or "")
                last = m.group(2)
                fl[last] = (kind, m.group(4))
            elif last is not None and line.startswith(" " * 30):
                # A long flag's help goes on the next line.
                fl[last] = (fl[last][0], (fl[last][1] + " " + line.strip()).strip())
            else:
                last = None
        flags[place] = fl
    return out, flags


def one_line(p, code, *words):
    lines = [l for l in p.stderr.splitlines() if l.strip()]
    return (p.returncode == code and len(lines) == 1 and all(w in lines[0] for w in words),
            "exit %d, %r" % (p.returncode, lines))


def run(name, *args, env=None, timeout=30):
    e = dict(os.environ)
    e.update(env or {})
    return subprocess.run([BIN[name], *args], capture_output=True, text=True,
                          timeout=timeout, env=e)


def check_vocabulary(r):
    text, flags = helps()
    r.check(all(len(flags[p]) > 0 for p in flags),
            "every --help lists its flags: %s" % {p: len(f) for p, f in flags.items()})
    for concept, name, where, others in CONCEPTS:
        missing = [p for p in where if name not in flags[p]]
        r.check(not missing, "%s is %s in %s: missing in %s" % (concept, name,
                                                                ", ".join(where), missing))
        found = []
        for o in others:
            flag, _, scope = o.partition(":")
            for p in ([scope] if scope else flags):
                if flag in flags[p]:
                    found.append("%s in %s" % (flag, p))
        r.check(not found, "%s has no second name: %s" % (concept, found or "none"))
    bad_dur = ["%s %s (%s)" % (p, f, k) for p, fl in flags.items() for f, (k, _) in fl.items()
               if DURATION_NAME.search(f) and k != "DURATION"]
    r.check(not bad_dur, "every timeout, interval, delay, grace, wait and budget is a "
            "DURATION (takes 500ms, 30s): %s" % (bad_dur or "all are"))
    units = ["%s %s" % (p, f) for p, fl in flags.items() for f in fl if UNIT_NAME.search(f)]
    r.check(not units, "no flag carries a unit in its name: %s" % (units or "none"))
    defaults = {p: re.search(r"\(default: (\w+)\)", flags[p]["--log-level"][1]).group(1)
                for p in ALL if "--log-level" in flags[p]}
    r.check(len(set(defaults.values())) == 1 and len(defaults) == 4,
            "one --log-level default in every binary: %s" % defaults)
    epoch = [p for p, t in text.items() if re.search(r"\bepoch\b(?!s)", t) and
             re.search(r"(membership|generation|cluster) epoch|epoch, global step", t)]
    r.check(not epoch, "no --help calls the membership counter an epoch: %s" % epoch)
    for name in DAEMONS:
        t = text[name]
        prefix = {"psd": "PSD", "pscoord": "PSCOORD", "workerd": "WORKERD"}[name]
        r.check("%s_NAME" % prefix in t and "defaults, then the config file, then the "
                "environment, then\nthe command line" in t and "Exit status" in t,
                "%s --help states its environment prefix %s_, the precedence and the "
                "exit statuses" % (name, prefix))


def check_old_names(r):
    p = run("workerd", "--num-workers", "2", "--task-index", "5", "--num-workers", "2",
            "--step-delay-ms", "1")
    warn = [l for l in p.stderr.splitlines() if "warning" in l]
    r.check(p.returncode == 2 and len(warn) == 2 and
            "workerd: warning: --num-workers is an old name for --workers" in warn[0] and
            "--step-delay-ms is an old name for --step-delay" in warn[1] and
            "--task-index 5 is out of range for --workers 2" in p.stderr,
            "workerd's old names work and each warns once: %r" % p.stderr)
    p = run("psctl", "--timeout", "1s", "stats", "--timeout", "2s", "--server",
            "127.0.0.1:1")
    r.check(p.returncode == 1 and p.stderr.count("warning") == 1 and
            "--timeout is an old name for --rpc-timeout" in p.stderr,
            "psctl --timeout still works, before and after the command, with one warning: "
            "%r" % p.stderr)
    tmp = pstest.tmpdir()
    cfg = os.path.join(tmp, "w.json")
    with open(cfg, "w") as f:
        json.dump({"num-workers": 3, "task-index": 3}, f)
    p = run("workerd", "--config", cfg)
    r.check(p.returncode == 2 and "num-workers is an old name for workers" in p.stderr and
            "--task-index 3 is out of range for --workers 3" in p.stderr,
            "an old name in a config file works and warns: %r" % p.stderr)


def check_environment(r):
    tmp = pstest.tmpdir()
    for name, var, value, args in (
            ("psd", "PSD_THREADS", "many", ["--data-dir", os.path.join(tmp, "d")]),
            ("psd", "PSD_MAX_MESSAGE", "huge", ["--data-dir", os.path.join(tmp, "d")]),
            ("pscoord", "PSCOORD_HEARTBEAT_TIMEOUT", "soon",
             ["--state-dir", os.path.join(tmp, "c")]),
            ("workerd", "WORKERD_BATCH", "0", []),
            ("workerd", "WORKERD_LOCAL", "perhaps", [])):
        p = run(name, *args, env={var: value})
        ok, line = one_line(p, 2, var, value)
        r.check(ok and p.stderr.startswith(name + ": " + var),
                "%s=%s: %s exits 2 with one line naming it: %s" % (var, value, name, line))
    r.check(not os.path.exists(os.path.join(tmp, "d")),
            "psd refused its bad environment before touching --data-dir")

    # psd: defaults < config file < environment < command line, by where
    # its store ends up.
    dirs = {k: os.path.join(tmp, k) for k in ("file", "env", "cli")}
    cfg = os.path.join(tmp, "psd.json")
    with open(cfg, "w") as f:
        json.dump({"data-dir": dirs["file"], "listen": "127.0.0.1:0",
                   "log-level": "warn"}, f)

    def psd_dir(env, *args):
        e = dict(os.environ, **env)
        d = pstest.Daemon([BIN["psd"], *args], env=e)
        d.stop()
        return sorted(k for k, v in dirs.items()
                      if os.path.exists(os.path.join(v, "data.mdb")))
    got = psd_dir({}, "--config", cfg)
    r.check(got == ["file"], "psd: the config file's data-dir over the default (%s)" % got)
    got = psd_dir({"PSD_DATA_DIR": dirs["env"]}, "--config", cfg)
    r.check(got == ["env", "file"], "psd: PSD_DATA_DIR over the config file (%s)" % got)
    got = psd_dir({"PSD_DATA_DIR": dirs["env"], "PSD_CONFIG": cfg}, "--data-dir", dirs["cli"])
    r.check(got == ["cli", "env", "file"],
            "psd: --data-dir over PSD_DATA_DIR; PSD_CONFIG names the file (%s)" % got)

    # pscoord: the job id as its GetCluster reports it.
    ccfg = os.path.join(tmp, "pscoord.json")
    with open(ccfg, "w") as f:
        json.dump({"job-id": "from-file", "listen": "127.0.0.1:0"}, f)

    def job(env, *args):
        e = dict(os.environ, **env)
        c = pstest.Daemon([BIN["pscoord"], "--state-dir", pstest.tmpdir(), *args], env=e)
        p = run("psctl", "status", "--coordinator", c.address, "-o", "json")
        c.stop()
        return json.loads(p.stdout)["job_id"] if p.returncode == 0 else p.stderr
    got = [job({}, "--config", ccfg),
           job({"PSCOORD_JOB_ID": "from-env"}, "--config", ccfg),
           job({"PSCOORD_JOB_ID": "from-env", "PSCOORD_CONFIG": ccfg}, "--job-id", "from-cli")]
    r.check(got == ["from-file", "from-env", "from-cli"],
            "pscoord: file < PSCOORD_JOB_ID < --job-id: %s" % got)

    # workerd: --workers from the environment, as its refusal names it.
    p = run("workerd", "--task-index", "4", "--ps", "localhost", env={"WORKERD_WORKERS": "4"})
    r.check(p.returncode == 2 and "out of range for --workers 4" in p.stderr,
            "workerd: WORKERD_WORKERS sets --workers: %r" % p.stderr.strip())
    p = run("workerd", "--task-index", "4", "--workers", "5", "--ps", "localhost",
            env={"WORKERD_WORKERS": "4"})
    r.check(p.returncode == 2 and "out of range" not in p.stderr and "--ps" in p.stderr,
            "workerd: --workers on the command line wins over WORKERD_WORKERS")


def main():
    pstest.run_all("flags", (check_vocabulary, check_old_names, check_environment))


if __name__ == "__main__":
    main()
