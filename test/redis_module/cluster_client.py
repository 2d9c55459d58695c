#!/usr/bin/env python3
"""A cluster client as users run one (redis-py's RedisCluster, Debian's python3-redis): it sends
DMA.HELLO to every primary, stores a value with DMA.SET routed by its key (naming the client with
the token that node's HELLO returned, and on -NOHELLO sending that node a HELLO and retrying),
then reads the value back with a plain GET, naming no node.

    cluster_client.py PORT KEY FABRIC_ADDRESS_HEX RKEY OFFSET LENGTH OUT

PORT is any node's; the value GET returns goes to the file OUT. Exits 0 once stored and read.
"""
import sys

from redis.cluster import RedisCluster
from redis.exceptions import ResponseError


def main() -> int:
    if len(sys.argv) != 8:
        print(__doc__, file=sys.stderr)
        return 2
    port, key, address, rkey, offset, length, out = sys.argv[1:]
    cluster = RedisCluster(host="127.0.0.1", port=int(port))
    tokens = {}

    def hello(node):
        reply = cluster.execute_command("DMA.HELLO", address, target_nodes=node)
        tokens[node.name] = reply[4].decode() if isinstance(reply[4], bytes) else reply[4]

    for node in cluster.get_primaries():
        hello(node)
    print(f"DMA.HELLO sent to {len(tokens)} primaries")

    for attempt in range(3):
        owner = cluster.get_node_from_key(key)
        try:
            reply = cluster.execute_command("DMA.SET", key, rkey, offset, length, "CLIENT", tokens[owner.name])
            break
        except ResponseError as error:
            if not str(error).startswith("NOHELLO") or attempt == 2:
                raise
            hello(owner)
    print(f"DMA.SET {key}: {reply!r} (slot owner {owner.name})")

    value = cluster.get(key)
    if value is None:
        print(f"GET {key}: nil", file=sys.stderr)
        return 1
    with open(out, "wb") as f:
        f.write(value)
    print(f"GET {key}: {len(value)} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
