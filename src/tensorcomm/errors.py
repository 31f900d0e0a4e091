"""Every exception tensorcomm raises about the job (as opposed to bad arguments).

Bad arguments raise the built-in ``TypeError`` / ``ValueError`` at once, on the calling rank;
arguments that disagree with each other (a list of the wrong length, list members whose shape or
dtype differs from the tensor) raise ``ArgumentMismatchError``, which is both. Failures of the
job raise a subclass of ``CommError``::

    RuntimeError
     └── CommError                    anything that went wrong between ranks
          ├── CommTimeoutError        a call did not complete within the group's timeout
          ├── PeerLostError           a peer's process or connection went away (names the rank)
          ├── CollectiveMismatchError ranks called different collectives / shapes / dtypes / ops
          ├── GroupAbortedError       the group was aborted or destroyed while a call was pending
          │    └── ExcludedError      the other members shrank the group without this rank
          ├── ConcurrentUseError      a group was used from two threads at once (and is aborted)
          ├── RendezvousError         the job could not assemble (store unreachable, rank missing)
          └── AuthenticationError     a connection failed the job-secret challenge
               └── LinkAuthenticationError  a frame on a data link failed its check (names the
                                            peer; also a PeerLostError: the link is closed)
"""

from __future__ import annotations

__all__ = ["CommError", "CommTimeoutError", "PeerLostError", "CollectiveMismatchError",
           "GroupAbortedError", "ExcludedError", "ConcurrentUseError", "RendezvousError",
           "AuthenticationError", "LinkAuthenticationError", "ArgumentMismatchError"]


class CommError(RuntimeError):
    """Base class of every failure of a collective job."""


class CommTimeoutError(CommError, TimeoutError):
    """A call did not complete within the timeout."""


class PeerLostError(CommError):
    """A peer rank died or its connection closed; ``rank`` is its global rank.

    ``left`` is True when the peer said goodbye (it called ``destroy()``), and ``last_step``
    is the last call step it announced in the group, where the transport can see it.
    """

    left = False  # also for copies made without __init__ (a transport re-raising a stored error)
    last_step: int | None = None

    def __init__(self, rank: int, detail: str = "", *, left: bool = False,
                 last_step: int | None = None) -> None:
        self.rank = rank
        self.left = left
        self.last_step = last_step
        message = f"peer rank {rank} was lost"
        super().__init__(f"{message}: {detail}" if detail else message)


class CollectiveMismatchError(CommError):
    """Ranks issued incompatible calls at the same step of a group."""


class GroupAbortedError(CommError):
    """The group was aborted or destroyed while the call was pending."""


class ExcludedError(GroupAbortedError):
    """The other members of a group agreed to go on without this rank (``Group.shrink``): it was
    too late, or they had lost their connection to it. It cannot rejoin their group."""


class ConcurrentUseError(CommError):
    """A call was issued on a group from a second thread while the first thread's calls on it
    were in flight: their order could differ between ranks, so the group is aborted on every
    member. Use one group per thread, or finish one thread's calls before the next starts."""


class RendezvousError(CommError):
    """The job could not be assembled."""


class AuthenticationError(CommError):
    """A connection did not prove knowledge of the job secret."""


class LinkAuthenticationError(AuthenticationError, PeerLostError):
    """A frame from peer ``rank`` failed its authentication tag: altered, injected or replayed on
    the way (see ``transports/tcp/sealing.py``). The link to that peer is closed."""

    def __init__(self, rank: int, detail: str) -> None:
        self.rank = rank
        CommError.__init__(self, f"the link to rank {rank} failed authentication: {detail}")


class ArgumentMismatchError(TypeError, ValueError):
    """Arguments disagree with each other (list length, shape or dtype of list members).

    Both a ``TypeError`` (as MindSpore documents these cases) and a ``ValueError`` (as numpy
    and torch users expect), so either ``except`` clause catches it.
    """
