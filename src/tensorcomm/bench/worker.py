"""One rank of a benchmark job: ``python -m tensorcomm.bench.worker --peer NAME --control H:P``.

Started by ``tensorcomm bench`` through the peer's launcher (``peers.<peer>.commands``), never by
hand. Joins the library's job, says hello to the parent, then runs each task it is sent with
``timing.measure`` and answers with the measurement, until told to exit or the parent goes away.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import traceback

from . import peers
from .control import TOKEN_ENV, ControlClient
from .peers.base import Task, Unsupported
from .timing import Plan, measure


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m tensorcomm.bench.worker")
    parser.add_argument("--peer", required=True, choices=sorted(peers.PEERS))
    parser.add_argument("--control", required=True, metavar="HOST:PORT",
                        help="the parent's control address")
    parser.add_argument("--init-method", help="the library's own rendezvous URL, if it needs one")
    parser.add_argument("--role", choices=("rank", "scheduler"), default="rank",
                        help="scheduler: MindSpore's cluster scheduler, which runs no task")
    return parser


def serve(peer: peers.base.Peer, client: ControlClient) -> None:
    """Answer the parent's tasks until it says exit or goes away."""
    while True:
        message = client.recv()
        if message is None or message.get("exit"):
            return
        task = Task.from_json(message["task"])
        try:
            case = peer.case(task)
        except Unsupported as exc:
            client.send({"unsupported": str(exc)})
            continue
        result = measure(case, peer.barrier, client, Plan(**message["plan"]))
        algorithm = case.algorithm()
        del case  # free the buffers before the next size is allocated
        client.send({"done": {**dataclasses.asdict(result), "algorithm": algorithm}})


def main(argv: list[str] | None = None) -> int:
    """Run one rank; return its exit code (1 after an error, which the parent also gets)."""
    args = _parser().parse_args(argv)
    module = peers.load(args.peer)
    if args.role == "scheduler":
        module.serve_scheduler()
        return 0
    host, _, port = args.control.rpartition(":")
    peer = module.open(args.init_method)
    client = ControlClient(host, int(port))
    try:
        client.send({"hello": {"rank": peer.rank, "size": peer.size, "version": peer.version,
                               # The token is the parent's, for its children only; it is not a
                               # tensorcomm setting, so it is not read through discovery.
                               "token": os.environ.get(TOKEN_ENV, "")}})
        serve(peer, client)
    except (ConnectionError, BrokenPipeError):
        return 1  # the parent has gone; nothing left to report to
    except Exception:  # noqa: BLE001 - reported to the parent, which stops the job
        try:
            client.send({"error": f"rank {peer.rank}: {traceback.format_exc(limit=4)}"})
        finally:
            traceback.print_exc(file=sys.stderr)
        return 1
    finally:
        client.close()
    peer.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
