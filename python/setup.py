"""Builds psclient: compiles ../proto/*.proto into one descriptor set
(psclient/_generated/ps.desc) that psclient._proto turns into message
classes at import time. A descriptor set, not protoc's *_pb2.py, because it
loads under any protobuf runtime from 3.20 to today's, whichever protoc made
it (Debian's grpcio-tools 1.14 writes gencode that newer runtimes refuse).

The proto directory is $PSCLIENT_PROTO_DIR, else ../proto beside this file.
The compiler is grpc_tools.protoc when importable, else `protoc` on PATH.
The version is the project's: meson.build's project(version:) in the
proto directory's parent (an sdist keeps it in PKG-INFO); build_py writes
it into the package as well (psclient.__version__). Nothing generated is
committed.
"""
import os
import re
import shutil
import subprocess
import sys

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
PROTOS = ("ps.proto", "health.proto")


def proto_dir():
    d = os.environ.get("PSCLIENT_PROTO_DIR") or os.path.join(HERE, "..", "proto")
    if not os.path.isfile(os.path.join(d, "ps.proto")):
        sys.exit("psclient: no ps.proto in %s (set PSCLIENT_PROTO_DIR to the "
                 "repository's proto/ directory)" % os.path.abspath(d))
    return os.path.abspath(d)


def compile_descriptors(out_dir):
    """Writes out_dir/ps.desc: a FileDescriptorSet of PROTOS."""
    src = proto_dir()
    os.makedirs(out_dir, exist_ok=True)
    out = os.path.join(out_dir, "ps.desc")
    args = ["-I" + src, "--descriptor_set_out=" + out, "--include_imports"] + \
        [os.path.join(src, p) for p in PROTOS]
    try:
        from grpc_tools import protoc
    except ImportError:
        protoc = None
    if protoc is not None:
        rc = protoc.main(["protoc"] + args)
    elif shutil.which("protoc"):
        rc = subprocess.call(["protoc"] + args)
    else:
        sys.exit("psclient: neither grpcio-tools (python3-grpc-tools) nor protoc "
                 "is installed; one is needed to compile proto/ at build time")
    if rc != 0:
        sys.exit("psclient: protoc failed on %s (exit %d)" % (src, rc))


def project_version():
    """meson.build's project version, or an sdist's PKG-INFO's."""
    meson = os.path.join(proto_dir(), "..", "meson.build")
    if os.path.isfile(meson):
        with open(meson, encoding="utf-8") as f:
            m = re.search(r"project\([^)]*?version:\s*'([^']+)'", f.read(), re.S)
        if m is None:
            sys.exit("psclient: no version: '...' in %s's project()" % os.path.abspath(meson))
        return m.group(1)
    info = os.path.join(HERE, "PKG-INFO")
    if os.path.isfile(info):
        with open(info, encoding="utf-8") as f:
            m = re.search(r"^Version: (\S+)", f.read(), re.M)
        if m:
            return m.group(1)
    sys.exit("psclient: neither %s nor PKG-INFO gives the version" % os.path.abspath(meson))


class BuildWithProto(build_py):
    """build_py that first compiles the descriptor set into the package."""

    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            target = os.path.join(HERE, "psclient", "_generated")
        else:
            target = os.path.join(self.build_lib, "psclient", "_generated")
        compile_descriptors(target)
        with open(os.path.join(target, "VERSION"), "w", encoding="utf-8") as f:
            f.write(project_version() + "\n")


setup(version=project_version(), cmdclass={"build_py": BuildWithProto})
