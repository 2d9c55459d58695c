"""The side channel's client over a redis-py client: DMA.HELLO, DMA.SET and DMA.GET.

``Client(redis_client, target)`` stores a buffer's bytes under a key (``set``) and loads them
into a buffer (``get``): the server reads and writes the buffers by RMA through ``target``, and
redis-py carries the commands. The commands' arguments and the replies' shapes are the
library's own (dma::kv), not copies of them.
"""
import concurrent.futures
import threading

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
        return self.args[4] if len(self.args) > 4 else "other"

    @property
    def text(self):
        return self.args[5] if len(self.args) > 5 else str(self)


def _server_text(error):
    text = str(error)
    for cls, code in _CODES.items():
        if isinstance(error, cls):
            return f"{code} {text}"
    first = text.split(" ", 1)[0]
    return text if first.isupper() and first.isalpha() else f"ERR {text}"


class Client:
    """Stores and loads buffers through a kv server, over ``redis_client``: a ``redis.Redis``,
    or a ``redis.cluster.RedisCluster`` (which routes DMA.SET and DMA.GET by their key, as the
    servers' COMMAND describes them).

    The client's DMA.HELLO is sent to a node on first use there, and again when the node no
    longer knows it (``-NOHELLO``: a restart, an idle binding let go, or a slot that moved to a
    node not yet greeted); every command names it with ``CLIENT <token>``, so whichever pooled
    connection redis-py picks, the node finds the client. ``verify`` checks each value's CRC-32C
    both ways (the server's, against the bytes that arrived).
    """

    def __init__(self, redis_client, target, verify=True):
        self._redis = redis_client
        self._target = target
        self._cluster = hasattr(redis_client, "get_node_from_key")
        self._tokens = {}  # node name (host:port, or "" for one server) -> token
        self._hello_connections = {}
        self._hello_lock = threading.Lock()
        self.verify = verify
        self.server = None  # what the last DMA.HELLO answered

    def hello(self, node=None):
        """Sends DMA.HELLO and returns what the server said (its fabric address, this client's
        id, the largest value, how a DMA.GET is confirmed, and the client's token). ``node`` is a
        cluster node (redis-py's ClusterNode); a cluster client needs one.

        It goes over a connection of its own, made from redis-py's pool and kept open: a
        connection takes one DMA.HELLO, and the binding it makes lives while it is open. The
        commands then name it with ``CLIENT <token>`` over any pooled connection."""
        arguments = _native.hello_arguments(self._target.address)
        if self._cluster and node is None:
            raise ValueError("a cluster client sends DMA.HELLO to a node: name one")
        pool = (node.redis_connection if node is not None else self._redis).connection_pool
        name = node.name if node is not None else ""
        connection = pool.make_connection()
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
        self._tokens[name] = self.server["token"]
        old = self._hello_connections.pop(name, None)
        if old is not None:
            old.disconnect()
        self._hello_connections[name] = connection
        return self.server

    def close(self):
        """Closes the DMA.HELLO connections; the servers let the bindings go once idle."""
        for connection in self._hello_connections.values():
            connection.disconnect()
        self._hello_connections.clear()
        self._tokens.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def set(self, key, value):
        """Stores the bytes of ``value`` under ``key``: any C-contiguous buffer (registered for
        this call), or a Region the application registered once (Target.register), whose whole
        buffer is the value."""
        region, owned = self._region(value, "read")
        try:
            length = region.length
            crc = _native.checksum(region.memory, length) if self.verify else None
            reply = self._command(key, lambda client: _native.set_arguments(key, region, length, crc, client))
        finally:
            if owned:
                region.close()
        if reply not in (b"OK", "OK", True):
            raise Error(f"DMA.SET {key!r}: unexpected reply {reply!r}")

    def get(self, key, out, token=None):
        """Loads the value of ``key`` into ``out`` (a writable, C-contiguous buffer at least as
        large as the value, or a Region registered once with write access) and returns its
        length in bytes. With ``token`` (an integer below
        2**32) the server's write carries it as immediate data: the Target hears it
        (Target.next_notification) once the bytes have landed."""
        region, owned = self._region(out, "write")
        try:
            capacity = region.length
            reply = self._command(key, lambda client: _native.get_arguments(key, region, capacity, token, client))
            length, crc = _native.read_get_reply(reply)
            landed = _native.checksum(region.memory, length) if self.verify and length else crc
        finally:
            if owned:
                region.close()
        if landed != crc:
            raise Error(f"DMA.GET {key!r}: the {length} bytes that arrived do not have the server's crc32c {crc}")
        return length

    def _region(self, buffer, access):
        if isinstance(buffer, _native.Region):
            if buffer.closed:
                raise ValueError("the region is closed")
            return buffer, False
        return self._target.register(buffer, access), True

    def set_many(self, items, concurrency=8):
        """Stores several values at once: ``items`` is a dict or (key, value) pairs. Up to
        ``concurrency`` keys are in flight, each on a pooled connection of its own (a server
        serves one connection's commands in turn), with the GIL released while they wait.
        Raises the first failure after every started one has ended."""
        pairs = list(items.items()) if isinstance(items, dict) else list(items)
        self._batch(lambda pair: self.set(*pair), pairs, concurrency)

    def get_many(self, items, concurrency=8):
        """Loads several values at once: ``items`` is (key, out) pairs; returns their lengths,
        in order. As set_many for concurrency and failures."""
        return self._batch(lambda pair: self.get(*pair), list(items), concurrency)

    @staticmethod
    def _batch(one, items, concurrency):
        if not items:
            return []
        if concurrency < 1:
            raise ValueError("concurrency is at least 1")
        pool = concurrent.futures.ThreadPoolExecutor(max_workers=min(concurrency, len(items)))
        try:
            futures = [pool.submit(one, item) for item in items]
            concurrent.futures.wait(futures)
        except BaseException:  # Ctrl-C: what has not started does not start
            pool.shutdown(wait=True, cancel_futures=True)
            raise
        pool.shutdown(wait=True)
        for future in futures:
            if future.exception() is not None:
                raise future.exception()
        return [future.result() for future in futures]

    def _token_for(self, key):
        """The node `key` lives on (None for one server) and this client's token there."""
        node = self._redis.get_node_from_key(key) if self._cluster else None
        name = node.name if node is not None else ""
        with self._hello_lock:
            if name not in self._tokens:
                self.hello(node)
            return name, self._tokens[name]

    def _command(self, key, build):
        for attempt in (0, 1):
            name, token = self._token_for(key)
            command, *arguments = build(token)
            command = command.decode()  # redis-py's cluster routing looks the name up as text
            try:
                return self._redis.execute_command(command, *arguments)
            except redis.ResponseError as error:
                failure = self._server_error(command, error)
                if failure.kind == "no_hello" and attempt == 0:
                    # The node let the binding go (HELLO it again), or the slot moved to a node not
                    # yet greeted (redis-py followed -MOVED: HELLO that one); once.
                    now = self._redis.get_node_from_key(key).name if self._cluster else ""
                    with self._hello_lock:
                        if now == name and self._tokens.get(name) == token:
                            del self._tokens[name]
                    continue
                raise failure from None

    @staticmethod
    def _server_error(command, error):
        text = _server_text(error)
        kind = _native.classify_error(text)
        return ServerError(f"{command}: {text}", 0, "", "", kind, text)
