"""all_reduce across "hosts" made of network namespaces, on links shaped by ``tc tbf``: tensorcomm
against Gloo, side by side in the same ranks, every result checked.

Each configuration (hosts x ranks per host x link rate) is one cluster of
``tests/multihost/multihost_harness.py``: a namespace per host, veths to one bridge, a token
bucket on both ends of every host's veth. Each host runs ``tensorcomm run --nnodes H`` of the
rank script below; every rank joins tensorcomm (``init()``) and torch's Gloo (rendezvous on host 0,
``GLOO_SOCKET_IFNAME`` = the host's veth) and, per size and round, times each library in turn
(the order rotates per round), so the libraries share the machine's state and only ratios are
compared. Every call reduces a fresh input whose result is checked against the exact sum; a
wrong element fails the run.

Columns (``VARIANTS``): ``flat`` (TCP between all ranks, ``TENSORCOMM_HIERARCHY=off``),
``flat-bf16`` (the same with bfloat16 on the wire) and ``hierarchical`` (the default: shared
memory inside a host, the network between hosts), each a job of its own measured beside Gloo.
Adding one is adding a ``VARIANTS`` entry: the environment its job starts with.

Needs root, iproute2 (``ip``, ``tc``) and torch. Run from the repository root::

    sudo python benchmarks/multihost_allreduce.py                    # the recorded set
    python benchmarks/multihost_allreduce.py --topologies 2x2 --rates 1gbit --sizes 1M
"""

from __future__ import annotations

import argparse
import json
import secrets
import statistics
import sys
import tempfile
import textwrap
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "multihost"))
from multihost_harness import clusters, unsupported_reason

GLOO_PORT = 29600  # on host 0, beside tensorcomm's store at multihost_harness.MASTER_PORT
SIZES = {"64K": 64 << 10, "1M": 1 << 20, "16M": 16 << 20, "256M": 256 << 20}
# tbf needs a bucket of a few milliseconds of traffic to reach its rate with the kernel's timers.
BURST = {"1gbit": "256kb", "10gbit": "2mb"}

# What each tensorcomm column is: the environment its job starts with. Each column is a job of
# its own (init, every size and round interleaved with Gloo, destroy), since these choices are
# made per job; Gloo stays up throughout and is measured beside each column.
VARIANTS = {
    "flat": {"TENSORCOMM_HIERARCHY": "off"},
    "flat-bf16": {"TENSORCOMM_HIERARCHY": "off", "TENSORCOMM_WIRE_DTYPE": "bfloat16"},
    "hierarchical": {},
}

RANK_SCRIPT = textwrap.dedent('''
    import datetime, json, os, sys, time
    import numpy as np
    import torch
    import torch.distributed as dist
    import tensorcomm as tc

    sizes, rounds = json.loads(sys.argv[1]), int(sys.argv[2])
    budget, timeout = float(sys.argv[3]), float(sys.argv[4])
    variants = json.loads(sys.argv[5])
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", init_method=os.environ["BENCH_GLOO_INIT"], rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=timeout))
    # Inputs repeat an 8-element pattern of small integers: every sum is exact in float32 (and
    # in bfloat16: at most 7 x 8 ranks), and the check needs no second full-size array.
    row = ((np.arange(8) + rank) % 7 + 1).astype(np.float32)
    want = sum(((np.arange(8) + r) % 7 + 1).astype(np.float32) for r in range(world))

    def slowest(value):
        value = torch.tensor([float(value)], dtype=torch.float64)
        dist.all_reduce(value, op=dist.ReduceOp.MAX)
        return float(value[0])

    # name -> (one in-place float32 sum of x / its torch view t, a barrier of that library)
    LIBRARIES = {"tensorcomm": (lambda x, t: tc.all_reduce(x), tc.barrier),
                 "gloo": (lambda x, t: dist.all_reduce(t), dist.barrier)}

    for variant, env in variants.items():
        os.environ.update(env)
        tc.init(timeout=timeout)
        for nbytes in sizes:
            x = np.empty(nbytes // 4, np.float32)
            t = torch.from_numpy(x)
            blocks = x.reshape(-1, 8)
            for rnd in range(rounds):
                for name in (["tensorcomm", "gloo"] if rnd % 2 == 0 else ["gloo", "tensorcomm"]):
                    run, barrier = LIBRARIES[name]
                    times, wrong, spent = [], 0, 0.0
                    while spent < budget or len(times) < 2:
                        blocks[...] = row
                        barrier()
                        start = time.perf_counter()
                        run(x, t)
                        seconds = slowest(time.perf_counter() - start)
                        wrong += int(np.count_nonzero(blocks != want))
                        times.append(seconds)
                        spent += seconds
                    wrong = slowest(wrong)
                    if rank == 0:
                        print("RESULT " + json.dumps({"library": name, "variant": variant, "bytes": nbytes,
                                                      "round": rnd, "times": times[1:], "wrong": int(wrong)}),
                              flush=True)
        tc.destroy()
        for key in env:
            del os.environ[key]
    dist.destroy_process_group()
''')


