"""deploy/Dockerfile's Debian packages against meson's dependencies, so
that the two lists cannot drift (no Docker engine needed).

Build stage: each dependency meson.build requires (dependency(),
find_library(), find_program(), outside the tests and benchmarks) is
traced to the Debian package that owns its file on this machine (its .pc
file through pkg-config, a library through the compiler's search path, a
program through PATH, each read with `dpkg -S`); the stage must install
exactly those packages plus the build tools themselves.

Runtime stage: each library the installed programs link against (their
NEEDED entries, resolved by ldconfig) is traced the same way; the stage
must install exactly those plus its stated extras, leaving out only what
every Debian image has (Essential packages and the C library). A library
that no Debian package owns (CUDA's, from /usr/local/cuda) is left out of
the image, which builds with -Dcuda=disabled.
"""
import os
import re
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "interop"))
import pstest  # noqa: E402

DOCKERFILE = os.path.join(pstest.SOURCE_ROOT, "deploy", "Dockerfile")
# Build tools: what runs meson rather than what meson finds.
BUILD_TOOLS = {"meson", "ninja-build", "pkg-config", "gcc", "g++"}
# Runtime packages no program links against, each with its user.
RUNTIME_EXTRAS = {"openssl": "pscerts makes keys and certificates with it",
                  "dataset-fashion-mnist": "the data workerd trains on"}
# In every Debian image: the C library and GCC's runtime (dependencies of
# Essential packages), besides the Essential packages themselves.
BASE = {"libc6", "libgcc-s1"}
# Dependencies with no package of their own (the compiler's threads).
NO_PACKAGE = {"threads"}
# The programs the image installs, in the build tree.
PROGRAMS = [("server", "psd"), ("coordinator", "pscoord"), ("worker", "workerd"),
            ("tools", "psctl")]
# Trees whose dependencies the image's build (-Dtests=disabled) skips.
SKIP_DIRS = {"tests", "bench", "build", ".git"}


def calls(text, fn):
    """(first string argument, whole argument text) of each fn(...) call,
    parentheses balanced."""
    out = []
    for m in re.finditer(r"\b%s\(" % re.escape(fn), text):
        depth, i = 1, m.end()
        while depth and i < len(text):
            depth += {"(": 1, ")": -1}.get(text[i], 0)
            i += 1
        args = text[m.end():i - 1]
        first = re.match(r"\s*'([^']*)'", args)
        out.append((first.group(1) if first else None, args))
    return out


def meson_files():
    for root, dirs, files in os.walk(pstest.SOURCE_ROOT):
        rel = os.path.relpath(root, pstest.SOURCE_ROOT)
        dirs[:] = [d for d in dirs if not (rel == "." and (d in SKIP_DIRS or
                                                          d.startswith("build")))]
        if "meson.build" in files:
            yield os.path.join(root, "meson.build")


def required(args):
    """False for an optional dependency; a feature option counts as
    wanted (the image builds with BLAS), tests as not."""
    m = re.search(r"required\s*:\s*([^,\n]+)", args)
    if not m:
        return True
    v = m.group(1).strip()
    return v != "false" and not any("'%s'" % o in v for o in ("tests", "fuzz", "cuda"))


def owner(path):
    """The Debian package that owns path (after symlinks), or None."""
    path = os.path.normpath(path)
    tries = [path, os.path.realpath(path)]
    if path.startswith("/usr/"):  # merged /usr: dpkg may know /bin/sed
        tries += [path[4:]]
    for p in tries:
        r = subprocess.run(["dpkg", "-S", p], capture_output=True, text=True)
        if r.returncode == 0:
            return r.stdout.split(":")[0].strip()
    return None


def build_needs():
    """{package: [meson dependencies it provides]} and the dependencies
    that no package could be found for."""
    needs, unknown = {}, []
    cc = os.environ.get("CC", "cc")
    for path in meson_files():
        text = open(path).read()
        found = []
        for name, args in calls(text, "dependency"):
            if name and name not in NO_PACKAGE and required(args):
                p = subprocess.run(["pkg-config", "--path", name], capture_output=True,
                                   text=True).stdout.strip()
                found.append((name, p))
        for name, args in calls(text, "find_library"):
            if name and required(args):
                p = subprocess.run([cc, "-print-file-name=lib%s.so" % name],
                                   capture_output=True, text=True).stdout.strip()
                found.append((name, p if os.path.isabs(p) else ""))
        for name, args in calls(text, "find_program"):
            if name and required(args) and "@" not in name:
                found.append((name, shutil.which(name) or ""))
        for name, p in found:
            pkg = owner(p) if p else None
            if pkg:
                needs.setdefault(pkg, []).append(name)
            else:
                unknown.append("%s (%s)" % (name, os.path.relpath(path, pstest.SOURCE_ROOT)))
    return needs, unknown


