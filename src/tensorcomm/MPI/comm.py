"""``MPI.Comm`` / ``MPI.Intracomm`` and the predefined ``COMM_WORLD``, ``COMM_SELF``,
``COMM_NULL``.

A communicator is a handle on a tensorcomm group: ``COMM_WORLD`` on the world group,
``COMM_SELF`` on a group of this process alone (both made on first use), ``Dup``/``Split``/
``Create`` on new groups. ``Comm(other)`` is another handle on the same communicator, as in
mpi4py. Point-to-point calls come from ``pt2pt.PointToPoint``, buffer collectives from
``collectives.Collectives``, object collectives from ``objects.ObjectCollectives``; every
public method raises tensorcomm's job errors as ``MPI.Exception`` too. What tensorcomm does not
offer (intercommunicators, topologies, dynamic processes) raises ``NotImplementedError``.
"""

from __future__ import annotations

import inspect
from typing import Any

import numpy as np

from ..core.group import Group as TcGroup
from . import exceptions, runtime
from .collectives import Collectives
from .constants import (
    COMM_TYPE_HW_GUIDED,
    COMM_TYPE_RESOURCE_GUIDED,
    COMM_TYPE_SHARED,
    CONGRUENT,
    IDENT,
    SIMILAR,
    TAG_UB,
    UNDEFINED,
    UNEQUAL,
)
from .group import Group
from .info import Info
from .memory import Attached
from .objects import ObjectCollectives
from .p2p import Engine
from .pt2pt import PointToPoint
from .request import Request, WorkPending


class _Handle:
    """One communicator: its tensorcomm group (made on first use for the predefined ones), its
    matching engine (made on first point-to-point use), its name."""

    __slots__ = ("kind", "group", "engine", "name", "errhandler", "attrs", "info", "attached")

    def __init__(self, kind: str, group: TcGroup | None, name: str) -> None:
        self.kind, self.group, self.name = kind, group, name
        self.engine: Engine | None = None
        self.errhandler: Any = None
        self.attrs: dict[int, Any] = {}
        self.info = Info.Create()
        self.attached = Attached()

    def resolve(self) -> TcGroup:
        group = self.group
        if group is None or not group.is_member:
            if self.kind == "null":
                raise exceptions.error(exceptions.ERR_COMM, "the communicator is MPI.COMM_NULL")
            if self.kind == "freed":
                raise exceptions.error(exceptions.ERR_COMM, f"{self.name} was freed")
            world = runtime.world()
            group = world.world_group if self.kind == "world" else world.new_group([world.rank])
            self.group = group
        return group


def _unsupported(call: str, what: str) -> NotImplementedError:
    return NotImplementedError(f"Comm.{call}: {what} are not offered by tensorcomm.MPI; see docs/mpi.md")


