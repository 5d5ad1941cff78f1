"""TF_CONFIG everywhere, as TensorFlow (and Kubeflow's TFJob) sets it, with
real daemons on 127.0.0.1 and temporary directories:
  chief     pscoord named chief[0] serves on the chief's port with no
            --listen (PORT line);
  ps        psd named ps[0], with no --coordinator and no --listen, serves
            on its task's port and registers with the chief's pscoord;
  workers   workerd named worker[0] and worker[1], with no --coordinator,
            finds pscoord from TF_CONFIG, registers at its index and trains;
            one named evaluator[0], which the cluster does not list (as
            TensorFlow and TFJob have it), registers and evaluates;
  psclient  a Client() given nothing takes its task from TF_CONFIG
            (worker[2] via the chief) and, in from_environment, from RANK
            and WORLD_SIZE;
  disagree  a flag that disagrees with TF_CONFIG (pscoord --listen, psd
            --coordinator and --task-index, workerd --task-index, Client
            worker=) is refused with one line naming both.
Prints ok/FAIL per check and "tf-config: N passed, N failed".
"""
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import pyenv  # noqa: E402

pyenv.reexec()

import pstest  # noqa: E402

B = pstest.BUILD_ROOT
PSCOORD = os.path.join(B, "coordinator", "pscoord")
PSD = os.path.join(B, "server", "psd")
WORKERD = os.path.join(B, "worker", "workerd")


def env_with(spec, role, index):
    return dict(os.environ, TF_CONFIG=json.dumps(dict(spec, task={"type": role,
                                                                   "index": index})))


def one_line(r, argv, env, words, what):
    p = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=30)
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    r.check(p.returncode == 2 and len(lines) == 1 and all(w in lines[0] for w in words),
            "%s: exit %d, one line naming both (%s)" % (what, p.returncode, " | ".join(lines)))


