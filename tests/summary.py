"""Summarizes a meson test log: each Check suite's own summary line, then
'<label>: N passed, N failed'. With --total, sums the closing lines read on
stdin into one 'total: N passed, N failed, N skipped' line.

meson writes one JSON object per test to meson-logs/testlog*.json.
"""
import json
import re
import sys


def summarize(path, label):
    passed = failed = skipped = 0
    with open(path) as f:
        for line in f:
            t = json.loads(line)
            result = t.get("result", "")
            out = t.get("stdout") or ""
            for m in re.finditer(r"^\d+%: Checks: \d+, Failures: \d+, Errors: \d+.*$",
                                 out, re.M):
                print("  %-22s %s" % (t["name"], m.group(0)))
            for m in re.finditer(r"^[\w-]+: \d+ passed, \d+ failed.*$", out, re.M):
                print("  %-22s %s" % (t["name"], m.group(0)))
            if result in ("OK", "EXPECTEDFAIL"):
                passed += 1
            elif result == "SKIP":
                skipped += 1
            else:
                failed += 1
                print("  %-22s %s" % (t["name"], result))
    print("%s: %d passed, %d failed, %d skipped" % (label, passed, failed, skipped))
    return failed


def total():
    p = f = s = 0
    for line in sys.stdin:
        sys.stdout.write(line)
        m = re.match(r"^[^:]+: (\d+) passed, (\d+) failed, (\d+) skipped$", line)
        if m:
            p += int(m.group(1))
            f += int(m.group(2))
            s += int(m.group(3))
    print("total: %d passed, %d failed, %d skipped" % (p, f, s))
    return 1 if f else 0


if __name__ == "__main__":
    if sys.argv[1] == "--total":
        sys.exit(total())
    sys.exit(1 if summarize(sys.argv[1], sys.argv[2]) else 0)
