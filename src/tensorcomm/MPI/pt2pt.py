"""The point-to-point methods of a communicator (``Send``/``Recv`` on buffers, ``send``/``recv``
on objects, probes, persistent sends and receives, matched-probe ``Message``), over the
communicator's matching ``p2p.Engine``. Ranks are communicator ranks. Imports the MPI
package's ``p2p``, ``buffers``, ``request``, ``status``, ``constants`` and ``exceptions``."""

from __future__ import annotations

import pickle
import warnings
from typing import Any

import numpy as np

from ..errors import CommError
from . import exceptions
from .buffers import message
from .constants import ANY_SOURCE, ANY_TAG, PROC_NULL
from .messages import Envelope, Receive, Send, check_tag
from .p2p import Engine
from .request import Pending, Prequest, Request, finish_pending
from .status import Status

_U8 = np.dtype(np.uint8)


def _request(pending: Pending) -> Request:
    request = Request()
    request._pending = pending
    return request


def _completed(pending: Pending, status: Status | None = None) -> Any:
    """What a blocking call returns: ``pending`` finished (``Request.wait`` without the handle)."""
    result = finish_pending(pending)
    if status is not None:
        pending.describe(status)
    return result


_UNPICKLABLE = (pickle.PicklingError, TypeError, AttributeError)
_PROTOCOL = pickle.HIGHEST_PROTOCOL
_dumps = pickle.dumps


def _unpicklable(fn: str, exc: BaseException) -> TypeError:
    return TypeError(f"{fn}: the object cannot be pickled: {exc}")


def _pickled(obj: Any, fn: str) -> bytes:
    try:
        return _dumps(obj, _PROTOCOL)
    except _UNPICKLABLE as exc:
        raise _unpicklable(fn, exc) from exc


class Message:
    """A message taken by a matched probe (``Mprobe``/``mprobe``), received with its own
    ``Recv``/``recv``; ``Message()`` is ``MESSAGE_NULL``."""

    __slots__ = ("_engine", "_envelope")

    def __init__(self, message: Message | None = None) -> None:
        self._engine: Engine | None = None if message is None else message._engine
        self._envelope: Envelope | None = None if message is None else message._envelope

    def __bool__(self) -> bool:
        return self._envelope is not None

    def _take(self, buffer: np.ndarray | None) -> Receive:
        if self._engine is None or self._envelope is None:
            if self._envelope is None and self._engine is not None:  # MESSAGE_NO_PROC
                return Receive(None, PROC_NULL, ANY_TAG, buffer)
            raise exceptions.error(exceptions.ERR_REQUEST, "the message was received already")
        receive = self._engine.receive_envelope(self._envelope, buffer)
        self._engine = self._envelope = None
        return receive

    def Recv(self, buf: Any, status: Status | None = None) -> None:
        """Receive the message into ``buf``."""
        _request(self._take(_bytes(buf, "Message.Recv"))).Wait(status)

    def Irecv(self, buf: Any) -> Request:
        """Start receiving the message into ``buf``."""
        return _request(self._take(_bytes(buf, "Message.Irecv")))

    def recv(self, status: Status | None = None) -> Any:
        """Receive the message's object."""
        return _request(self._take(None)).wait(status)

    def irecv(self) -> Request:
        """Start receiving the message's object."""
        return _request(self._take(None))


def _bytes(buf: Any, fn: str) -> np.ndarray:
    return message(buf, fn, True).array.view(_U8)


