#!/usr/bin/env python3
"""Streams one completion from a thetaserve server.

Stubs are generated from proto/ with grpcio-tools on first use (into ./gen, git-ignored):

    python3 examples/python/client.py --addr localhost:50051 --prompt "The capital of France is"
"""
import argparse
import os
import pathlib
import subprocess
import sys

HERE = pathlib.Path(__file__).resolve().parent
PROTO_ROOT = HERE.parent.parent / "proto"
GEN = HERE / "gen"


def ensure_stubs():
    target = GEN / "thetaserve" / "v1" / "generation_pb2_grpc.py"
    proto = PROTO_ROOT / "thetaserve" / "v1" / "generation.proto"
    if not target.exists() or target.stat().st_mtime < proto.stat().st_mtime:
        GEN.mkdir(exist_ok=True)
        subprocess.run(
            [sys.executable, "-m", "grpc_tools.protoc", f"-I{PROTO_ROOT}",
             f"--python_out={GEN}", f"--grpc_python_out={GEN}", str(proto)],
            check=True)
    sys.path.insert(0, str(GEN))


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--addr", default="localhost:50051")
    parser.add_argument("--prompt", required=True)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--seed", type=int)
    parser.add_argument("--api-key", default=os.environ.get("THETASERVE_API_KEY"))
    args = parser.parse_args()

    ensure_stubs()
    import grpc
    from thetaserve.v1 import generation_pb2 as pb
    from thetaserve.v1 import generation_pb2_grpc as pb_grpc

    channel = grpc.insecure_channel(args.addr)
    stub = pb_grpc.GenerationStub(channel)
    sampling = pb.SamplingParams(temperature=args.temperature)
    if args.seed is not None:
        sampling.seed = args.seed
    request = pb.GenerateRequest(
        prompt=args.prompt, sampling=sampling,
        stopping=pb.StoppingCriteria(max_tokens=args.max_tokens))
    metadata = [("authorization", f"Bearer {args.api_key}")] if args.api_key else None
    complete = None
    for response in stub.Generate(request, metadata=metadata, timeout=300):
        kind = response.WhichOneof("kind")
        if kind == "chunk":
            sys.stdout.write(response.chunk.text)
            sys.stdout.flush()
        elif kind == "complete":
            complete = response.complete
    sys.stdout.write("\n")
    if complete is None:
        print("error: the stream ended without a Complete message", file=sys.stderr)
        return 1
    print(f"finish: {pb.FinishReason.Name(complete.finish_reason)}, "
          f"{complete.usage.completion_tokens} tokens, "
          "ttft " + (f"{complete.timings.time_to_first_token_seconds:.3f} s"
                     if complete.timings.HasField("time_to_first_token_seconds") else "-"),
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
