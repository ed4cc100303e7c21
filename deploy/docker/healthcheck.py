#!/usr/bin/env python3
"""gRPC health check for thetaserve: calls grpc.health.v1.Health/Check and exits 0 when the
answer is SERVING, 1 otherwise (NOT_SERVING while loading or draining, unreachable, unknown
service, timeout).

Needs only the grpc module (Debian's python3-grpcio): the request and response are encoded by
hand (HealthCheckRequest is `string service = 1`, HealthCheckResponse is `enum status = 1`), so
no generated stubs or grpcio-health-checking package are needed. The image's HEALTHCHECK runs
it through `entrypoint.sh health`.

usage: healthcheck.py [--addr 127.0.0.1:50051] [--service NAME] [--timeout 3]
                      [--tls-ca FILE [--server-name NAME]]
"""
import argparse
import sys

STATUS = {0: "UNKNOWN", 1: "SERVING", 2: "NOT_SERVING", 3: "SERVICE_UNKNOWN"}


def encode_request(service):
    data = service.encode("utf-8")
    if not data:
        return b""
    out = bytearray(b"\x0a")  # field 1, wire type 2 (length-delimited)
    n = len(data)
    while True:  # varint length
        byte = n & 0x7F
        n >>= 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            break
    return bytes(out) + data


def decode_status(data):
    """Returns the status field (1) of a HealthCheckResponse; 0 (UNKNOWN) when absent."""
    i, status = 0, 0
    while i < len(data):
        key, shift = 0, 0
        while True:
            b = data[i]
            i += 1
            key |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                break
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, shift = 0, 0
            while True:
                b = data[i]
                i += 1
                value |= (b & 0x7F) << shift
                shift += 7
                if not b & 0x80:
                    break
            if field == 1:
                status = value
        elif wire == 2:
            n, shift = 0, 0
            while True:
                b = data[i]
                i += 1
                n |= (b & 0x7F) << shift
                shift += 7
                if not b & 0x80:
                    break
            i += n
        elif wire == 1:
            i += 8
        elif wire == 5:
            i += 4
        else:
            raise ValueError("unexpected wire type %d" % wire)
    return status


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--addr", default="127.0.0.1:50051")
    ap.add_argument("--service", default="", help='health service name ("" = the whole server)')
    ap.add_argument("--timeout", type=float, default=3.0)
    ap.add_argument("--tls-ca", help="connect with TLS, trusting this PEM file")
    ap.add_argument("--server-name", help="TLS name to expect (default: the host of --addr)")
    args = ap.parse_args(argv)
    try:
        import grpc
    except ImportError:
        print("healthcheck: the grpc module is missing (Debian: python3-grpcio)", file=sys.stderr)
        return 2
    if args.tls_ca:
        with open(args.tls_ca, "rb") as f:
            creds = grpc.ssl_channel_credentials(root_certificates=f.read())
        options = [("grpc.ssl_target_name_override", args.server_name)] if args.server_name else []
        channel = grpc.secure_channel(args.addr, creds, options=options)
    else:
        channel = grpc.insecure_channel(args.addr)
    check = channel.unary_unary("/grpc.health.v1.Health/Check",
                                request_serializer=None, response_deserializer=None)
    try:
        reply = check(encode_request(args.service), timeout=args.timeout)
    except grpc.RpcError as e:
        print("healthcheck: %s %s: %s" % (args.addr, e.code().name, e.details()), file=sys.stderr)
        return 1
    finally:
        channel.close()
    status = decode_status(reply)
    name = STATUS.get(status, str(status))
    print("healthcheck: %s service %r: %s" % (args.addr, args.service, name))
    return 0 if status == 1 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
