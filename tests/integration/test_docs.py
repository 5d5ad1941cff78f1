"""The documentation checked against the tree and the binaries: README.md
and doc/*.md.

- every relative link resolves to a file of the repository (never outside
  it), and an anchor (#x) to a heading of its target, by GitHub's slug rule;
- no line is longer than 100 characters;
- doc/ states what is, not how it came to be: no issue numbers ("issue 12",
  "#12") and no session history;
- every long flag that `psd --help`, `pscoord --help` and `workerd --help`
  print appears in doc/operating.md, and every flag and command of `psctl
  --help` (and of each `psctl COMMAND --help`) in doc/psctl.md; a missing
  one is named with the doc it is missing from;
- the README shows the two commands, `make demo` and `make test`, on its
  first screen, and stays a landing page (at most 250 lines).

Run with the binaries in PS_BUILD_ROOT (meson's test environment)."""
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "interop"))
import pstest  # noqa: E402

ROOT = os.path.realpath(pstest.SOURCE_ROOT)
MAX_LINE = 100
README_MAX_LINES = 250
FIRST_SCREEN = 50

BINARIES = {"psd": ("server", "psd"), "pscoord": ("coordinator", "pscoord"),
            "workerd": ("worker", "workerd"), "psctl": ("tools", "psctl")}

# History has no place in doc/: issue numbers and the sessions work was
# done in. A reference to another project's tracker (grpc/grpc#20418) names
# upstream's bug and stays.
HISTORY = [
    (re.compile(r"\bissues?\s+#?\d+", re.I), "an issue number"),
    (re.compile(r"(?<![\w/])#\d+\b"), "an issue number (#N)"),
    (re.compile(r"\bsessions?\s+\d+", re.I), "a session number"),
    (re.compile(r"\b(this|earlier|previous|last|later|other|that)\s+sessions?\b", re.I),
     "session history"),
    (re.compile(r"\bused to\b", re.I), "history (\"used to\")"),
]


def docs():
    out = [os.path.join(ROOT, "README.md")]
    d = os.path.join(ROOT, "doc")
    if os.path.isdir(d):
        out += sorted(os.path.join(d, f) for f in os.listdir(d) if f.endswith(".md"))
    return out


def rel(path):
    return os.path.relpath(path, ROOT)


def prose_lines(text):
    """(line number, line) of the lines outside fenced code blocks."""
    fence = None
    for n, line in enumerate(text.splitlines(), 1):
        m = re.match(r"^\s*(```|~~~)", line)
        if m:
            if fence is None:
                fence = m.group(1)
            elif m.group(1) == fence:
                fence = None
            continue
        if fence is None:
            yield n, line


def slug(heading):
    """GitHub's anchor for a heading: inline markup dropped, lower case,
    everything but letters, digits, spaces, '-' and '_' removed, spaces to
    '-'."""
    h = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    h = h.replace("`", "").strip().lower()
    h = "".join(c for c in h if c.isalnum() or c in " -_")
    return h.replace(" ", "-")


def anchors(path):
    seen, out = {}, set()
    with open(path, encoding="utf-8") as f:
        text = f.read()
    for _, line in prose_lines(text):
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        s = slug(m.group(1))
        n = seen.get(s, 0)
        seen[s] = n + 1
        out.add(s if n == 0 else "%s-%d" % (s, n))
    return out


LINK = re.compile(r"\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")


def links(text):
    """(line number, target) of every inline link outside code."""
    for n, line in prose_lines(text):
        line = re.sub(r"`[^`]*`", "", line)
        for m in LINK.finditer(line):
            yield n, m.group(1)


def check_links(r, path, text):
    bad = []
    count = 0
    for n, target in links(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):
            continue  # http:, https:, mailto: are not the tree's
        count += 1
        where = "%s:%d: %s" % (rel(path), n, target)
        file_part, _, anchor = target.partition("#")
        dest = path if not file_part else os.path.realpath(
            os.path.join(os.path.dirname(path), file_part))
        if dest != ROOT and not dest.startswith(ROOT + os.sep):
            bad.append("%s points outside the repository" % where)
            continue
        if not os.path.exists(dest):
            bad.append("%s: no such file" % where)
            continue
        if anchor:
            if not dest.endswith(".md") or os.path.isdir(dest):
                bad.append("%s: an anchor into a file that is not markdown" % where)
            elif anchor not in anchors(dest):
                bad.append("%s: %s has no heading #%s" % (where, rel(dest), anchor))
    for b in bad:
        print("  " + b)
    r.check(not bad, "%s: its %d relative links resolve%s"
            % (rel(path), count, "" if not bad else " (%d do not)" % len(bad)))


