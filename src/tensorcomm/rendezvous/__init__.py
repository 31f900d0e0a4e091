"""Who is in the job and how to reach them: stores, the job secret, environment discovery, init URLs.

Layer rule: imports ``config`` and ``errors`` only; ``core`` and ``launch`` import this package.
"""

from tensorcomm.rendezvous.auth import (
    generate_secret,
    handshake_client,
    handshake_server,
    recv_exact,
    secret_bytes,
)
from tensorcomm.rendezvous.discovery import JobInfo, discover
from tensorcomm.rendezvous.init_method import Rendezvous, register_scheme, rendezvous
from tensorcomm.rendezvous.store import FileStore, HashStore, PrefixStore, Store
from tensorcomm.rendezvous.tcp_store import TCPStore, TCPStoreServer

__all__ = [
    "FileStore",
    "HashStore",
    "JobInfo",
    "PrefixStore",
    "Rendezvous",
    "Store",
    "TCPStore",
    "TCPStoreServer",
    "discover",
    "generate_secret",
    "handshake_client",
    "handshake_server",
    "recv_exact",
    "register_scheme",
    "rendezvous",
    "secret_bytes",
]