def main():
    r = pstest.Results("tf-config")
    chief, ps0 = pstest.free_port(), pstest.free_port()
    spec = {"cluster": {"chief": ["127.0.0.1:%d" % chief], "ps": ["127.0.0.1:%d" % ps0],
                        "worker": ["127.0.0.1:%d" % (60000 + i) for i in range(3)]},
            "job_id": "tfjob"}
    tmp = pstest.tmpdir("tfconfig-")
    coord = pstest.Daemon([PSCOORD, "--state-dir", os.path.join(tmp, "coord"),
                           "--log-level", "warn"], env=env_with(spec, "chief", 0))
    r.check(coord.port == chief, "pscoord as TF_CONFIG's chief serves on the chief's port "
            "%d (PORT %s)" % (chief, coord.port))
    psd = pstest.Daemon([PSD, "--data-dir", os.path.join(tmp, "ps0"), "--log-level", "warn"],
                        env=env_with(spec, "ps", 0), timeout=60)
    r.check(psd.port == ps0, "psd as TF_CONFIG's ps[0] serves on its port %d (PORT %s)"
            % (ps0, psd.port))
    workers = [subprocess.Popen([WORKERD, "--steps", "20", "--epochs", "0", "--limit", "2000",
                                 "--json", "--evaluate=false", "--log-level", "warn"],
                                env=env_with(spec, "worker", i), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True) for i in range(2)]
    outs = []
    for i, w in enumerate(workers):
        try:
            out, err = w.communicate(timeout=180)
        except subprocess.TimeoutExpired:
            w.kill()
            out, err = w.communicate()
        js = [json.loads(ln) for ln in out.splitlines() if ln.startswith("{")]
        outs.append(js[-1] if js else {})
        r.check(w.returncode == 0 and js and js[-1].get("task_index") == i and
                js[-1].get("steps") == 20,
                "workerd as TF_CONFIG's worker[%d] finds pscoord and trains 20 steps (%s)"
                % (i, js[-1] if js else err.strip()[-300:]))

    # An evaluator outside the training cluster, as TensorFlow (and TFJob)
    # has it: TF_CONFIG lists no evaluator, neither does pscoord's spec.
    p = subprocess.run([WORKERD, "--eval-count", "1", "--eval-interval", "100ms", "--json",
                        "--log-level", "warn"], env=env_with(spec, "evaluator", 0),
                       capture_output=True, text=True, timeout=120)
    js = [json.loads(ln) for ln in p.stdout.splitlines() if ln.startswith("{")]
    r.check(p.returncode == 0 and js and js[-1].get("role") == "evaluator" and
            js[-1].get("test_accuracy", -1) > 0,
            "workerd as evaluator[0], outside TF_CONFIG's cluster, registers with the chief "
            "and evaluates (%s)" % (js[-1] if js else p.stderr.strip()[-300:]))

    import psclient
    from psclient.task import from_environment
    os.environ["TF_CONFIG"] = env_with(spec, "worker", 2)["TF_CONFIG"]
    try:
        c = psclient.Client(timeout=10)
        cs = c.cluster()
        tasks = {(t.role, t.index) for t in cs.tasks}
        r.check(c.worker == 2 and c.task is not None and c.task.index == 2 and
                c.job_id == "tfjob",
                "Client() takes worker[2] of job tfjob from TF_CONFIG (worker %d, job %s)"
                % (c.worker, c.job_id))
        PS, W, EV = 3, 2, 4  # ps.v1.Role
        r.check({(PS, 0), (W, 0), (W, 1), (W, 2), (EV, 0)} <= tasks and cs.job_id == "tfjob",
                "pscoord lists ps[0], worker[0..2] and evaluator[0] of job tfjob, each "
                "registered from TF_CONFIG alone (%s)" % sorted(tasks))
        c.close()
    except Exception as e:  # noqa: BLE001 - a failed check, named
        r.check(False, "Client() from TF_CONFIG: %s" % e)
    try:
        psclient.Client(worker=0, timeout=5)
        r.check(False, "Client(worker=0) under TF_CONFIG's worker[2] is refused")
    except ValueError as e:
        r.check("worker[2]" in str(e) and "worker=0" in str(e),
                "Client(worker=0) under TF_CONFIG's worker[2]: %s" % e)
    del os.environ["TF_CONFIG"]
    te = from_environment({"RANK": "3", "WORLD_SIZE": "4",
                           "PSCOORD_ADDR": "127.0.0.1:%d" % chief})
    r.check(te is not None and (te.role, te.index, te.num_workers, te.coordinator) ==
            ("worker", 3, 4, "127.0.0.1:%d" % chief),
            "RANK=3 WORLD_SIZE=4 is worker[3] of 4, coordinator $PSCOORD_ADDR (%s)" % (te,))
    for bad, word in (({"RANK": "4", "WORLD_SIZE": "4"}, "RANK=4"),
                      ({"RANK": "x", "WORLD_SIZE": "4"}, "RANK"),
                      ({"TF_CONFIG": "{"}, "TF_CONFIG")):
        try:
            from_environment(bad)
            r.check(False, "%s is refused" % bad)
        except ValueError as e:
            r.check(word in str(e), "%s is refused naming %s: %s" % (bad, word, e))

    other = "127.0.0.1:%d" % pstest.free_port()
    one_line(r, [PSCOORD, "--state-dir", os.path.join(tmp, "c2"), "--listen", other],
             env_with(spec, "chief", 0), ["chief[0]", spec["cluster"]["chief"][0], other],
             "pscoord --listen on another port than TF_CONFIG's chief")
    one_line(r, [PSD, "--data-dir", os.path.join(tmp, "p2"), "--coordinator", other],
             env_with(spec, "ps", 0), [spec["cluster"]["chief"][0], other],
             "psd --coordinator other than TF_CONFIG's chief")
    one_line(r, [PSD, "--data-dir", os.path.join(tmp, "p3"), "--task-index", "1"],
             env_with(spec, "ps", 0), ["ps[0]", "--task-index says 1"],
             "psd --task-index 1 under TF_CONFIG's ps[0]")
    one_line(r, [WORKERD, "--task-index", "0"], env_with(spec, "worker", 1),
             ["worker[1]", "--task-index says 0"], "workerd --task-index 0 under worker[1]")
    one_line(r, [WORKERD, "--coordinator", other], env_with(spec, "worker", 1),
             [spec["cluster"]["chief"][0], other], "workerd --coordinator other than the chief")
    psd.stop()
    coord.stop()
    r.finish()


if __name__ == "__main__":
    main()