class PointToPoint:
    """Mixin of ``Comm``: point-to-point calls. ``_engine()`` is the communicator's matching
    engine, ``_size()`` its size."""

    def _engine(self) -> Engine:
        raise NotImplementedError

    def _size(self) -> int:
        raise NotImplementedError

    def _peer(self, rank: Any, argument: str, fn: str, wildcard: bool, size: int = -1) -> int:
        """``rank`` checked as a peer of this communicator of ``size`` members (-1: look it up)."""
        if size < 0:
            size = self._size()
        if type(rank) is not int:
            if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)):
                raise TypeError(f"{fn}: {argument} must be an int, got {type(rank).__name__}")
            rank = int(rank)
        if rank == PROC_NULL or (wildcard and rank == ANY_SOURCE) or 0 <= rank < size:
            return rank
        raise exceptions.error(exceptions.ERR_RANK, f"{fn}: {argument} {rank} is not a rank of a "
                               f"communicator of {size}")

    # -- the one path of each direction -------------------------------------------------------

    def _send(self, data: np.ndarray | bytes, dest: Any, tag: Any, fn: str, keep: Any = None) -> Pending:
        engine = self._engine()
        rank = self._peer(dest, "dest", fn, False, engine.size)
        checked = check_tag(tag, fn, False)
        if rank == PROC_NULL:
            return Send(None, [])
        return engine.send(data, rank, checked, keep, fn.lower().startswith(("ssend", "issend")))

    def _recv(self, buffer: np.ndarray | None, source: Any, tag: Any, fn: str) -> Receive:
        engine = self._engine()
        rank = self._peer(source, "source", fn, True, engine.size)
        checked = check_tag(tag, fn, True)
        if rank == PROC_NULL:
            return Receive(None, PROC_NULL, ANY_TAG, buffer)
        return engine.receive(buffer, rank, checked)

    def _send_buffer(self, buf: Any, dest: Any, tag: Any, fn: str) -> Pending:
        return self._send(message(buf, fn, False).array.view(_U8), dest, tag, fn, buf)

    def _recv_buffer(self, buf: Any, source: Any, tag: Any, fn: str) -> Receive:
        return self._recv(_bytes(buf, fn), source, tag, fn)

    # -- buffers --------------------------------------------------------------------------------

    def Send(self, buf: Any, dest: int, tag: int = 0) -> None:
        """Send ``buf`` to ``dest``."""
        _completed(self._send_buffer(buf, dest, tag, "Send"))

    def Ssend(self, buf: Any, dest: int, tag: int = 0) -> None:
        """Send ``buf`` to ``dest``; return once a receive has matched it."""
        _request(self._send_buffer(buf, dest, tag, "Ssend")).Wait()

    Bsend = Send
    Rsend = Send

    def Isend(self, buf: Any, dest: int, tag: int = 0) -> Request:
        """Start sending ``buf`` to ``dest``."""
        return _request(self._send_buffer(buf, dest, tag, "Isend"))

    def Issend(self, buf: Any, dest: int, tag: int = 0) -> Request:
        """Start a synchronous send: done once a receive has matched it."""
        return _request(self._send_buffer(buf, dest, tag, "Issend"))

    Ibsend = Isend
    Irsend = Isend

    def Recv(self, buf: Any, source: int = ANY_SOURCE, tag: int = ANY_TAG,
             status: Status | None = None) -> None:
        """Receive into ``buf`` a message from ``source`` with ``tag`` (wildcards allowed)."""
        _completed(self._recv_buffer(buf, source, tag, "Recv"), status)

    def Irecv(self, buf: Any, source: int = ANY_SOURCE, tag: int = ANY_TAG) -> Request:
        """Start receiving into ``buf``."""
        return _request(self._recv_buffer(buf, source, tag, "Irecv"))

    def Sendrecv(self, sendbuf: Any, dest: int, sendtag: int = 0, recvbuf: Any = None,
                 source: int = ANY_SOURCE, recvtag: int = ANY_TAG, status: Status | None = None) -> None:
        """Send ``sendbuf`` to ``dest`` and receive into ``recvbuf`` from ``source``."""
        receive = self._recv_buffer(recvbuf, source, recvtag, "Sendrecv")
        send = _request(self._send_buffer(sendbuf, dest, sendtag, "Sendrecv"))
        _request(receive).Wait(status)
        send.Wait()

    def Isendrecv(self, sendbuf: Any, dest: int, sendtag: int = 0, recvbuf: Any = None,
                  source: int = ANY_SOURCE, recvtag: int = ANY_TAG) -> Request:
        """Nonblocking ``Sendrecv``."""
        receive = self._recv_buffer(recvbuf, source, recvtag, "Isendrecv")
        self._send_buffer(sendbuf, dest, sendtag, "Isendrecv")
        return _request(receive)

    def Isendrecv_replace(self, buf: Any, dest: int, sendtag: int = 0, source: int = ANY_SOURCE,
                          recvtag: int = ANY_TAG) -> Request:
        """Nonblocking ``Sendrecv_replace``."""
        data = message(buf, "Isendrecv_replace", True).array.view(_U8)
        self._send(data.copy(), dest, sendtag, "Isendrecv_replace")
        return _request(self._recv(data, source, recvtag, "Isendrecv_replace"))

    def Sendrecv_replace(self, buf: Any, dest: int, sendtag: int = 0, source: int = ANY_SOURCE,
                         recvtag: int = ANY_TAG, status: Status | None = None) -> None:
        """Send ``buf`` to ``dest``, then receive into it from ``source``."""
        data = message(buf, "Sendrecv_replace", True).array.view(_U8)
        send = _request(self._send(data.copy(), dest, sendtag, "Sendrecv_replace"))
        _request(self._recv(data, source, recvtag, "Sendrecv_replace")).Wait(status)
        send.Wait()

    def Send_init(self, buf: Any, dest: int, tag: int = 0) -> Prequest:
        """Persistent ``Send``: each ``Start`` sends ``buf`` as it is then."""
        self._peer(dest, "dest", "Send_init", False)
        check_tag(tag, "Send_init", False)
        return Prequest._made(lambda: self._send_buffer(buf, dest, tag, "Send_init"))

    def Ssend_init(self, buf: Any, dest: int, tag: int = 0) -> Prequest:
        """Persistent ``Ssend``."""
        self._peer(dest, "dest", "Ssend_init", False)
        check_tag(tag, "Ssend_init", False)
        return Prequest._made(lambda: self._send_buffer(buf, dest, tag, "Ssend_init"))

    Bsend_init = Send_init
    Rsend_init = Send_init

    def Recv_init(self, buf: Any, source: int = ANY_SOURCE, tag: int = ANY_TAG) -> Prequest:
        """Persistent ``Recv``: each ``Start`` posts a receive into ``buf``."""
        self._peer(source, "source", "Recv_init", True)
        check_tag(tag, "Recv_init", True)
        return Prequest._made(lambda: self._recv_buffer(buf, source, tag, "Recv_init"))

    # -- probes -------------------------------------------------------------------------------

    def _probe(self, source: Any, tag: Any, fn: str, block: bool, take: bool) -> tuple[Envelope | None, bool]:
        rank = self._peer(source, "source", fn, True)
        checked = check_tag(tag, fn, True)
        if rank == PROC_NULL:
            return None, True
        engine = self._engine()
        found = engine.probe(rank, checked, take)
        if found is None and block:
            box: list[Envelope] = []

            def ready() -> bool:
                hit = engine.probe(rank, checked, take)
                if hit is not None:
                    box.append(hit)
                return hit is not None
            engine.wait_for(ready, rank)
            found = box[0]
        return found, found is not None

    @staticmethod
    def _describe(envelope: Envelope | None, status: Status | None) -> None:
        if status is not None:
            if envelope is None:
                status._set(PROC_NULL, ANY_TAG, 0)
            else:
                status._set(envelope.source, envelope.tag, envelope.nbytes)

    def Probe(self, source: int = ANY_SOURCE, tag: int = ANY_TAG, status: Status | None = None) -> bool:
        """Wait for a message that fits and describe it in ``status`` (it stays unreceived)."""
        envelope, _ = self._probe(source, tag, "Probe", True, False)
        self._describe(envelope, status)
        return True

    probe = Probe

    def Iprobe(self, source: int = ANY_SOURCE, tag: int = ANY_TAG, status: Status | None = None) -> bool:
        """Whether a message that fits has arrived (described in ``status`` if so)."""
        envelope, found = self._probe(source, tag, "Iprobe", False, False)
        if found:
            self._describe(envelope, status)
        return found

    iprobe = Iprobe

    def _message(self, envelope: Envelope | None) -> Message:
        found = Message()
        found._engine = self._engine() if envelope is not None else None
        found._envelope = envelope
        if envelope is None:  # from PROC_NULL: MESSAGE_NO_PROC
            found._engine = self._engine()
        return found

    def Mprobe(self, source: int = ANY_SOURCE, tag: int = ANY_TAG, status: Status | None = None) -> Message:
        """Wait for a message that fits and take it (only the returned ``Message`` receives it)."""
        envelope, _ = self._probe(source, tag, "Mprobe", True, True)
        self._describe(envelope, status)
        return self._message(envelope)

    mprobe = Mprobe

    def Improbe(self, source: int = ANY_SOURCE, tag: int = ANY_TAG,
                status: Status | None = None) -> Message | None:
        """``Mprobe`` without waiting: None when no message fits yet."""
        envelope, found = self._probe(source, tag, "Improbe", False, True)
        if not found:
            return None
        self._describe(envelope, status)
        return self._message(envelope)

    improbe = Improbe

    # -- objects --------------------------------------------------------------------------------

    def send(self, obj: Any, dest: int, tag: int = 0) -> None:
        """Send the picklable ``obj`` to ``dest``."""
        try:
            data = _dumps(obj, _PROTOCOL)  # ``_pickled`` written out: one frame less on the way
        except _UNPICKLABLE as exc:
            raise _unpicklable("send", exc) from exc
        try:
            if not self._engine().post(data, dest, tag):
                _completed(self._send(data, dest, tag, "send"))
        except CommError as exc:
            raise exceptions.as_mpi(exc) from None

    send._translates = True  # type: ignore[attr-defined]

    def ssend(self, obj: Any, dest: int, tag: int = 0) -> None:
        """Send ``obj``; return once a receive has matched it."""
        _request(self._send(_pickled(obj, "ssend"), dest, tag, "ssend")).Wait()

    bsend = send

    def isend(self, obj: Any, dest: int, tag: int = 0) -> Request:
        """Start sending the picklable ``obj`` to ``dest``."""
        return _request(self._send(_pickled(obj, "isend"), dest, tag, "isend"))

    def issend(self, obj: Any, dest: int, tag: int = 0) -> Request:
        """Start a synchronous send of ``obj``."""
        return _request(self._send(_pickled(obj, "issend"), dest, tag, "issend"))

    ibsend = isend

    def recv(self, buf: Any = None, source: int = ANY_SOURCE, tag: int = ANY_TAG,
             status: Status | None = None) -> Any:
        """Receive an object from ``source`` with ``tag``. **Unpickles what the sender sent**:
        use among trusted processes only."""
        if buf is not None:
            warnings.warn("recv: the buf argument is ignored (objects are received whole)",
                          UserWarning, stacklevel=2)
        try:
            taken = self._engine().receive_object(source, tag)
            if taken is None:
                return _completed(self._recv(None, source, tag, "recv"), status)
        except CommError as exc:
            raise exceptions.as_mpi(exc) from None
        value, tag, nbytes = taken
        if status is not None:
            status._set(source, tag, nbytes)
        return value

    recv._translates = True  # type: ignore[attr-defined]

    def irecv(self, buf: Any = None, source: int = ANY_SOURCE, tag: int = ANY_TAG) -> Request:
        """Start receiving an object; ``wait()`` returns it."""
        return _request(self._recv(None, source, tag, "irecv"))

    def sendrecv(self, sendobj: Any, dest: int, sendtag: int = 0, recvbuf: Any = None,
                 source: int = ANY_SOURCE, recvtag: int = ANY_TAG, status: Status | None = None) -> Any:
        """Send ``sendobj`` to ``dest`` and receive an object from ``source``."""
        receive = self._recv(None, source, recvtag, "sendrecv")
        send = _request(self._send(_pickled(sendobj, "sendrecv"), dest, sendtag, "sendrecv"))
        value = _request(receive).wait(status)
        send.Wait()
        return value

    def send_init(self, obj: Any, dest: int, tag: int = 0) -> Prequest:
        """Persistent ``send`` of ``obj`` (pickled again at each ``Start``)."""
        return Prequest._made(lambda: self._send(_pickled(obj, "send_init"), dest, tag, "send_init"))

    def recv_init(self, buf: Any = None, source: int = ANY_SOURCE, tag: int = ANY_TAG) -> Prequest:
        """Persistent ``recv``."""
        return Prequest._made(lambda: self._recv(None, source, tag, "recv_init"))
