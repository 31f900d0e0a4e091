"""``tensorcomm bench``: nccl-tests-style collective benchmarks, side by side with other libraries.

Modules, one job each:

    cli        the subcommand: chooses launched or in-process mode, prints, writes files
    options    flags, their checks, the size sweep
    formulas   what each collective moves; algbw and busbw (nccl-tests' formulas)
    check      buffer layout, input patterns, count of wrong elements against numpy
    timing     warm-up, agreed iteration counts, barriers, batches, median of slowest ranks
    runner     peer jobs (one process set per library) and the interleaved sweep
    control    the JSON-lines channel between the parent and a job's ranks
    worker     ``python -m tensorcomm.bench.worker``: one rank of a job
    peers/     tensorcomm, torch Gloo, mpi4py, MindSpore behind one interface (peers.base)
    results    rows and tensorcomm/peer ratios
    report     machine header, table, CSV, JSON
    plot       busbw and time against size (matplotlib, optional)
    progress   the terminal progress bar (rich or tqdm, optional)

Peers and plotting are optional extras; nothing here is imported by the core library.
"""
