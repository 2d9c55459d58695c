"""Servers for the Python suite, each started on a free 127.0.0.1 port and stopped by its PID:
dma-kv-server ($DMA_KV_SERVER) and redis-server with the module ($DMA_MODULE; $DMA_MODULE_SERVER
names another server, Valkey for one)."""
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time

import pytest
import redis

MAX_VALUE = 64 << 20


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_cluster_port():
    """A free port whose cluster bus port (+10000) is free too (at most 100 tries)."""
    for _ in range(100):
        port = free_port()
        if port + 10000 > 65535:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        return port
    raise RuntimeError("no free port pair for a cluster node")


class Server:
    def __init__(self, name, args, port, log):
        self.name, self.port, self.log = name, port, log
        self.process = subprocess.Popen(args, stdout=subprocess.PIPE if port is None else subprocess.DEVNULL,
                                        stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + 20
        if port is None:  # dma-kv-server --port 0 prints the port it listens on
            line = self.process.stdout.readline()
            match = re.match(r"listening on 127\.0\.0\.1:(\d+)", line)
            if not match:
                self.stop()
                raise RuntimeError(f"{name} did not start: {line!r}")
            self.port = int(match.group(1))
        while time.monotonic() < deadline:
            try:
                if redis.Redis(port=self.port, socket_timeout=1).ping():
                    return
            except redis.ConnectionError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"{name} did not answer PING within 20 s; log: {log}")

    def client(self, **options):
        return redis.Redis(port=self.port, **{"socket_timeout": 60, **options})

    def pause(self):
        os.kill(self.process.pid, signal.SIGSTOP)

    def resume(self):
        os.kill(self.process.pid, signal.SIGCONT)

    def kill(self):
        os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=20)

    def stop(self):
        if self.process.poll() is None:
            self.resume()
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=20)


def kv_server():
    program = os.environ.get("DMA_KV_SERVER")
    if not program:
        pytest.skip("DMA_KV_SERVER is not set")
    return Server("dma-kv-server", [program, "--port", "0", "--max-value", str(MAX_VALUE)], None, None)


def module_server(scratch):
    module = os.environ.get("DMA_MODULE")
    program = os.environ.get("DMA_MODULE_SERVER") or shutil.which("redis-server")
    if not module or not program:
        pytest.skip("DMA_MODULE or redis-server is missing")
    port = free_port()
    log = os.path.join(scratch, "server.log")
    return Server(os.path.basename(program),
                  [program, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                   "--dir", scratch, "--logfile", log, "--loadmodule", module, "max-value", str(MAX_VALUE)],
                  port, log)


@pytest.fixture(params=["dma-kv-server", "module"])
def server(request):
    with tempfile.TemporaryDirectory() as scratch:
        started = kv_server() if request.param == "dma-kv-server" else module_server(scratch)
        try:
            yield started
        finally:
            started.stop()


@pytest.fixture
def target():
    import dma_libfabric

    with dma_libfabric.Target(provider="tcp", bind="127.0.0.1") as opened:
        yield opened


@pytest.fixture
def cluster():
    """Three primaries with the module on loopback, their slots assigned by redis-cli --cluster
    create; a redis.cluster.RedisCluster over them, given one node."""
    module = os.environ.get("DMA_MODULE")
    program = os.environ.get("DMA_MODULE_SERVER") or shutil.which("redis-server")
    if not module or not program or not shutil.which("redis-cli"):
        pytest.skip("DMA_MODULE, redis-server or redis-cli is missing")
    from redis.cluster import RedisCluster

    with tempfile.TemporaryDirectory() as scratch:
        nodes = []
        try:
            for i in range(3):
                port = free_cluster_port()
                folder = os.path.join(scratch, str(i))
                os.mkdir(folder)
                log = os.path.join(folder, "server.log")
                nodes.append(Server(f"node{i}", [program, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                                                 "--appendonly", "no", "--dir", folder, "--logfile", log,
                                                 "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                                                 "--loadmodule", module, "max-value", str(MAX_VALUE)], port, log))
            subprocess.run(["redis-cli", "--cluster", "create", *[f"127.0.0.1:{n.port}" for n in nodes],
                            "--cluster-yes"], check=True, capture_output=True, timeout=60)
            deadline = time.monotonic() + 30
            while any(b"cluster_state:ok" not in n.client().execute_command("CLUSTER", "INFO") for n in nodes):
                if time.monotonic() > deadline:
                    raise RuntimeError("the cluster did not reach cluster_state:ok within 30 s")
                time.sleep(0.1)
            client = RedisCluster(host="127.0.0.1", port=nodes[0].port, socket_timeout=60)
            yield client, nodes
            client.close()
        finally:
            for node in nodes:
                node.stop()
