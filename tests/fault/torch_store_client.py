"""A client of torch's TCPStore in the standard library only, as text for a stranger's script.

The stranger tests run it as ``nobody`` with ``python -c``, so it is source to put in front of
a script, not a module to import. torch's protocol: little-endian; strings as a u64 length and
the bytes; query types VALIDATE=0 SET=1 GET=3 LIST_KEYS=17; a validation magic after connecting.
"""

CLIENT = '''
import socket, struct, time

def pack(data):
    return struct.pack("<Q", len(data)) + data

def recv(sock, n):
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise EOFError("torch's store closed the connection")
        data += chunk
    return data

def text(sock):
    return recv(sock, struct.unpack("<Q", recv(sock, 8))[0])

def connect(port):
    """A validated connection to the store on loopback ``port`` (retried for 30 s)."""
    deadline = time.monotonic() + 30
    while True:
        try:
            sock = socket.create_connection(("127.0.0.1", port), timeout=10)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    sock.sendall(b"\\x00" + struct.pack("<I", 0x3C85F7CE))
    return sock

def keys(sock):
    sock.sendall(b"\\x11")
    return [text(sock).decode() for _ in range(struct.unpack("<Q", recv(sock, 8))[0])]

def get(sock, key):
    sock.sendall(b"\\x03" + pack(key.encode()))
    return text(sock)

def put(sock, key, value):
    sock.sendall(b"\\x01" + pack(key.encode()) + pack(value))
'''
