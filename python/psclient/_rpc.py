"""Channels and calls: TLS and token options, unary calls with deadlines and
retry of UNAVAILABLE with exponential backoff and jitter, as the C client
(common/rpc_client.c) does, and errors that carry the gRPC status.

Threads and lifetime: a Connection is safe to share between threads (grpc
channels are); close() ends it.
"""
from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import Any, Callable, List, Optional, Sequence, Tuple

import grpc
import logging

log = logging.getLogger("psclient")

# gRPC's 4 MiB receive default is far below a layer's tensor; psd's own
# ceiling (--max-message) is what limits.
_MAX_MESSAGE = (1 << 31) - 1


class PsError(Exception):
    """A call that failed: the gRPC status code, psd's (or pscoord's)
    message, the server's address and the method.

    ``str(e)`` reads "psd at 127.0.0.1:7070: Push: INVALID_ARGUMENT:
    variable 'w1': gradient has 10 elements, variable has 12".
    """

    def __init__(self, code: grpc.StatusCode, details: str, address: str = "",
                 method: str = "", attempts: int = 1) -> None:
        self.code = code
        self.details = details
        self.address = address
        self.method = method
        self.attempts = attempts
        where = "%s: " % address if address else ""
        what = "%s: " % method if method else ""
        super().__init__("%s%s%s: %s" % (where, what, code.name, details))


@dataclass(frozen=True)
class TLS:
    """Transport security from PEM files: the CA that signed the server's
    certificate (None: the system's roots), and this client's certificate
    and key for mutual TLS (both or neither). server_name overrides the
    name checked in the server's certificate (e.g. "localhost" when the
    address is 127.0.0.1)."""
    ca_file: Optional[str] = None
    cert_file: Optional[str] = None
    key_file: Optional[str] = None
    server_name: Optional[str] = None

    def credentials(self) -> grpc.ChannelCredentials:
        """grpc.ssl_channel_credentials from the files (read now)."""
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("TLS: give both cert_file and key_file, or neither")

        def read(path: Optional[str]) -> Optional[bytes]:
            if path is None:
                return None
            with open(path, "rb") as f:
                return f.read()
        return grpc.ssl_channel_credentials(root_certificates=read(self.ca_file),
                                            private_key=read(self.key_file),
                                            certificate_chain=read(self.cert_file))


@dataclass(frozen=True)
class Retry:
    """How calls are retried: UNAVAILABLE (a psd restarting, not yet
    listening, or draining) is retried with exponential backoff from
    `initial` to `maximum` seconds, each delay drawn in [0.5, 1.5) x the
    step, until `budget` seconds have passed since the first attempt (0:
    no retry). Other codes are not retried."""
    initial: float = 0.1
    maximum: float = 2.0
    budget: float = 60.0


_ROLES = ("reader", "worker", "operator")


def read_token(path: str) -> str:
    """The bearer token a client sends, from a file, as the daemons read
    theirs (common/auth.h, ps_auth_read_token): the first line that is not
    blank or a comment (from a '#' that starts a word), either the token
    alone or "ROLE TOKEN" as tools/pscerts.sh and `psctl token` write it.
    Tokens are read from files, never given on a command line. Raises
    ValueError naming the file and line (OSError when it cannot be read)."""
    with open(path, "r", encoding="utf-8", errors="replace") as f:
        lines = f.read().splitlines()
    for n, line in enumerate(lines, 1):
        words = []
        for w in line.split():
            if w.startswith("#"):
                break
            words.append(w)
        if not words:
            continue
        if len(words) > 2 or (len(words) == 2 and words[0] not in _ROLES):
            raise ValueError("token file %s:%d: expected 'TOKEN' or 'ROLE TOKEN' (ROLE "
                             "reader, worker or operator)" % (path, n))
        tok = words[-1]
        if tok.startswith("sha256:"):
            raise ValueError("token file %s:%d: a token's hash, not the token itself "
                             "(a server's --tokens file?)" % (path, n))
        if not 16 <= len(tok) <= 512 or not all(33 <= ord(c) <= 126 for c in tok):
            raise ValueError("token file %s:%d: the token must be 16 to 512 printable "
                             "ASCII characters" % (path, n))
        return tok
    raise ValueError("token file %s: holds no token" % path)


