"""dma_libfabric from Python: numpy round trips through dma-kv-server and the module, and every
bad input a clear exception, never a crash."""
import mmap
import os
import signal
import threading
import time

import numpy as np
import pytest
import redis

import dma_libfabric
from dma_libfabric import kv

SIZES = [1, 4096, 1 << 20, 16 << 20, 64 << 20]


def pattern(size, seed):
    return np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8)


@pytest.mark.parametrize("size", SIZES)
def test_round_trip_is_byte_exact(server, target, size):
    client = kv.Client(server.client(), target)
    value = pattern(size, size)
    client.set(f"k{size}", value)
    out = np.zeros(size, dtype=np.uint8)
    assert client.get(f"k{size}", out) == size
    assert np.array_equal(out, value)
    # A plain GET through redis-py reads the same bytes.
    if size <= 1 << 20:
        assert server.client().get(f"k{size}") == value.tobytes()


def test_kv_cache_blocks_of_float16(server, target):
    client = kv.Client(server.client(), target)
    blocks = np.random.default_rng(7).standard_normal((4, 2, 16, 8, 64)).astype(np.float16)  # layers, k/v, ...
    for layer in range(blocks.shape[0]):
        client.set(f"block:{layer}", blocks[layer])
    loaded = np.empty_like(blocks)
    for layer in range(blocks.shape[0]):
        assert client.get(f"block:{layer}", loaded[layer]) == blocks[layer].nbytes
    assert np.array_equal(loaded.view(np.uint16), blocks.view(np.uint16))


def test_any_buffer_object(server, target):
    client = kv.Client(server.client(), target)
    client.set("ba", bytearray(b"from a bytearray"))
    client.set("by", b"from bytes, read only")  # a value is only read: a read-only buffer is fine
    out = bytearray(64)
    assert client.get("ba", out) == 16 and out[:16] == b"from a bytearray"
    view = memoryview(bytearray(64))
    assert client.get("by", view) == 21 and view[:21].tobytes() == b"from bytes, read only"
    with mmap.mmap(-1, 4096) as mapped:
        assert client.get("ba", mapped) == 16 and mapped[:16] == b"from a bytearray"


def test_bad_inputs_raise_clear_exceptions(server, target):
    client = kv.Client(server.client(), target)
    client.set("k", pattern(1000, 1))
    with pytest.raises(TypeError, match="read-only"):
        client.get("k", b"x" * 1000)
    with pytest.raises(TypeError, match="not C-contiguous"):
        client.get("k", np.zeros((100, 20), dtype=np.uint8)[:, ::2])
    with pytest.raises(TypeError, match="buffer protocol"):
        client.get("k", 12)
    with pytest.raises(kv.ServerError, match="1000 bytes") as small:
        client.get("k", np.zeros(10, dtype=np.uint8))
    assert small.value.kind == "buffer_too_small"
    with pytest.raises(kv.ServerError) as missing:
        client.get("missing", np.zeros(10, dtype=np.uint8))
    assert missing.value.kind == "no_such_key"
    with pytest.raises(ValueError, match="empty"):
        client.set("empty", np.zeros(0, dtype=np.uint8))
    # A buffer a registration holds cannot be resized under it; after the call it can.
    grow = bytearray(16)
    client.set("grow", grow)
    grow.extend(b"more")


def test_a_closed_target_refuses(server):
    target = dma_libfabric.Target(provider="tcp", bind="127.0.0.1")
    client = kv.Client(server.client(), target)
    client.set("k", pattern(100, 2))
    target.close()
    assert target.closed
    with pytest.raises(dma_libfabric.Error, match="closed") as closed:
        client.get("k", np.zeros(100, dtype=np.uint8))
    assert closed.value.code != 0 and closed.value.category == "dma"
    assert closed.value.condition == "cancelled"  # errc::shutdown


def test_a_server_that_is_gone(server, target):
    client = kv.Client(server.client(socket_timeout=5), target)
    client.set("k", pattern(100, 3))
    server.stop()
    with pytest.raises(redis.ConnectionError):
        client.get("k", np.zeros(100, dtype=np.uint8))