def parse_topology(text: str) -> tuple[int, int]:
    hosts, _, per_host = text.partition("x")
    return int(hosts), int(per_host)


def run_configuration(make, hosts: int, per_host: int, rate: str, sizes: list[int], rounds: int,
                      budget: float, variants: dict[str, dict[str, str]], timeout: float,
                      workdir: Path) -> list[dict]:
    """One cluster, shaped to ``rate``; return rank 0's result records."""
    cluster = make(hosts)
    for host in cluster.hosts:
        cluster.tc(host.netns, "qdisc", "add", "dev", host.ifname, "root", "tbf", "rate", rate,
                   "burst", BURST.get(rate, "256kb"), "latency", "400ms")
        cluster.tc(cluster.switch, "qdisc", "add", "dev", host.port, "root", "tbf", "rate", rate,
                   "burst", BURST.get(rate, "256kb"), "latency", "400ms")
    script = workdir / "rank.py"
    script.write_text(RANK_SCRIPT)
    secret = secrets.token_hex(32)
    gloo_init = f"tcp://{cluster.hosts[0].address}:{GLOO_PORT}"
    jobs = [cluster.launch(host, script, json.dumps(sizes), str(rounds), str(budget), str(timeout),
                           json.dumps(variants), nprocs=per_host, secret=secret,
                           timeout=timeout * 4 * len(variants),
                           env={"BENCH_GLOO_INIT": gloo_init, "GLOO_SOCKET_IFNAME": host.ifname,
                                "OMP_NUM_THREADS": "1"})
            for host in cluster.hosts]
    finished = [job.finish(timeout * 4 * len(variants) + 30) for job in jobs]
    for index, result in enumerate(finished):
        if result.returncode != 0:
            raise SystemExit(f"node {index} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")
    records = [json.loads(line.split("RESULT ", 1)[1]) for line in finished[0].stdout.splitlines()
               if "RESULT " in line]
    return [dict(record, hosts=hosts, per_host=per_host, rate=rate) for record in records]


def _bits_per_second(rate: str) -> float:
    """``"10gbit"`` -> 1e10 (tc's units), for ordering rows."""
    for unit, scale in (("gbit", 1e9), ("mbit", 1e6), ("kbit", 1e3), ("bit", 1.0)):
        if rate.endswith(unit):
            return float(rate[:-len(unit)]) * scale
    raise ValueError(f"rates: {rate!r} is not a tc rate such as '1gbit'")


def _measured(records: list[dict], key: tuple[int, int, str, int], library: str,
              variant: str | None) -> dict:
    """Median time and busbw of ``library`` at ``key`` (hosts, per_host, rate, bytes), over the
    phases of ``variant`` (None: every phase)."""
    hosts, per_host, _, nbytes = key
    ranks = hosts * per_host
    mine = [r for r in records if (r["hosts"], r["per_host"], r["rate"], r["bytes"]) == key
            and r["library"] == library and variant in (None, r["variant"])]
    seconds = statistics.median(t for r in mine for t in r["times"])
    return {"seconds": seconds, "busbw": nbytes * 2 * (ranks - 1) / ranks / seconds / 1e9,
            "wrong": sum(r["wrong"] for r in mine), "calls": sum(len(r["times"]) for r in mine)}


