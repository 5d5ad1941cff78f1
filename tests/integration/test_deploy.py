"""deploy/ checked offline (tests/deploy/ runs the compose cluster for
real): the compose file parses, every service runs one of our binaries
with flags that binary accepts and mounts only its own secrets, the
cluster spec it mounts validates, and the systemd units' ExecStart lines
use only flags their binaries accept."""
import configparser
import os
import re
import subprocess
import sys

import yaml

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "interop"))
import pstest  # noqa: E402

DEPLOY = os.path.join(pstest.SOURCE_ROOT, "deploy")
BINS = {"psd": ("server", "psd"), "pscoord": ("coordinator", "pscoord"),
        "workerd": ("worker", "workerd"), "psctl": ("tools", "psctl"),
        "pscerts": ("tools", "pscerts")}


def flags_of(binary):
    return pstest.help_flags(os.path.join(pstest.BUILD_ROOT, *BINS[binary]))


def dockerfile_final_stage(path):
    """The instructions of the Dockerfile's last stage, as (KEYWORD, args),
    continuation lines joined and comments dropped."""
    lines, cur = [], ""
    for raw in open(path):
        line = raw.rstrip("\n")
        if not cur and line.lstrip().startswith("#"):
            continue
        if line.endswith("\\"):
            cur += line[:-1] + " "
            continue
        cur += line
        if cur.strip():
            lines.append(cur.strip())
        cur = ""
    stages = [[]]
    for ln in lines:
        kw, _, args = ln.partition(" ")
        if kw.upper() == "FROM":
            stages.append([])
        stages[-1].append((kw.upper(), args.strip()))
    return stages[-1]


def check_dockerfile(r, services):
    """The image runs as a fixed non-root uid that owns every directory the
    compose cluster mounts a volume on (issue 13: the image runs as a
    non-root user)."""
    final = dockerfile_final_stage(os.path.join(DEPLOY, "Dockerfile"))
    users = [a for k, a in final if k == "USER"]
    user = users[-1] if users else ""
    uid = user.split(":")[0]
    r.check(uid.isdigit() and int(uid) != 0,
            "the image's last USER is a fixed non-root uid (%r)" % (user or None))
    runs = " ".join(a for k, a in final if k == "RUN")
    chowned = re.findall(r"chown\s+(?:-R\s+)?(\d+)(?::\d+)?\s+([^&;]+)", runs)
    owned = [path for who, paths in chowned if who == uid for path in paths.split()]
    for name, svc in services.items():
        if str(svc.get("user", "")).split(":")[0] == "0" or "image" in svc and \
                svc["image"] != "psd:local":
            continue  # certs: root to hand each new volume to the psd user
        for vol in svc.get("volumes", []):
            parts = vol.split(":")
            if len(parts) < 2 or parts[0].startswith("."):
                continue  # a bind mount of a file from deploy/, read-only
            target = parts[1]
            r.check(any(target == o or target.startswith(o.rstrip("/") + "/")
                        for o in owned),
                    "%s: the volume on %s is a directory the image's user %s owns"
                    % (name, target, uid))


def certs_bundles(certs):
    """{task: "ROLE[,serves]"} of the ps-bundle line in the certs
    service's script."""
    script = " ".join(certs.get("command", []))
    words = script[script.find("ps-bundle"):].replace("\\", " ").split()
    return dict(w.rstrip("'").split("=", 1) for w in words if "=" in w and
                not w.startswith("-"))


