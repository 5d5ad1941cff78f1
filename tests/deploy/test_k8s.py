"""deploy/k8s rendered and validated (no cluster runs here): `kubectl
kustomize deploy/k8s`, the Secrets of make-secrets.sh and the pod templates
of the TFJob example are validated with PyPI's kubernetes-validate (in
build/venv-k8s) against Kubernetes K8S_VERSION, strictly; then what a
schema cannot say: every TF_CONFIG is a cluster spec psctl accepts, naming
the Services and ports the manifests define; every container runs one of
our binaries with flags it accepts; the probes are grpc.health.v1 through
ps-healthcheck; requests, scrape annotations, a PodDisruptionBudget; the
workers an Indexed Job whose TF_CONFIG takes the completion index; each
Secret holds only its role's files. Skipped, with one line, only when
PyPI cannot be reached to install kubernetes-validate.
"""
import json
import os
import re
import subprocess
import sys
import tempfile
import urllib.request

import yaml

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "interop"))
import pstest  # noqa: E402

K8S_VERSION = "1.32.0"  # the version doc/deploy.md names
K8S = os.path.join(pstest.SOURCE_ROOT, "deploy", "k8s")
VENV = os.path.join(pstest.BUILD_ROOT, "venv-k8s")
BINS = {"psd": ("server", "psd"), "pscoord": ("coordinator", "pscoord"),
        "workerd": ("worker", "workerd")}