def check_widths(r, path, text):
    long_lines = [(n, len(line)) for n, line in enumerate(text.splitlines(), 1)
                  if len(line) > MAX_LINE]
    for n, width in long_lines:
        print("  %s:%d: %d characters" % (rel(path), n, width))
    r.check(not long_lines, "%s: no line over %d characters%s"
            % (rel(path), MAX_LINE, "" if not long_lines else " (%d are)" % len(long_lines)))


def check_history(r, path, text):
    found = []
    for n, line in enumerate(text.splitlines(), 1):
        for pat, what in HISTORY:
            m = pat.search(line)
            if m:
                found.append("%s:%d: %s: %r" % (rel(path), n, what, m.group(0)))
    for f in found:
        print("  " + f)
    r.check(not found, "%s: no issue numbers or session history" % rel(path))


def help_text(binary, *args):
    exe = os.path.join(pstest.BUILD_ROOT, *BINARIES[binary])
    p = subprocess.run([exe] + list(args) + ["--help"], capture_output=True, text=True,
                       timeout=30, stdin=subprocess.DEVNULL)
    return p.stdout + p.stderr


def help_flags(text):
    """The long flags of the option lines of a --help text; --[no-]x is
    --x."""
    flags = []
    for line in text.splitlines():
        m = re.match(r"^\s+(?:-[A-Za-z], )?--(\[no-\])?([a-z][a-z0-9-]*)", line)
        if m:
            flags.append("--" + m.group(2))
    return flags


def help_commands(text):
    """psctl's commands: the words of each line under 'Commands:' before its
    arguments (upper-case or bracketed words) and its help."""
    cmds, inside = [], False
    for line in text.splitlines():
        if line.startswith("Commands:"):
            inside = True
            continue
        if inside:
            if not line.startswith("  "):
                if line.strip():
                    inside = False
                continue
            words = []
            for w in re.split(r"\s+", line.strip().split("  ")[0]):
                if not re.match(r"^[a-z][a-z0-9-]*$", w):
                    break
                words.append(w)
            if words:
                cmds.append(" ".join(words))
    return cmds


def mentions_flag(doc, flag):
    return re.search(re.escape(flag) + r"(?![a-z0-9-])", doc) is not None


def check_flags(r, binary, flags, doc_path, doc):
    missing = sorted({f for f in flags if not mentions_flag(doc, f)})
    for f in missing:
        print("  %s: %s %s is missing from %s" % (binary, binary, f, rel(doc_path)))
    r.check(flags and not missing, "%s: each of its %d --help flags is in %s%s"
            % (binary, len(set(flags)), rel(doc_path),
               "" if not missing else " (missing: %s)" % " ".join(missing)))


def main():
    r = pstest.Results("docs")
    paths = docs()
    r.check(len(paths) > 1, "doc/ holds the documents (%d found)" % (len(paths) - 1))
    texts = {}
    for p in paths:
        with open(p, encoding="utf-8") as f:
            texts[p] = f.read()
    for p in paths:
        check_links(r, p, texts[p])
        check_widths(r, p, texts[p])
        if os.path.dirname(p) != ROOT:
            check_history(r, p, texts[p])

    readme = texts[os.path.join(ROOT, "README.md")]
    lines = readme.splitlines()
    r.check(len(lines) <= README_MAX_LINES, "README.md is a landing page: %d lines (at most %d)"
            % (len(lines), README_MAX_LINES))
    first = "\n".join(lines[:FIRST_SCREEN])
    for cmd in ("make demo", "make test"):
        r.check(re.search(r"^" + cmd + r"\b", first, re.M) is not None,
                "README.md shows `%s` on its first screen (%d lines)" % (cmd, FIRST_SCREEN))
    r.check("doc/" in first, "README.md links to doc/ on its first screen")

    operating = os.path.join(ROOT, "doc", "operating.md")
    psctl_doc = os.path.join(ROOT, "doc", "psctl.md")
    op_text = texts.get(operating, "")
    psctl_text = texts.get(psctl_doc, "")
    r.check(op_text != "", "doc/operating.md exists")
    r.check(psctl_text != "", "doc/psctl.md exists")
    for binary in ("psd", "pscoord", "workerd"):
        check_flags(r, binary, help_flags(help_text(binary)), operating, op_text)

    top = help_text("psctl")
    cmds = help_commands(top)
    flags = help_flags(top)
    for cmd in cmds:
        flags += help_flags(help_text("psctl", *cmd.split()))
    missing = [c for c in cmds if not re.search(r"`(psctl )?" + re.escape(c) + r"\b",
                                                psctl_text)]
    for c in missing:
        print("  psctl: the command '%s' is missing from doc/psctl.md" % c)
    r.check(len(cmds) >= 10 and not missing, "psctl: each of its %d commands is in doc/psctl.md%s"
            % (len(cmds), "" if not missing else " (missing: %s)" % ", ".join(missing)))
    check_flags(r, "psctl", flags, psctl_doc, psctl_text)
    r.finish()


if __name__ == "__main__":
    main()