def runtime_needs():
    """{package: [sonames]} of the installed programs' NEEDED entries."""
    ldconfig = subprocess.run(["/sbin/ldconfig", "-p"], capture_output=True,
                              text=True).stdout
    where = {}
    for line in ldconfig.splitlines():
        m = re.match(r"\s*(\S+) \(libc6,x86-64[^)]*\) => (\S+)", line)
        if m:
            where.setdefault(m.group(1), m.group(2))
    needs, unknown, outside = {}, [], set()
    for parts in PROGRAMS:
        exe = os.path.join(pstest.BUILD_ROOT, *parts)
        dyn = subprocess.run(["readelf", "-d", exe], capture_output=True, text=True).stdout
        for so in re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", dyn):
            pkg = owner(where[so]) if so in where else None
            if pkg:
                needs.setdefault(pkg, []).append(so)
            elif so in where:
                outside.add(so)
            else:
                unknown.append("%s (%s)" % (so, parts[1]))
    return needs, unknown, outside


def in_base(pkg):
    return pkg in BASE or subprocess.run(
        ["dpkg-query", "-W", "-f", "${Essential}", pkg],
        capture_output=True, text=True).stdout.strip() == "yes"


def stages():
    """{stage name or index: set of packages its apt-get install names}."""
    text = open(DOCKERFILE).read().replace("\\\n", " ")
    out, name, n = {}, None, -1
    for line in text.splitlines():
        line = line.strip()
        if line.upper().startswith("FROM "):
            n += 1
            m = re.search(r"\sAS\s+(\S+)", line, re.I)
            name = m.group(1) if m else "final"
            out[name] = set()
        elif line.upper().startswith("RUN ") and name is not None:
            for m in re.finditer(r"apt-get install((?:\s+[-a-z0-9.+]+)+)", line):
                out[name] |= {w for w in m.group(1).split() if not w.startswith("-")}
    return out


def main():
    r = pstest.Results("image-packages")
    st = stages()
    r.check("build" in st and "final" in st,
            "the Dockerfile has a build stage and a final stage (%s)" % sorted(st))
    needs, unknown = build_needs()
    r.check(not unknown, "every meson dependency has a Debian package here %s"
            % (unknown or ""))
    want = set(needs) | BUILD_TOOLS
    have = st.get("build", set())
    missing = sorted("%s (for %s)" % (p, ", ".join(needs[p])) for p in set(needs) - have
                     if not in_base(p))
    r.check(not missing, "the build stage installs each meson dependency's package %s"
            % (missing or sorted(needs)))
    extra = sorted(have - want)
    r.check(not extra, "the build stage installs nothing meson does not need %s"
            % (extra or ""))
    missing_tools = sorted(BUILD_TOOLS - have)
    r.check(not missing_tools, "the build stage installs the build tools %s"
            % (missing_tools or sorted(BUILD_TOOLS)))

    rneeds, runknown, outside = runtime_needs()
    r.check(not runknown, "every library the programs link against is found here %s"
            % (runknown or ""))
    if outside:
        print("note: not from Debian, left out of the image (-Dcuda=disabled): %s"
              % ", ".join(sorted(outside)))
    have = st.get("final", set())
    missing = sorted("%s (for %s)" % (p, ", ".join(sorted(set(rneeds[p]))))
                     for p in set(rneeds) - have if not in_base(p))
    r.check(not missing, "the runtime stage installs the package of each linked "
            "library %s" % (missing or sorted(rneeds)))
    extra = sorted(have - set(rneeds) - set(RUNTIME_EXTRAS))
    r.check(not extra, "the runtime stage installs nothing else but %s %s"
            % (sorted(RUNTIME_EXTRAS), extra or ""))
    r.finish()


if __name__ == "__main__":
    main()
