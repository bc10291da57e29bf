"""python -m praxis_client health|info|step: praxis-cli's three commands, for machines without
the C++ tools.

    python -m praxis_client health --address=HOST:PORT [--service=NAME]    exit 0 iff SERVING
    python -m praxis_client info   --address=HOST:PORT [--json]
    python -m praxis_client step   --address=HOST:PORT (--inputs=FILE | --layout=L,h,w,K,F
                                   [--batch=B --seed=S]) --out=FILE [--outputs=...] ...

TLS and the token as praxis-cli: --tls, --tls_ca, --tls_cert, --tls_key, --tls_server_name,
--token_file. Exit status: 0 success, 1 the server answered an error (or not SERVING), 2 bad
usage or input.
"""
import argparse
import re
import sys

from praxis_client import step_files
from praxis_client.client import Client
from praxis_client.errors import PraxisError

_UNITS = {"ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


class _ServerError(Exception):
    """An answer from the server that ends the command with exit status 1."""


def _duration(text: str) -> float:
    """Seconds of "60", "60s", "500ms", "2m" or "1h" (absl's duration flags, as praxis-cli's)."""
    m = re.fullmatch(r"(\d+(?:\.\d*)?)(ms|s|m|h)?", text.strip())
    if not m:
        raise argparse.ArgumentTypeError(f"expected a duration such as 60s or 500ms, got {text!r}")
    return float(m.group(1)) * _UNITS[m.group(2) or "s"]


def _bool(text: str) -> bool:
    """true/false, 1/0, yes/no, as absl's bool flags."""
    value = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}
    if text.lower() not in value:
        raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")
    return value[text.lower()]


def _parser() -> argparse.ArgumentParser:
    """The command line: a command and praxis-cli's flags for it."""
    p = argparse.ArgumentParser(prog="python -m praxis_client",
                                description="Talks to praxis-server, as praxis-cli does.")
    p.add_argument("command", choices=("health", "info", "step"))
    p.add_argument("--address", default="127.0.0.1:50051", help="the server, HOST:PORT")
    p.add_argument("--timeout", type=_duration, default=60.0, help="deadline of each call (60s)")
    p.add_argument("--max_attempts", type=int, default=3, help="tries of a call answered "
                   "UNAVAILABLE")
    p.add_argument("--tls", type=_bool, nargs="?", const=True, default=False,
                   help="connect with TLS (system roots unless --tls_ca)")
    p.add_argument("--tls_ca", help="PEM roots to verify the server with; implies --tls")
    p.add_argument("--tls_cert", help="PEM client certificate, for servers that require one")
    p.add_argument("--tls_key", help="PEM client key")
    p.add_argument("--tls_server_name", help="name to check the server certificate against")
    p.add_argument("--token_file", help="file whose first line is the bearer token")
    p.add_argument("--service", default="", help="health: the service to ask about")
    p.add_argument("--json", action="store_true", help="info: print the ModelInfo as JSON")
    p.add_argument("--inputs", help="step: safetensors with text, anchor, [clean], noised, "
                   "timesteps, [frames_per_chunk]")
    p.add_argument("--layout", help="step: random inputs for text_len,h,w,K,F instead")
    p.add_argument("--batch", type=int, default=1, help="step: rows of the random inputs")
    p.add_argument("--seed", type=int, default=0, help="step: seed of the random inputs")
    p.add_argument("--frames_per_chunk", type=int, default=0,
                   help="step: F; 0 takes it from --inputs or --layout")
    p.add_argument("--decode", type=_bool, default=True, help="step: run the decoder tower")
    p.add_argument("--rope_shifts", default="0,0,0,0",
                   help="step: encoder anchor, text, video, decoder")
    p.add_argument("--outputs", default="velocity,cond,taps,embeddings,positions",
                   help="step: comma-separated velocity, cond, taps, tap.N, embeddings, positions")
    p.add_argument("--wire_dtype", default="float32", help="step: float32 | bfloat16 | float16")
    p.add_argument("--out", help="step: safetensors file for every returned output")
    return p


