"""Tensors in pieces (common/psclient.c, ps_client_set_pieces), against a
real psd on 127.0.0.1, write-behind and --durable:

- a push-and-pull of a 300007-element variable cut in pieces (16 KiB asked,
  4839 elements given: at most 64 pieces a call), 4 calls sending at once,
  with a short last piece, gives bit for bit the values and versions of the same
  pushes sent whole: float32 with Adam (whose step count follows the
  version), and bfloat16 with error feedback, where the sum of the
  gradients less the change applied stays within bf16's rounding;
- a pull in pieces equals a whole one;
- SYNC with two workers, one pushing in pieces: the step applies once,
  with the same bits as two whole pushes;
- a gradient or a pull of the wrong size, and an unknown variable, are
  refused naming the variable, and change nothing; a bfloat16 push in pieces
  (rounded ahead on the client's thread) to an unknown variable likewise, and
  the client's next one is applied once;
- bfloat16 pushes with error feedback that fail part-way (in pieces beside
  an unknown variable, with pieces never sent; a piece refused for a NaN;
  whole, refused after psd applied the first gradient, beside an unknown
  variable, for a NaN): on a grid where the arithmetic is exact, psd's
  change plus the client's residual equals the sum of the gradients bit
  for bit, and the next push sends what the failed one owed.

The checks are the pieces helper's (tests/integration/pieces.c)."""
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "interop"))
import pstest  # noqa: E402


def main():
    r = pstest.Results("pieces")
    helper = os.path.join(pstest.BUILD_ROOT, "tests", "integration", "pieces")
    for _, mode, data_dir, args in pstest.durability_modes():
        psd = pstest.start_psd(data_dir, *args)
        try:
            p = subprocess.run([helper, psd.address], capture_output=True, text=True,
                               timeout=180)
        finally:
            psd.stop()
        for line in p.stdout.splitlines():
            if line.startswith(("ok", "FAIL")):
                r.check(line.startswith("ok"), "%s: %s" % (mode, line[5:]))
            else:
                print(line)
        r.check(p.returncode in (0, 1),
                "%s: the helper ran (exit %d%s)" % (mode, p.returncode,
                                                    ": " + p.stderr.strip()
                                                    if p.stderr.strip() else ""))
    r.finish()


if __name__ == "__main__":
    main()
