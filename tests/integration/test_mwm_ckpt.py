"""multi_worker_mirrored's job checkpoints go the parameter-server way: a
job with a ps task keeps its variables in that psd (the group's rank 0
pushes each step's averaged gradient, SGD at the same rate), so pscoord's
schedule writes the usual job manifests, a restarted job resumes from the
psd's values, and a psd whose data is lost is restored from the latest
manifest and the job resumes from that checkpoint's step.

Checks: the manifests exist; psd's values are the workers' parameters
(numpy computes the same FNV-1a checksum over the pulled values that the
workers print); a second run after a pscoord restart starts at the first
run's last step; after psd's data directory is wiped, pscoord restores it
and the next run starts at the latest manifest's step.
"""
import glob
import json
import os
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "fault"))
import mwmjob  # noqa: E402
import pstest  # noqa: E402

ARGS = ["--workers", "2", "--model", "softmax", "--seed", "3"]


def fnv(values):
    import numpy as np
    h = 0xcbf29ce484222325
    for b in np.asarray(values, dtype="<f4").tobytes():
        h = ((h ^ b) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return "%016x" % h


def start_psd(root, coord_addr):
    return pstest.Daemon([pstest.psd_path(), "--data-dir", os.path.join(root, "psd"),
                          "--checkpoint-root", os.path.join(root, "ck"), "--listen",
                          "127.0.0.1:0", "--coordinator", coord_addr, "--task-index", "0",
                          "--metrics-listen", "off", "--log-level", "warn"])


def run(job, args):
    for i in range(2):
        job.start(i, ARGS + args)
    codes = job.wait(180)
    logs = [mwmjob.parse(job.log(i, -1)) for i in range(2)]
    if any(codes.values()):
        job.dump()
    return codes, logs


def psd_checksum(pb, pbg, address):
    """FNV-1a of psd's values in the model's block order (one layer:
    kernel, then bias)."""
    import numpy as np
    ch = pstest.channel(address)
    s = pbg.ParameterServerStub(ch)
    lv = s.ListVariables(pb.ListVariablesRequest(), timeout=10)
    have = sorted(v.spec.name for v in lv.variables)
    order = [n for n in have if n.endswith("/kernel")] + [n for n in have
                                                           if n.endswith("/bias")]
    resp = s.Pull(pb.PullRequest(items=[pb.PullItem(name=n) for n in order]), timeout=10)
    vals = [np.frombuffer(v.value.data, dtype="<f4") for v in resp.values]
    ch.close()
    return fnv(np.concatenate(vals)), order


def main():
    r = pstest.Results("mwm-ckpt")
    pb, pbg, _, _ = pstest.generate_stubs()
    # Heartbeats every 50 ms: pscoord schedules checkpoints from the steps
    # they report; the first run's 468 steps take ~0.6 s (the all-reduce
    # runs over sync-mode pairs), so its workers sleep 3 ms a step for it
    # to cross several.
    coord_args = ["--checkpoint-every-steps", "40", "--heartbeat-interval", "50ms"]
    job = mwmjob.Job("ckpt", extra=coord_args)
    psd = start_psd(job.root, job.coord_addr())
    try:
        codes, logs = run(job, ["--epochs", "1", "--step-delay", "3"])
        r.check(codes == {0: 0, 1: 0}, "first run: both workers exit 0 (%s)" % codes)
        final = logs[0]["final"] or {}
        manifests = sorted(glob.glob(os.path.join(job.root, "coord", "checkpoints",
                                                  "job-*.json")))
        r.check(len(manifests) >= 2, "pscoord wrote job manifests (%s)"
                % [os.path.basename(m) for m in manifests])
        try:
            cs, names = psd_checksum(pb, pbg, psd.address)
            r.check(cs == final.get("checksum"), "psd holds the workers' parameters: "
                    "checksum %s over %s (workers: %s)" % (cs, names, final.get("checksum")))
        except Exception as e:
            r.check(False, "pulling psd's values: %s" % e)
        steps1 = final.get("job_step", -1)

        # pscoord restarted: the job resumes from psd's values.
        job.restart_coord()
        psd.stop()
        psd = start_psd(job.root, job.coord_addr())
        codes, logs = run(job, ["--epochs", "2"])
        formed = logs[0]["formed"][:1]
        r.check(codes == {0: 0, 1: 0} and formed and formed[0]["step"] == steps1,
                "a new run resumes at the first run's step %d (%s)" % (steps1, formed))
        r.check((logs[0]["final"] or {}).get("job_step") == 2 * steps1,
                "and ends after its second epoch at step %d (%s)"
                % (2 * steps1, (logs[0]["final"] or {}).get("job_step")))

        # psd's data lost: pscoord restores it from the latest manifest,
        # read once psd is down (pscoord may write one more, at the end of
        # the run, until then: the job's last step, 2 epochs' worth).
        psd.stop()
        manifests = sorted(glob.glob(os.path.join(job.root, "coord", "checkpoints",
                                                  "job-*.json")),
                           key=lambda p: int(p.rsplit("-", 1)[1][:-5]))
        latest = json.load(open(manifests[-1]))["step"]
        shutil.rmtree(os.path.join(job.root, "psd"))
        job.restart_coord()
        psd = start_psd(job.root, job.coord_addr())
        time.sleep(3)
        codes, logs = run(job, ["--epochs", "3"])
        formed = logs[0]["formed"][:1]
        r.check(codes == {0: 0, 1: 0} and formed and latest <= formed[0]["step"] <= 2 * steps1,
                "after psd's data was wiped the job resumes from the restored checkpoint "
                "(manifest step %d; formed %s)" % (latest, formed))
    finally:
        psd.kill()
        job.close()
    r.finish()


if __name__ == "__main__":
    main()
