"""MPI as tensorcomm's transport between ranks (``init(backend="mpi")``), through mpi4py.

``transport.py`` carries tensorcomm's tagged messages over MPI point-to-point calls;
``framing.py`` is the header every message starts with; ``comm.py`` loads mpi4py, waits on MPI
within tensorcomm's deadlines and ends a failed MPI job at exit; ``join.py`` meets the ranks of
an mpirun job (the store rank 0 serves, its address and the job secret handed out by MPI).
Nothing here imports mpi4py until a world asks for the MPI backend. See docs/mpi.md.
"""