def _health(client: Client, args) -> None:
    """Prints the health of --service; _ServerError unless SERVING."""
    status = client.health(args.service)
    print(status)
    if status != "SERVING":
        raise _ServerError(status)


def _info(client: Client, args) -> None:
    """Prints the ModelInfo as praxis-cli does, or as JSON with --json."""
    i = client.info()
    if args.json:
        from google.protobuf import json_format
        print(json_format.MessageToJson(i, preserving_proto_field_name=True))
        return
    print(f"model: {i.model}\ndtype: {i.dtype}\ndevice: {i.device}\ncompute: {i.compute}\n"
          f"max_batch_rows: {i.max_batch_rows}\nmax_request_rows: {i.max_request_rows}\n"
          f"max_text_len: {i.max_text_len}\nmax_grid: {i.max_grid_h} x {i.max_grid_w}\n"
          f"max_frames: {i.max_frames}\nmax_tokens: {i.max_tokens}\n"
          f"max_chunk_bytes: {i.max_chunk_bytes}\noutputs: {', '.join(i.outputs)}\n"
          f"config: {i.config_json}")


def _step_inputs(client: Client, args) -> dict:
    """The step's inputs from --inputs, or random ones of --layout for the server's model."""
    if (args.inputs is None) == (args.layout is None):
        raise ValueError("--inputs, --layout: give exactly one of them")
    if args.inputs is not None:
        return step_files.read_inputs(args.inputs, args.frames_per_chunk)
    layout = step_files.parse_layout(args.layout)
    config = client.info().config_json
    try:
        inputs = step_files.synthetic_inputs(config, layout, args.batch, args.seed)
    except ValueError as e:
        raise _ServerError(str(e)) from None
    if args.frames_per_chunk > 0:
        inputs["frames_per_chunk"] = args.frames_per_chunk
    return inputs


def _rope_shifts(text: str) -> list:
    """--rope_shifts as four integers; ValueError naming the flag otherwise."""
    try:
        shifts = [int(s) for s in text.split(",")]
    except ValueError:
        shifts = []
    if len(shifts) != 4:
        raise ValueError(f"--rope_shifts: expected 4 integers, got {text!r}")
    return shifts


def _step(client: Client, args) -> None:
    """One step; its outputs written to --out, a summary line printed."""
    if not args.out:
        raise ValueError("--out: missing; give the safetensors file for the outputs")
    inputs = _step_inputs(client, args)
    r = client.step(**inputs, decode=args.decode, rope_shifts=_rope_shifts(args.rope_shifts),
                    outputs=[o for o in args.outputs.split(",") if o],
                    wire_dtype=args.wire_dtype, request_id="praxis_client")
    names = step_files.write_outputs(args.out, r)
    print(f"step ok: layout {r.layout_key}, queue {r.queue_us / 1e3} ms, compute "
          f"{r.compute_us / 1e3} ms, total {r.total_us / 1e3} ms, batch rows "
          f"{r.header.batch_rows}; {', '.join(names)} -> {args.out}")


def main(argv=None) -> int:
    """Runs one command; returns its exit status (0 ok, 1 the server's error, 2 bad input)."""
    args = _parser().parse_args(argv)
    try:
        with Client(args.address, timeout=args.timeout, max_attempts=args.max_attempts,
                    tls=args.tls, tls_ca=args.tls_ca, tls_cert=args.tls_cert,
                    tls_key=args.tls_key, tls_server_name=args.tls_server_name,
                    token_file=args.token_file) as client:
            {"health": _health, "info": _info, "step": _step}[args.command](client, args)
        return 0
    except (PraxisError, _ServerError) as e:
        print(f"praxis_client {args.command}: server: {e}", file=sys.stderr)
        return 1
    except (ValueError, OSError) as e:
        print(f"praxis_client {args.command}: {e}", file=sys.stderr)
        return 2


def cli() -> None:
    """The praxis-client console script: main() on sys.argv, its status as the exit status."""
    sys.exit(main())


if __name__ == "__main__":
    cli()
