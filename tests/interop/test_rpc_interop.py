"""The plumbing seen from outside C: Debian's python3-grpcio, with stubs
generated from proto/ at test time, against rpc_test_server on 127.0.0.1:0.
"""
import os
import sys
import time

import grpc

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pstest  # noqa: E402


def main():
    _, _, health_pb2, health_pb2_grpc = pstest.generate_stubs()
    server = os.path.join(pstest.BUILD_ROOT, "tests", "rpc_test_server")
    d = pstest.Daemon([server])
    r = pstest.Results("rpc-interop")
    ch = pstest.channel(d.address)
    grpc.channel_ready_future(ch).result(timeout=10)

    health = health_pb2_grpc.HealthStub(ch)
    resp = health.Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
    r.check(resp.status == health_pb2.HealthCheckResponse.SERVING,
            "health check of the server is SERVING")
    resp = health.Check(health_pb2.HealthCheckRequest(service="ps.test.Test"),
                        timeout=5)
    r.check(resp.status == health_pb2.HealthCheckResponse.SERVING,
            "health check of ps.test.Test is SERVING")
    try:
        health.Check(health_pb2.HealthCheckRequest(service="no.Such"), timeout=5)
        r.check(False, "unknown service is NOT_FOUND")
    except grpc.RpcError as e:
        r.check(e.code() == grpc.StatusCode.NOT_FOUND and "no.Such" in e.details(),
                "unknown service is NOT_FOUND naming it (%s)" % e.details())

    watch = health.Watch(health_pb2.HealthCheckRequest(service=""), timeout=5)
    first = next(watch)
    r.check(first.status == health_pb2.HealthCheckResponse.SERVING,
            "health Watch streams SERVING first")
    watch.cancel()

    ident = lambda b: b  # noqa: E731  raw bytes in and out
    unknown = ch.unary_unary("/ps.v1.ParameterServer/NoSuchMethod",
                             request_serializer=ident,
                             response_deserializer=ident)
    try:
        unknown(b"", timeout=5)
        r.check(False, "unknown method is UNIMPLEMENTED")
    except grpc.RpcError as e:
        r.check(e.code() == grpc.StatusCode.UNIMPLEMENTED
                and "NoSuchMethod" in e.details(),
                "unknown method is UNIMPLEMENTED naming it (%s)" % e.details())

    sleep = ch.unary_unary("/ps.test.Test/Sleep", request_serializer=ident,
                           response_deserializer=ident)
    try:
        sleep(b"5000", timeout=0.3)
        r.check(False, "expired deadline is DEADLINE_EXCEEDED")
    except grpc.RpcError as e:
        r.check(e.code() == grpc.StatusCode.DEADLINE_EXCEEDED,
                "expired deadline is DEADLINE_EXCEEDED")
    r.check(sleep(b"10", timeout=5) == b"slept",
            "a call answered within its deadline succeeds")

    echo = ch.unary_unary("/ps.test.Test/Echo", request_serializer=ident,
                          response_deserializer=ident)
    big = os.urandom(8 << 20)
    r.check(echo(big, timeout=30) == big, "an 8 MiB message goes both ways")

    count = ch.unary_stream("/ps.test.Test/Count", request_serializer=ident,
                            response_deserializer=ident)
    got = [m for m in count(b"50", timeout=10)]
    r.check(got == [str(i).encode() for i in range(50)],
            "a server stream delivers 50 messages in order")

    # SIGTERM with a call in flight and a second client connected and idle:
    # the call is answered (the drain; the server closes the connections
    # left once no call is in flight, and must not count this one out), and
    # the stop ends with it.
    idle = pstest.channel(d.address)
    grpc.channel_ready_future(idle).result(timeout=10)
    fut = sleep.future(b"800", timeout=10)
    time.sleep(0.2)
    t0 = time.monotonic()
    rc = d.stop()
    took = time.monotonic() - t0
    try:
        answer = fut.result(timeout=10)
    except grpc.RpcError as e:
        answer = "%s: %s" % (e.code(), e.details())
    r.check(answer == b"slept", "a call in flight at SIGTERM is answered (%r)" % answer)
    r.check(rc == 0, "SIGTERM drains and exits 0 (got %r)" % rc)
    r.check(took < 2.5, "the stop takes the call's 0.6 s left: %.2f s" % took)
    idle.close()
    ch.close()
    r.finish()


if __name__ == "__main__":
    main()
