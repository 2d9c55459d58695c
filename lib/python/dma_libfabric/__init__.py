"""dma-libfabric for Python: the passive side of the side channel.

A ``Target`` exposes Python buffers (numpy arrays, bytearrays, memoryviews, mmaps) to a server
that reads and writes them by RMA, without a copy; ``dma_libfabric.kv.Client`` stores and loads
them through a kv server (``dma-kv-server``, or the module in redis-server/Valkey) over the
redis-py client the application already has. See docs/python.md.
"""


class Error(RuntimeError):
    """A failure of the library or of the side channel: ``args`` are the message, the library's
    error code (0 when none), its category's name ("dma", "libfabric", "generic"; "" when
    none), and the library's error condition it belongs to ("peer_unreachable",
    "connection_lost", "cancelled", "invalid_operand", "remote_access_denied",
    "invalid_advertisement"; "" when none)."""

    @property
    def code(self):
        return self.args[1] if len(self.args) > 1 else 0

    @property
    def category(self):
        return self.args[2] if len(self.args) > 2 else ""

    @property
    def condition(self):
        return self.args[3] if len(self.args) > 3 else ""

    def __str__(self):
        return str(self.args[0]) if self.args else ""


from . import _native  # noqa: E402

_native._set_error_class(Error)
version = _native.version


def _toml_value(value):
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"a configuration value is a bool, number, string or list, not {type(value).__name__}")


class Target:
    """The passive side: an endpoint on a thread of its own whose buffers a server reaches.

    ``Target(provider="tcp", bind="127.0.0.1")``, ``Target(config="dma.toml")``, or any keys of
    the ``[dma-libfabric]`` table as keywords (``Target(wait_mode="fd")``): the same keys as every
    other part of the library (docs/configuration.md). Use it as a context manager, or close().
    """

    def __init__(self, provider=None, bind=None, config=None, **keys):
        if provider is not None:
            keys["providers"] = [provider]
        if bind is not None:
            keys["bind"] = bind
        if config is not None and keys:
            raise ValueError("give either config (a TOML file) or keyword keys, not both")
        text = None
        if config is None:
            text = "[dma-libfabric]\n" + "".join(f"{k} = {_toml_value(v)}\n" for k, v in keys.items())
        self._native = _native.Target(config, text)

    def register(self, buffer, access="read_write"):
        """Exposes ``buffer`` (C-contiguous, and writable unless ``access="read"``) without a
        copy; the Region keeps it alive, and a bytearray unresizable, until closed."""
        return _native.Target.expose(self._native, buffer, access)

    @property
    def address(self):
        """The fabric address, raw bytes."""
        return self._native.address

    @property
    def address_hex(self):
        """The fabric address as DMA.HELLO and advertisements carry it."""
        return self._native.address_hex

    @property
    def closed(self):
        return self._native.closed

    def next_notification(self, timeout=None):
        """The next write that carried immediate data, as ``{"data": int, "length": int or
        None}``, or None when ``timeout`` seconds pass first (None: waits for ever). Ctrl-C
        interrupts the wait."""
        return self._native.next_notification(timeout)

    def notifications(self, timeout=None):
        """Iterates over the write notifications until one does not come within ``timeout``."""
        while (notification := self.next_notification(timeout)) is not None:
            yield notification

    def close(self):
        """Closes the endpoint: no server can reach its buffers from then on."""
        self._native.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


Region = _native.Region
checksum = _native.checksum

from . import kv  # noqa: E402,F401