def summarise(records: list[dict], variants: list[str]) -> tuple[str, list[dict]]:
    """A markdown table: busbw of each tensorcomm column and of Gloo (median over every phase),
    and each column's speed over the Gloo measured beside it; with its rows."""
    rows, keys = [], sorted({(r["hosts"], r["per_host"], r["rate"], r["bytes"]) for r in records},
                            key=lambda k: (k[0], k[1], _bits_per_second(k[2]), k[3]))
    for key in keys:
        hosts, per_host, rate, nbytes = key
        row: dict = {"hosts": hosts, "per_host": per_host, "rate": rate, "bytes": nbytes}
        for variant in variants:
            row[variant] = _measured(records, key, "tensorcomm", variant)
            row[variant]["gloo"] = _measured(records, key, "gloo", variant)
        row["gloo"] = _measured(records, key, "gloo", None)
        rows.append(row)
    head = (["hosts x ranks", "link", "size"] + [f"{v} busbw (GB/s)" for v in variants]
            + ["Gloo busbw (GB/s)"] + [f"{v}/Gloo" for v in variants] + ["wrong"])
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for row in rows:
        size = next((k for k, v in SIZES.items() if v == row["bytes"]), str(row["bytes"]))
        cells = [f"{row['hosts']} x {row['per_host']}", row["rate"], size]
        cells += [f"{row[v]['busbw']:.3f}" for v in variants] + [f"{row['gloo']['busbw']:.3f}"]
        cells += [f"{row[v]['gloo']['seconds'] / row[v]['seconds']:.2f}x" for v in variants]
        cells.append(str(row["gloo"]["wrong"] + sum(row[v]["wrong"] for v in variants)))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines), rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--topologies", nargs="+", default=["2x2", "4x2"], help="HOSTSxRANKS_PER_HOST")
    parser.add_argument("--rates", nargs="+", default=["1gbit", "10gbit"], help="tc tbf rates")
    parser.add_argument("--sizes", nargs="+", default=list(SIZES), choices=list(SIZES))
    parser.add_argument("--rounds", type=int, default=2, help="measurements per column and size")
    parser.add_argument("--budget", type=float, default=1.0, help="seconds of timed calls per round")
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS),
                        help="tensorcomm columns (each beside Gloo)")
    parser.add_argument("--timeout", type=float, default=300.0, help="the ranks' collective timeout")
    parser.add_argument("--json", type=Path, metavar="FILE", help="also write every measurement as JSON")
    args = parser.parse_args(argv)
    reason = unsupported_reason()
    if reason is not None:
        print(f"cannot build network namespaces here: {reason}", file=sys.stderr)
        return 2
    variants = {name: VARIANTS[name] for name in args.variants}
    sizes = [SIZES[s] for s in args.sizes]
    records: list[dict] = []
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="tensorcomm-multihost-bench-") as tmp, \
            clusters(Path(tmp)) as make:
        for topology in args.topologies:
            hosts, per_host = parse_topology(topology)
            for rate in args.rates:
                workdir = Path(tmp) / f"{topology}-{rate}"
                workdir.mkdir()
                print(f"# {hosts} hosts x {per_host} ranks, links at {rate} ...", flush=True)
                records += run_configuration(make, hosts, per_host, rate, sizes, args.rounds,
                                             args.budget, variants, args.timeout, workdir)
    table, rows = summarise(records, list(variants))
    wrong = sum(r["wrong"] for r in records)
    print(table)
    print(f"# {len(records)} measurements in {time.monotonic() - started:.0f} s; wrong elements: {wrong}")
    if args.json:
        args.json.write_text(json.dumps(
            {"options": vars(args) | {"json": str(args.json)}, "rows": rows, "records": records}, indent=1))
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