class Comm(PointToPoint, Collectives, ObjectCollectives):
    """A communicator; ``Comm()`` is ``COMM_NULL``, ``Comm(comm)`` another handle on ``comm``."""

    __slots__ = ("_h",)

    def __init__(self, comm: Comm | None = None) -> None:
        if comm is not None and not isinstance(comm, Comm):
            raise TypeError(f"Comm: expected a communicator to copy, got {type(comm).__name__}")
        self._h: _Handle = _NULL if comm is None else comm._h

    # -- what the mixins use --------------------------------------------------------------------

    def _tc(self) -> TcGroup:
        return self._h.resolve()

    def _live(self) -> TcGroup | None:
        return self._h.group

    def _size(self) -> int:
        return self._h.resolve().size

    def _engine(self) -> Engine:
        handle = self._h
        engine = handle.engine
        if engine is None or engine.shm is None or engine.shm.closed:  # an open domain: a live group
            group = handle.resolve()
            if engine is None or engine.shm is not None:  # none yet, or its group's domain closed
                runtime.world()  # raises after Finalize
                engine = handle.engine = Engine(group)
        return engine

    def _root(self, root: Any, fn: str) -> int:
        if isinstance(root, bool) or not isinstance(root, (int, np.integer)):
            raise TypeError(f"{fn}: root must be an int, got {type(root).__name__}")
        size = self._size()
        if not 0 <= root < size:
            raise exceptions.error(exceptions.ERR_ROOT, f"{fn}: root {root} is not a rank of a "
                                   f"communicator of {size}")
        return int(root)

    # -- identity -------------------------------------------------------------------------------

    def __bool__(self) -> bool:
        return self._h.kind not in ("null", "freed")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Comm):
            return NotImplemented
        return self._h is other._h

    def __hash__(self) -> int:
        return id(self._h)

    def __repr__(self) -> str:
        return f"<MPI.{type(self).__name__} {self._h.name}>"

    def Get_rank(self) -> int:
        """This process's rank in the communicator."""
        return self._h.resolve().rank

    def Get_size(self) -> int:
        """Number of processes in the communicator."""
        return self._h.resolve().size

    @property
    def rank(self) -> int:
        """This process's rank in the communicator."""
        return self.Get_rank()

    @property
    def size(self) -> int:
        """Number of processes in the communicator."""
        return self.Get_size()

    @property
    def group(self) -> Group:
        """The communicator's group."""
        return self.Get_group()

    @property
    def name(self) -> str:
        """The communicator's name."""
        return self._h.name

    @name.setter
    def name(self, value: str) -> None:
        self._h.name = str(value)

    def Get_name(self) -> str:
        """The communicator's name."""
        return self._h.name

    def Set_name(self, name: str) -> None:
        """Rename the communicator."""
        self._h.name = str(name)

    def Get_group(self) -> Group:
        """The communicator's processes as an ``MPI.Group``."""
        return Group._of(self._h.resolve().ranks)

    @property
    def is_inter(self) -> bool:
        """False: intercommunicators are not offered."""
        return False

    @property
    def is_intra(self) -> bool:
        """True."""
        return True

    def Is_inter(self) -> bool:
        """False: intercommunicators are not offered."""
        return False

    def Is_intra(self) -> bool:
        """True."""
        return True

    @property
    def topology(self) -> int:
        """``UNDEFINED``: topologies are not offered."""
        return UNDEFINED

    def Get_topology(self) -> int:
        """``UNDEFINED``: topologies are not offered."""
        return UNDEFINED

    def __reduce__(self) -> Any:
        for name in ("COMM_NULL", "COMM_WORLD", "COMM_SELF"):
            if self is globals()[name]:
                return name
        for name in ("COMM_NULL", "COMM_WORLD", "COMM_SELF"):
            if self._h is globals()[name]._h:
                return _handle_of, (name,)
        raise ValueError(f"cannot pickle {self!r}: only the predefined communicators pickle")

    def Compare(comm1: Comm, comm2: Comm) -> int:  # noqa: N805 - also called on the class
        """IDENT (the same communicator), CONGRUENT (same processes, same order), SIMILAR or UNEQUAL."""
        if comm1._h is comm2._h:
            return IDENT
        a, b = comm1._h.resolve().ranks, comm2._h.resolve().ranks
        if a == b:
            return CONGRUENT
        return SIMILAR if set(a) == set(b) else UNEQUAL

    # -- attributes and error handlers (kept, not acted on) -------------------------------------

    def Get_attr(self, keyval: int) -> Any:
        """The attribute ``keyval`` (``TAG_UB``: the largest tag); None if unset."""
        if keyval == TAG_UB:
            return TAG_UB
        return self._h.attrs.get(keyval)

    def Set_attr(self, keyval: int, value: Any) -> None:
        """Set an attribute."""
        self._h.attrs[keyval] = value

    def Delete_attr(self, keyval: int) -> None:
        """Remove an attribute."""
        self._h.attrs.pop(keyval, None)

    def Get_errhandler(self) -> Any:
        """The error handler set (errors always raise here)."""
        return self._h.errhandler

    def Set_errhandler(self, errhandler: Any) -> None:
        """Keep ``errhandler`` (errors always raise ``MPI.Exception`` here)."""
        self._h.errhandler = errhandler

    def Get_info(self) -> Info:
        """The hints set (kept, not acted on)."""
        return self._h.info.Dup()

    def Set_info(self, info: Info) -> None:
        """Keep ``info`` (tensorcomm takes no hints)."""
        self._h.info = info.Dup() if info else Info.Create()

    @property
    def info(self) -> Info:
        """The hints set."""
        return self.Get_info()

    @info.setter
    def info(self, info: Info) -> None:
        self.Set_info(info)

    @classmethod
    def Get_parent(cls) -> Intracomm:
        """``COMM_NULL``: no process here was spawned."""
        return COMM_NULL

    def Attach_buffer(self, buf: Any) -> None:
        """Keep ``buf`` as this communicator's buffered-send buffer (not needed here)."""
        self._h.attached.attach(buf)

    def Detach_buffer(self) -> Any:
        """The buffer attached, handed back."""
        return self._h.attached.detach()

    def Flush_buffer(self) -> None:
        """Buffered sends are complete once started here: a no-op."""

    def Iflush_buffer(self) -> Request:
        """``Flush_buffer``, as a request that is complete already."""
        request = Request()
        request._pending = WorkPending(None)
        return request

    # -- new communicators ----------------------------------------------------------------------

    def _new(self, group: TcGroup | None, name: str) -> Intracomm:
        return _made(group, name)

    def Dup(self, info: Any = None) -> Intracomm:
        """A new communicator with the same processes (collective)."""
        g = self._h.resolve()
        return self._new(g._world.new_group(list(g.ranks)), f"dup of {self._h.name}")

    Clone = Dup

    def Idup(self, info: Any = None) -> tuple[Intracomm, Request]:
        """``Dup``, with a request that is complete already."""
        comm = self.Dup()
        request = Request()
        request._pending = WorkPending(None)
        return comm, request

    def Dup_with_info(self, info: Any) -> Intracomm:
        """``Dup`` (the info is kept, not acted on)."""
        comm = self.Dup()
        comm.Set_info(info)
        return comm

    def Idup_with_info(self, info: Any) -> tuple[Intracomm, Request]:
        """``Idup`` (the info is kept, not acted on)."""
        comm, request = self.Idup()
        comm.Set_info(info)
        return comm, request

    def Split(self, color: int = 0, key: int = 0) -> Intracomm:
        """Members with the same ``color`` form a new communicator, ordered by ``key``;
        ``UNDEFINED`` gets ``COMM_NULL``."""
        g = self._h.resolve()
        made = g.split(None if color == UNDEFINED else color, key)
        return self._new(made, f"split of {self._h.name}")

    def Split_type(self, split_type: int, key: int = 0, info: Any = None) -> Intracomm:
        """Members that share a host form a new communicator (``COMM_TYPE_SHARED``);
        ``UNDEFINED`` gets ``COMM_NULL``."""
        g = self._h.resolve()
        hosts = g._world.hosts_of(g.ranks)
        mine = hosts[g.rank]
        shared = split_type == COMM_TYPE_SHARED or (
            split_type in (COMM_TYPE_HW_GUIDED, COMM_TYPE_RESOURCE_GUIDED) and isinstance(info, Info)
            and bool(info) and info.Get("mpi_hw_resource_type") == "mpi_shared_memory")
        color = hosts.index(mine) if shared else None
        made = g.split(color, key)
        return self._new(made, f"shared split of {self._h.name}")

    def Create(self, group: Group) -> Intracomm:
        """A communicator of ``group``'s processes (called by every member of this one);
        ``COMM_NULL`` on the others."""
        g = self._h.resolve()
        ranks = group._members()
        if not set(ranks) <= set(g.ranks):
            raise exceptions.error(exceptions.ERR_GROUP, "Create: the group has processes outside "
                                   "the communicator")
        if g._world.rank not in ranks:
            return Intracomm()
        return self._new(g._world.new_group(list(ranks)), f"communicator of {list(ranks)}")

    def Create_group(self, group: Group, tag: int = 0) -> Intracomm:
        """``Create``, called by the members of ``group`` only."""
        g = self._h.resolve()
        ranks = group._members()
        if g._world.rank not in ranks:
            return Intracomm()
        return self._new(g._world.new_group(list(ranks)), f"communicator of {list(ranks)}")

    def Free(self) -> None:
        """Release the communicator (``COMM_WORLD`` and ``COMM_SELF`` cannot be freed)."""
        handle = self._h
        if handle.kind in ("world", "self"):
            raise exceptions.error(exceptions.ERR_COMM, f"cannot free {handle.name}")
        group = handle.resolve()
        if handle.engine is not None:
            handle.engine.settle()
        handle.kind, handle.group, handle.engine = "freed", None, None
        group.destroy()
        self._h = _NULL

    Disconnect = Free

    def Abort(self, errorcode: int = 0) -> None:
        """End the job with ``errorcode``."""
        runtime.Abort_process(errorcode)

    # -- what tensorcomm does not offer ---------------------------------------------------------

    def Create_intercomm(self, *args: Any) -> None:
        """Not offered: raises NotImplementedError."""
        raise _unsupported("Create_intercomm", "intercommunicators")

    def Create_cart(self, *args: Any, **kwargs: Any) -> None:
        """Not offered: raises NotImplementedError."""
        raise _unsupported("Create_cart", "process topologies")

    def Create_graph(self, *args: Any, **kwargs: Any) -> None:
        """Not offered: raises NotImplementedError."""
        raise _unsupported("Create_graph", "process topologies")

    def Create_dist_graph(self, *args: Any, **kwargs: Any) -> None:
        """Not offered: raises NotImplementedError."""
        raise _unsupported("Create_dist_graph", "process topologies")

    def Create_dist_graph_adjacent(self, *args: Any, **kwargs: Any) -> None:
        """Not offered: raises NotImplementedError."""
        raise _unsupported("Create_dist_graph_adjacent", "process topologies")

    def Spawn(self, *args: Any, **kwargs: Any) -> None:
        """Not offered: raises NotImplementedError."""
        raise _unsupported("Spawn", "dynamic processes")

    def Accept(self, *args: Any, **kwargs: Any) -> None:
        """Not offered: raises NotImplementedError."""
        raise _unsupported("Accept", "dynamic processes")

    def Connect(self, *args: Any, **kwargs: Any) -> None:
        """Not offered: raises NotImplementedError."""
        raise _unsupported("Connect", "dynamic processes")