class Connection:
    """One channel to one server (psd or pscoord) and its call options."""

    def __init__(self, address: str, *, tls: Optional[TLS] = None,
                 token: Optional[str] = None, retry: Retry = Retry(),
                 timeout: float = 30.0, options: Sequence[Tuple[str, Any]] = ()) -> None:
        self.address = address
        self.retry = retry
        self.timeout = timeout
        self.metadata: List[Tuple[str, str]] = []
        if token is not None:
            self.metadata.append(("authorization", "Bearer " + token))
        opts: List[Tuple[str, Any]] = [
            ("grpc.max_receive_message_length", _MAX_MESSAGE),
            ("grpc.max_send_message_length", _MAX_MESSAGE),
            # Reconnect within a second of a restarted psd listening again,
            # not after gRPC's default two-minute backoff.
            ("grpc.max_reconnect_backoff_ms", 1000),
            ("grpc.initial_reconnect_backoff_ms", 100),
            ("grpc.min_reconnect_backoff_ms", 100),
            # A failed connection makes the channel resolve the name again,
            # which gRPC's resolver allows only 30 s after the last time by
            # default: a psd back within a second was reached after 5-10 s.
            ("grpc.dns_min_time_between_resolutions_ms", 200),
            # We retry ourselves, within the budget.
            ("grpc.enable_retries", 0),
        ] + list(options)
        if tls is not None and not address.startswith("unix"):  # a socket is plaintext
            if tls.server_name:
                opts.append(("grpc.ssl_target_name_override", tls.server_name))
            self.channel = grpc.secure_channel(address, tls.credentials(), options=opts)
        else:
            self.channel = grpc.insecure_channel(address, options=opts)
        self._methods: dict = {}

    def method(self, service: str, name: str, req_cls: Any, resp_cls: Any) -> Callable:
        key = (service, name)
        m = self._methods.get(key)
        if m is None:
            m = self.channel.unary_unary(
                "/%s/%s" % (service, name),
                request_serializer=req_cls.SerializeToString,
                response_deserializer=resp_cls.FromString)
            self._methods[key] = m
        return m

    def call(self, service: str, name: str, request: Any, resp_cls: Any,
             timeout: Optional[float] = None, retry: bool = True,
             token: Optional[str] = None) -> Any:
        """Calls service/name with request; retries UNAVAILABLE within the
        budget (unless retry is False). token: sent instead of the
        connection's (an operator's for one call). Raises PsError."""
        m = self.method(service, name, type(request), resp_cls)
        md = self.metadata if token is None else [("authorization", "Bearer " + token)]
        t = self.timeout if timeout is None else timeout
        start = time.monotonic()
        step = self.retry.initial
        attempt = 0
        while True:
            attempt += 1
            try:
                return m(request, timeout=t, metadata=md or None)
            except grpc.RpcError as e:
                code = e.code()
                details = e.details() or ""
                if code != grpc.StatusCode.UNAVAILABLE or not retry:
                    raise PsError(code, details, self.address, name, attempt) from None
                delay = step * (0.5 + random.random())
                if time.monotonic() + delay - start >= self.retry.budget:
                    raise PsError(code, "%s (gave up after %d attempts in %.1f s)"
                                  % (details, attempt, time.monotonic() - start),
                                  self.address, name, attempt) from None
                log.debug("%s %s: UNAVAILABLE (%s); retry %d in %.2f s", self.address,
                          name, details, attempt, delay)
                time.sleep(delay)
                step = min(step * 2, self.retry.maximum)

    def close(self) -> None:
        self.channel.close()