def main():
    r = pstest.Results("deploy")
    known = {b: flags_of(b) for b in BINS if os.path.exists(
        os.path.join(pstest.BUILD_ROOT, *BINS[b]))}
    compose = yaml.safe_load(open(os.path.join(DEPLOY, "docker-compose.yml")))
    services = compose.get("services", {})
    r.check(set(services) >= {"pscoord", "ps0", "ps1", "worker0", "worker1", "evaluator"},
            "compose defines the coordinator, two shards, two workers, an evaluator")
    bundles = certs_bundles(services.get("certs", {}))
    for name, svc in services.items():
        if name in ("certs", "prometheus"):
            continue  # a shell script of pscerts and ps-bundle; Debian's prometheus
        cmd = svc.get("entrypoint") or svc.get("command") or []
        binary = cmd[0] if cmd else None
        r.check(binary in BINS, "%s runs one of our binaries (%s)" % (name, binary))
        if binary in known:
            bad = [a.split("=")[0] for a in cmd[1:] if a.startswith("--") and
                   a.split("=")[0] not in known[binary]]
            r.check(not bad, "%s: every flag is one %s accepts %s" % (name, binary, bad or ""))
        for dep in svc.get("depends_on", []):
            r.check(dep in services, "%s depends on a defined service %s" % (name, dep))
        # Secrets: each task mounts its own bundle (made by certs with
        # ps-bundle) and no other: the CA's volume is the certs service's.
        vols = [v.split(":") for v in svc.get("volumes", [])]
        tls = [v[0] for v in vols if len(v) > 1 and v[1] == "/etc/psd/tls"]
        r.check(tls == ["tls-" + name] and name in bundles and
                not any(v[0] == "ca" or v[0].startswith("tls-") and v[0] != "tls-" + name
                        for v in vols),
                "%s mounts only its own bundle, tls-%s, made by certs (%s)"
                % (name, name, [":".join(v) for v in vols]))
        if binary in ("psd", "pscoord", "workerd"):
            r.check(all(f in cmd for f in ("--tls-cert", "--tls-key", "--tls-ca",
                                           "--token-file")),
                    "%s runs with mutual TLS and sends its token" % name)
            serves = binary in ("psd", "pscoord")
            table = cmd[cmd.index("--tokens") + 1] if "--tokens" in cmd else ""
            r.check((table == "/etc/psd/tls/tokens") == serves and
                    bundles.get(name, "").endswith(",serves") == serves,
                    "%s %s" % (name, "checks every call's token against the hashed table"
                               if serves else "holds no role table"))
    check_dockerfile(r, services)
    spec = os.path.join(DEPLOY, "compose-cluster.json")
    p = subprocess.run([os.path.join(pstest.BUILD_ROOT, "tools", "psctl"), "cluster",
                        "validate", spec], capture_output=True, text=True, timeout=30)
    r.check(p.returncode == 0, "the compose cluster spec validates (%s)"
            % (p.stderr.strip() or p.stdout.strip().splitlines()[0]))
    for unit in sorted(u for u in os.listdir(os.path.join(DEPLOY, "systemd"))
                       if u.endswith(".service")):
        cp = configparser.ConfigParser(strict=False, interpolation=None)
        cp.read(os.path.join(DEPLOY, "systemd", unit))
        ok = cp.has_section("Unit") and cp.has_section("Service") and cp.has_section("Install")
        r.check(ok, "%s has [Unit], [Service], [Install]" % unit)
        start = cp.get("Service", "ExecStart", fallback="").split()
        binary = os.path.basename(start[0]) if start else None
        r.check(binary in BINS, "%s starts one of our binaries (%s)" % (unit, binary))
        if binary in known:
            bad = [a for a in start[1:] if a.startswith("--") and a not in known[binary]]
            r.check(not bad, "%s: every flag is one %s accepts %s" % (unit, binary, bad or ""))
    check_examples(r, known)
    r.finish()


def check_examples(r, known):
    """deploy/etc: each example configuration uses only options its daemon
    accepts, and the example cluster spec validates."""
    import json
    etc = os.path.join(DEPLOY, "etc")
    for name, binary in (("psd-0.json", "psd"), ("workerd-0.json", "workerd")):
        keys = json.load(open(os.path.join(etc, name)))
        if binary in known:
            bad = ["--" + k for k in keys if "--" + k not in known[binary]]
            r.check(not bad, "etc/%s: every key is an option of %s %s" % (name, binary, bad or ""))
    p = subprocess.run([os.path.join(pstest.BUILD_ROOT, "tools", "psctl"), "cluster",
                        "validate", os.path.join(etc, "cluster.json")],
                       capture_output=True, text=True, timeout=30)
    r.check(p.returncode == 0, "etc/cluster.json validates (%s)" % p.stderr.strip())


if __name__ == "__main__":
    main()