class Intracomm(Comm):
    """An intracommunicator (every communicator here is one)."""

    __slots__ = ()

    @classmethod
    def Create_from_group(cls, group: Group, stringtag: str = "org.mpi4py", info: Any = None,
                          errhandler: Any = None) -> Intracomm:
        """A communicator of ``group``'s processes, called by them alone."""
        world = runtime.world()
        ranks = group._members()
        if world.rank not in ranks:
            return Intracomm()
        return _made(world.new_group(list(ranks)), f"communicator of {list(ranks)}")


def _made(group: TcGroup | None, name: str) -> Intracomm:
    """A communicator on ``group`` (``COMM_NULL``'s handle when None)."""
    comm = Intracomm()
    if group is not None:
        comm._h = _Handle("made", group, name)
    return comm


def _handle_of(name: str) -> Intracomm:
    """A new handle on the predefined communicator ``name`` (unpickling a copy of it)."""
    return Intracomm(globals()[name])


def _translate_errors(cls: type) -> None:
    """Wrap every public method so tensorcomm's job errors are ``MPI.Exception``s too."""
    for klass in cls.__mro__:
        for name, value in list(vars(klass).items()):
            wrapped = hasattr(cls.__dict__.get(name), "__wrapped__") or hasattr(value, "_translates")
            if name[0] != "_" and inspect.isfunction(value) and not wrapped:
                setattr(cls, name, exceptions.translated(value))


_translate_errors(Comm)

_NULL = _Handle("null", None, "MPI_COMM_NULL")
COMM_NULL = Intracomm()
COMM_WORLD = Intracomm()
COMM_WORLD._h = _Handle("world", None, "MPI_COMM_WORLD")
COMM_SELF = Intracomm()
COMM_SELF._h = _Handle("self", None, "MPI_COMM_SELF")
