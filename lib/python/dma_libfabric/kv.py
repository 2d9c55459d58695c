"""The side channel's client over a redis-py client: DMA.HELLO, DMA.SET and DMA.GET.

``Client(redis_client, target)`` stores a buffer's bytes under a key (``set``) and loads them
into a buffer (``get``): the server reads and writes the buffers by RMA through ``target``, and
redis-py carries the commands. The commands' arguments and the replies' shapes are the
library's own (dma::kv), not copies of them.
"""
import redis

from . import Error, _native

# redis-py strips these codes from the error text and raises a class of its own for each (the
# classes a version has: 4.3 has no OutOfMemoryError).
_CODES = {
    getattr(redis.exceptions, name): code
    for name, code in (("OutOfMemoryError", "OOM"), ("NoPermissionError", "NOPERM"), ("ReadOnlyError", "READONLY"),
                       ("BusyLoadingError", "LOADING"), ("ExecAbortError", "EXECABORT"), ("TryAgainError", "TRYAGAIN"),
                       ("ClusterDownError", "CLUSTERDOWN"))
    if hasattr(redis.exceptions, name)
}


class ServerError(Error):
    """The server refused a command: ``kind`` says which of the protocol's errors it was
    ("no_hello", "no_such_key", "buffer_too_small", "crc_mismatch", "out_of_memory", ...), and
    ``text`` is the server's text."""

    @property
    def kind(self):
        return self.args[3] if len(self.args) > 3 else "other"

    @property
    def text(self):
        return self.args[4] if len(self.args) > 4 else str(self)


def _server_text(error):
    text = str(error)
    for cls, code in _CODES.items():
        if isinstance(error, cls):
            return f"{code} {text}"
    first = text.split(" ", 1)[0]
    return text if first.isupper() and first.isalpha() else f"ERR {text}"


class Client:
    """Stores and loads buffers through a kv server, over ``redis_client`` (a ``redis.Redis``).

    The client's DMA.HELLO is sent on first use, and again when the server no longer knows it
    (``-NOHELLO``); every command names it with ``CLIENT <token>``, so whichever pooled
    connection redis-py picks, the server finds the client. ``verify`` checks each value's
    CRC-32C both ways (the server's, against the bytes that arrived).
    """

    def __init__(self, redis_client, target, verify=True):
        self._redis = redis_client
        self._target = target
        self._token = None
        self._hello_connection = None
        self.verify = verify
        self.server = None  # what the last DMA.HELLO answered

    def hello(self):
        """Sends DMA.HELLO and returns what the server said (its fabric address, this client's
        id, the largest value, how a DMA.GET is confirmed, and the client's token).

        It goes over a connection of its own, made from redis-py's pool and kept open: a
        connection takes one DMA.HELLO, and the binding it makes lives while it is open. The
        commands then name it with ``CLIENT <token>`` over any pooled connection."""
        arguments = _native.hello_arguments(self._target.address)
        connection = self._redis.connection_pool.make_connection()
        try:
            connection.send_command(*arguments)
            reply = connection.read_response()
        except redis.ResponseError as error:
            connection.disconnect()
            raise self._server_error("DMA.HELLO", error) from None
        except BaseException:
            connection.disconnect()
            raise
        self.server = _native.read_hello_reply(reply)
        self._token = self.server["token"]
        if self._hello_connection is not None:
            self._hello_connection.disconnect()
        self._hello_connection = connection
        return self.server

    def close(self):
        """Closes the DMA.HELLO connection; the server lets the binding go once idle."""
        if self._hello_connection is not None:
            self._hello_connection.disconnect()
            self._hello_connection = None
        self._token = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def set(self, key, value):
        """Stores the bytes of ``value`` (any C-contiguous buffer) under ``key``."""
        region = self._target.register(value, "read")
        try:
            length = region.length
            crc = _native.checksum(value, length) if self.verify else None
            reply = self._command(lambda token: _native.set_arguments(key, region, length, crc, token))
        finally:
            region.close()
        if reply not in (b"OK", "OK", True):
            raise Error(f"DMA.SET {key!r}: unexpected reply {reply!r}")

    def get(self, key, out):
        """Loads the value of ``key`` into ``out`` (a writable, C-contiguous buffer at least as
        large as the value) and returns its length in bytes."""
        region = self._target.register(out, "write")
        try:
            capacity = region.length
            reply = self._command(lambda token: _native.get_arguments(key, region, capacity, None, token))
        finally:
            region.close()
        length, crc = _native.read_get_reply(reply)
        if self.verify and length and _native.checksum(out, length) != crc:
            raise Error(f"DMA.GET {key!r}: the {length} bytes that arrived do not have the server's crc32c {crc}")
        return length

    def _command(self, build):
        for attempt in (0, 1):
            if self._token is None:
                self.hello()
            arguments = build(self._token)
            try:
                return self._redis.execute_command(*arguments)
            except redis.ResponseError as error:
                failure = self._server_error(arguments[0].decode(), error)
                if failure.kind == "no_hello" and attempt == 0:
                    self._token = None  # the server let the binding go: HELLO again, once
                    continue
                raise failure from None

    @staticmethod
    def _server_error(command, error):
        text = _server_text(error)
        kind = _native.classify_error(text)
        return ServerError(f"{command}: {text}", 0, "", kind, text)
