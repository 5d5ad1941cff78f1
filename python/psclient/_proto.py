"""The wire contract (proto/ps.proto, proto/health.proto) as Python classes.

setup.py compiles the .proto files into a descriptor set at build time
(``_generated/ps.desc``); this module loads it into a private descriptor pool
and makes the message classes, which works under any protobuf runtime from
3.20 on. ``pb`` holds every message class and top-level enum value by its
proto name (``pb.PushRequest``, ``pb.DTYPE_FLOAT32``), ``health`` the same
for grpc.health.v1.

Threads and lifetime: built once at import; the classes are immutable.
"""
from __future__ import annotations

import os
import types
from typing import Any, Dict

from google.protobuf import descriptor_pb2, descriptor_pool

_DESC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_generated", "ps.desc")


def _message_classes(fds: Any, pool: Any) -> Dict[str, Any]:
    """Message classes by full name, with whichever API this runtime has."""
    try:  # protobuf >= 4.22 (and 3.x's later releases)
        from google.protobuf.message_factory import GetMessageClass
    except ImportError:
        GetMessageClass = None
    out: Dict[str, Any] = {}
    for f in fds.file:
        fd = pool.FindFileByName(f.name)
        for name, md in fd.message_types_by_name.items():
            full = md.full_name
            if GetMessageClass is not None:
                out[full] = GetMessageClass(md)
            else:
                from google.protobuf import message_factory
                out[full] = message_factory.MessageFactory(pool).GetPrototype(md)
    return out


def _load() -> tuple:
    if not os.path.exists(_DESC):
        raise ImportError(
            "psclient: %s is missing: the package was not built (install it with "
            "pip from the repository's python/ directory, which compiles proto/)" % _DESC)
    with open(_DESC, "rb") as f:
        fds = descriptor_pb2.FileDescriptorSet.FromString(f.read())
    pool = descriptor_pool.DescriptorPool()
    for fp in fds.file:
        pool.Add(fp)
    classes = _message_classes(fds, pool)
    spaces = {"ps.v1": types.SimpleNamespace(), "grpc.health.v1": types.SimpleNamespace()}
    for full, cls in classes.items():
        pkg, _, name = full.rpartition(".")
        setattr(spaces[pkg], name, cls)
    for fp in fds.file:
        ns = spaces[fp.package]
        for e in fp.enum_type:
            for v in e.value:
                setattr(ns, v.name, v.number)
    return spaces["ps.v1"], spaces["grpc.health.v1"]


pb, health = _load()