def test_a_server_killed_mid_transfer(server, target):
    client = kv.Client(server.client(), target)
    value = pattern(64 << 20, 4)
    client.set("big", value)
    out = np.zeros_like(value)
    failures = []

    def get_all():
        try:
            for _ in range(50):  # bounded: the kill comes within the first few
                client.get("big", out)
        except (redis.ConnectionError, kv.ServerError, dma_libfabric.Error) as error:
            failures.append(error)

    reader = threading.Thread(target=get_all)
    reader.start()
    time.sleep(0.2)
    server.kill()
    reader.join(timeout=60)
    assert not reader.is_alive()
    assert failures, "the reader saw the server die"


def test_sigint_during_a_get_raises_keyboard_interrupt(server, target):
    client = kv.Client(server.client(), target)
    client.set("k", pattern(1 << 20, 5))
    out = np.zeros(1 << 20, dtype=np.uint8)
    server.pause()  # the get waits for a reply that does not come
    timer = threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            client.get("k", out)
    finally:
        timer.cancel()
        server.resume()
    # The extension kept Python's handler: the default one raised KeyboardInterrupt above.
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_hello_again_after_nohello(server, target):
    client = kv.Client(server.client(), target)
    client.set("k", pattern(100, 6))
    client._tokens[""] = "0" * 32  # a token the server never gave: -NOHELLO, then a new DMA.HELLO
    out = np.zeros(100, dtype=np.uint8)
    assert client.get("k", out) == 100
    assert client._tokens[""] != "0" * 32


def test_batches_keep_several_keys_in_flight(server, target):
    client = kv.Client(server.client(), target)
    values = {f"batch{i}": pattern(256 << 10, 100 + i) for i in range(16)}
    client.set_many(values, concurrency=8)
    outs = [(key, np.zeros(256 << 10, dtype=np.uint8)) for key in values]
    assert client.get_many(outs, concurrency=8) == [256 << 10] * 16
    for key, out in outs:
        assert np.array_equal(out, values[key])
    with pytest.raises(kv.ServerError) as missing:
        client.get_many([("batch0", np.zeros(256 << 10, dtype=np.uint8)), ("nope", np.zeros(8, dtype=np.uint8))])
    assert missing.value.kind == "no_such_key"


def test_a_get_with_a_token_is_heard_as_a_notification(server, target):
    client = kv.Client(server.client(), target)
    client.set("k", pattern(4096, 8))
    out = np.zeros(4096, dtype=np.uint8)
    assert client.get("k", out, token=1234) == 4096
    notification = target.next_notification(timeout=20)
    assert notification is not None and notification["data"] == 1234
    assert target.next_notification(timeout=0.2) is None  # nothing more: the wait ends empty


def test_redis_cluster_routes_by_key_and_greets_each_node(cluster, target):
    client_redis, nodes = cluster
    client = kv.Client(client_redis, target)
    keys = [f"key{i}" for i in range(24)]  # spread over the three nodes' slots
    values = {key: pattern(64 << 10, i) for i, key in enumerate(keys)}
    for key, value in values.items():
        client.set(key, value)
    owners = {client_redis.get_node_from_key(key).name for key in keys}
    assert len(owners) == 3
    assert set(client._tokens) == owners  # one DMA.HELLO per node
    for key, value in values.items():
        out = np.zeros_like(value)
        assert client.get(key, out) == value.size
        assert np.array_equal(out, value)
    # Each node holds its own keys: a plain GET on the owner reads the bytes.
    owner = client_redis.get_node_from_key(keys[0])
    assert owner.redis_connection.get(keys[0]) == values[keys[0]].tobytes()


def test_the_docs_example_runs(server):
    docs = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "python.md")
    with open(docs) as f:
        text = f.read()
    example = text.split("```python\n", 1)[1].split("```", 1)[0]
    assert "port=6379" in example
    exec(compile(example.replace("port=6379", f"port={server.port}"), "docs/python.md", "exec"), {})


def test_regions_registered_once(server, target):
    client = kv.Client(server.client(), target)
    value = pattern(1 << 20, 9)
    out = np.zeros_like(value)
    value_region, out_region = target.register(value, "read"), target.register(out, "write")
    for _ in range(3):
        client.set("once", value_region)
        assert client.get("once", out_region) == value.size
        assert np.array_equal(out, value)
    value_region.close()
    with pytest.raises(ValueError, match="closed"):
        client.set("once", value_region)
    out_region.close()