def validator():
    exe = os.path.join(VENV, "bin", "kubernetes-validate")
    if os.path.exists(exe):
        return exe
    try:
        urllib.request.urlopen("https://pypi.org/simple/kubernetes-validate/", timeout=15)
    except OSError as e:
        print("SKIP PyPI cannot be reached to install kubernetes-validate (%s)" % e)
        sys.exit(77)
    subprocess.run([sys.executable, "-m", "venv", VENV], check=True, timeout=300)
    p = subprocess.run([os.path.join(VENV, "bin", "pip"), "install", "--quiet",
                        "--disable-pip-version-check", "kubernetes-validate"],
                       capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        sys.exit("pip install kubernetes-validate failed: %s" % p.stderr.strip()[-500:])
    return exe


def validate(r, exe, docs, what):
    """kubernetes-validate --strict on docs; one check per object."""
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        yaml.safe_dump_all(docs, f)
    p = subprocess.run([exe, "-k", K8S_VERSION, "--strict", f.name], capture_output=True,
                       text=True, timeout=300)
    os.unlink(f.name)
    lines = [ln for ln in (p.stdout + p.stderr).splitlines() if ln.strip()]
    passed = [ln for ln in lines if ln.startswith("INFO") and " passed " in ln]
    bad = [ln for ln in lines if not (ln.startswith("INFO") and " passed " in ln)]
    r.check(p.returncode == 0 and not bad and len(passed) == len(docs),
            "%s: %d objects valid for Kubernetes %s %s" % (what, len(passed), K8S_VERSION,
                                                           bad[:3] or ""))


def flags_of(binary):
    return pstest.help_flags(os.path.join(pstest.BUILD_ROOT, *BINS[binary]))


def pod_specs(docs):
    """(workload name, pod template) of each workload."""
    for d in docs:
        if d["kind"] in ("StatefulSet", "Job", "Deployment"):
            yield d["metadata"]["name"], d["spec"]["template"]


def env_value(container, name, subst):
    for e in container.get("env", []):
        if e["name"] == name and "value" in e:
            v = e["value"]
            for k, x in subst.items():
                v = v.replace("$(%s)" % k, x)
            return v
    return None


def check_tf_config(r, docs, tmp):
    services = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Service"}
    sets = {d["metadata"]["name"]: d for d in docs if d["kind"] == "StatefulSet"}
    for name, tpl in pod_specs(docs):
        c = tpl["spec"]["containers"][0]
        names = [e["name"] for e in c.get("env", [])]
        for i in range(2):
            tf = env_value(c, "TF_CONFIG", {"POD_INDEX": str(i), "JOB_COMPLETION_INDEX": str(i)})
            r.check(tf is not None, "%s sets TF_CONFIG" % name)
            if tf is None:
                break
            path = os.path.join(tmp, "%s-%d.json" % (name, i))
            open(path, "w").write(tf)
            p = subprocess.run([os.path.join(pstest.BUILD_ROOT, "tools", "psctl"), "cluster",
                                "validate", path], capture_output=True, text=True, timeout=30)
            r.check(p.returncode == 0, "%s's TF_CONFIG (index %d) is a cluster spec psctl "
                    "accepts %s" % (name, i, p.stderr.strip()))
            spec = json.loads(tf)
            for role, svc, port in (("chief", "pscoord", 7071), ("ps", "psd", 7070)):
                addrs = spec["cluster"].get(role, [])
                want = ["%s-%d.%s:%d" % (svc, k, svc, port)
                        for k in range(sets[svc]["spec"]["replicas"])]
                r.check(addrs == want and sets[svc]["spec"]["serviceName"] == svc and
                        services[svc]["spec"].get("clusterIP") == "None",
                        "%s: TF_CONFIG's %s %s are the pods of StatefulSet %s behind its "
                        "headless Service" % (name, role, addrs, svc))
            uses = re.findall(r"\$\((\w+)\)", [e for e in c["env"]
                                               if e["name"] == "TF_CONFIG"][0]["value"])
            r.check(all(u in names[:names.index("TF_CONFIG")] for u in uses),
                    "%s: TF_CONFIG uses %s, each defined before it" % (name, uses or "nothing"))
            if not uses:
                break


def check_workloads(r, docs, known):
    kinds = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    coord = kinds.get(("StatefulSet", "pscoord"))
    r.check(coord is not None and coord["spec"]["replicas"] == 1 and
            coord["spec"].get("volumeClaimTemplates"),
            "pscoord is a StatefulSet of one with a volume claim")
    if coord:
        c = coord["spec"]["template"]["spec"]["containers"][0]
        state = c["args"][c["args"].index("--state-dir") + 1]
        r.check(any(m["mountPath"] == state and m["name"] == "state"
                    for m in c["volumeMounts"]),
                "pscoord's --state-dir %s is its claimed volume" % state)
    ps = kinds.get(("StatefulSet", "psd"))
    r.check(ps is not None and ps["spec"].get("volumeClaimTemplates") and
            ("Service", ps["spec"]["serviceName"]) in kinds,
            "psd is a StatefulSet with volume claims and its headless Service")
    job = kinds.get(("Job", "workers"))
    r.check(job is not None and job["spec"].get("completionMode") == "Indexed" and
            job["spec"]["completions"] == 2,
            "the workers are an Indexed Job of 2 completions")
    r.check(("Job", "evaluator") in kinds, "the evaluator is a Job")
    pdbs = [d for d in docs if d["kind"] == "PodDisruptionBudget"]
    r.check(any(d["spec"]["selector"]["matchLabels"].get("app.kubernetes.io/name") == "psd"
                for d in pdbs), "a PodDisruptionBudget covers the psd shards")
    for name, tpl in pod_specs(docs):
        c = tpl["spec"]["containers"][0]
        binary = c["args"][0]
        r.check(binary in known, "%s runs one of our binaries (%s)" % (name, binary))
        if binary in known:
            bad = [a for a in c["args"][1:] if a.startswith("--") and a not in known[binary]]
            r.check(not bad, "%s: every flag is one %s accepts %s" % (name, binary, bad or ""))
        req = c.get("resources", {}).get("requests", {})
        r.check("cpu" in req and "memory" in req, "%s requests cpu and memory (%s)"
                % (name, req))
        ann = tpl["metadata"].get("annotations", {})
        mport = c["args"][c["args"].index("--metrics-listen") + 1].rsplit(":", 1)[1] \
            if "--metrics-listen" in c["args"] else None
        r.check(ann.get("prometheus.io/scrape") == "true" and
                ann.get("prometheus.io/port") == mport and
                any(str(p["containerPort"]) == mport for p in c.get("ports", [])),
                "%s: Prometheus scrapes its --metrics-listen port %s" % (name, mport))
        serves = binary in ("psd", "pscoord")
        probes = [c.get(k, {}).get("exec", {}).get("command") for k in
                  ("readinessProbe", "livenessProbe")]
        r.check(not serves or probes == [["ps-healthcheck"]] * 2,
                "%s: %s" % (name, "readiness and liveness through grpc.health.v1 "
                            "(ps-healthcheck)" if serves else "serves no gRPC, no probe"))
        secret = [v["secret"]["secretName"] for v in tpl["spec"].get("volumes", [])
                  if "secret" in v]
        yield name, secret, serves


def check_secrets(r, exe, tmp, wanted):
    out = os.path.join(tmp, "secrets")
    p = subprocess.run(["sh", os.path.join(K8S, "make-secrets.sh"), out], capture_output=True,
                       text=True, timeout=120)
    r.check(p.returncode == 0, "make-secrets.sh makes the Secrets (%s)"
            % (p.stderr.strip() or p.stdout.strip()))
    if p.returncode != 0:
        return
    docs = [d for d in yaml.safe_load_all(open(os.path.join(out, "secrets.yaml"))) if d]
    validate(r, exe, docs, "make-secrets.sh's secrets.yaml")
    have = {d["metadata"]["name"]: set(d["data"]) for d in docs}
    for workload, names, serves in wanted:
        for n in names:
            want = {"ca.pem", "tls.pem", "tls.key", "token"} | ({"tokens"} if serves else set())
            r.check(have.get(n) == want, "%s's Secret %s holds only its role's files: %s"
                    % (workload, n, sorted(have.get(n, [])) or "missing"))
    san = subprocess.run(["openssl", "x509", "-noout", "-ext", "subjectAltName", "-in",
                          os.path.join(out, "bundles", "ps", "tls.pem")],
                         capture_output=True, text=True).stdout
    r.check("DNS:psd-0.psd" in san and "DNS:psd-1.psd" in san and "IP Address:127.0.0.1" in san,
            "the ps certificate names psd-0.psd, psd-1.psd and 127.0.0.1 (the probe)")


def check_tfjob(r, exe, known):
    tf = yaml.safe_load(open(os.path.join(K8S, "tfjob.yaml")))
    reps = tf["spec"]["tfReplicaSpecs"]
    r.check(tf["kind"] == "TFJob" and tf["apiVersion"] == "kubeflow.org/v1" and
            set(reps) == {"Chief", "PS", "Worker", "Evaluator"},
            "tfjob.yaml is a kubeflow.org/v1 TFJob with Chief, PS, Worker and Evaluator")
    docs = []
    want = {"Chief": "pscoord", "PS": "psd", "Worker": "workerd", "Evaluator": "workerd"}
    for rtype, spec in reps.items():
        c = spec["template"]["spec"]["containers"][0]
        docs.append({"apiVersion": "v1", "kind": "PodTemplate",
                     "metadata": {"name": "tfjob-" + rtype.lower()},
                     "template": spec["template"]})
        r.check(c["name"] == "tensorflow" and c["args"][0] == want[rtype] and
                any(p.get("name") == "tfjob-port" and p["containerPort"] == 2222
                    for p in c["ports"]),
                "TFJob %s runs %s in the container 'tensorflow' on tfjob-port 2222"
                % (rtype, want[rtype]))
        bad = [a for a in c["args"][1:] if a.startswith("--") and a not in known[c["args"][0]]]
        r.check(not bad, "TFJob %s: every flag is one %s accepts %s" % (rtype, c["args"][0],
                                                                       bad or ""))
        r.check("--coordinator" not in c["args"] and "--task-index" not in c["args"],
                "TFJob %s takes the coordinator and its index from TF_CONFIG" % rtype)
    validate(r, exe, docs, "the TFJob's pod templates")


def main():
    r = pstest.Results("k8s")
    exe = validator()
    p = subprocess.run(["kubectl", "kustomize", K8S], capture_output=True, text=True,
                       timeout=120)
    # Newer kustomize warns that commonLabels is deprecated; kept for
    # Debian's kubectl 1.20, which knows no other (kustomization.yaml).
    noise = [ln for ln in p.stderr.splitlines() if ln.strip() and "commonLabels" not in ln]
    r.check(p.returncode == 0 and not noise,
            "kubectl kustomize deploy/k8s renders %s" % " | ".join(noise)[-300:])
    docs = [d for d in yaml.safe_load_all(p.stdout) if d]
    validate(r, exe, docs, "deploy/k8s")
    known = {b: flags_of(b) for b in BINS}
    tmp = pstest.tmpdir("k8s-")
    check_tf_config(r, docs, tmp)
    wanted = list(check_workloads(r, docs, known))
    check_secrets(r, exe, tmp, wanted)
    check_tfjob(r, exe, known)
    r.finish()


if __name__ == "__main__":
    main()
