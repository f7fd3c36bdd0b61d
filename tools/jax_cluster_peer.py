"""One process of a `maxrs cluster-check` job, written with JAX's own distributed client.

`tools/jax_cluster_interop` runs it next to maxrs processes: with a maxrs coordinator (JAX as
process 1) and with JAX's coordinator (JAX as process 0, started by
`jax.distributed.initialize(process_id=0)`). It follows cluster-check's protocol (src/cluster/
check.rs): publish this host under `cluster_check/hosts/<rank>`, increment
`cluster_check/arrived`, blocking-get every host, barrier, directory get, try-get the counter,
two more barriers, shut down. Any mismatch raises, so the exit status is the verdict.

usage: python jax_cluster_peer.py ADDRESS NUM_PROCESSES RANK [HOLD_SECONDS]

With HOLD_SECONDS it stays registered that long after the reads (for failure tests).
"""

import json
import os
import socket
import sys
import time

import jax
from jax._src import distributed


def main():
    address, num_processes, rank = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    hold = float(sys.argv[4]) if len(sys.argv) > 4 else 0.0
    jax.distributed.initialize(
        coordinator_address=address,
        num_processes=num_processes,
        process_id=rank,
        initialization_timeout=60,
        heartbeat_timeout_seconds=10,
        shutdown_timeout_seconds=60,
    )
    client = distributed.global_state.client
    timeout_ms = 60_000
    me = {
        "rank": rank,
        "hostname": socket.gethostname(),
        "pid": os.getpid(),
        "platform": "jax",
        # Not jax.local_devices(): JAX's CPU backend of a multi-process job would wait for
        # process 0 to publish a JAX CPU topology, which a maxrs process 0 does not do.
        "devices": [],
    }
    client.key_value_set_bytes(f"cluster_check/hosts/{rank}", json.dumps(me).encode())
    client.key_value_increment("cluster_check/arrived", 1)
    for other in range(num_processes):
        host = json.loads(client.blocking_key_value_get_bytes(f"cluster_check/hosts/{other}", timeout_ms))
        assert host["rank"] == other, f"process {other} published itself as rank {host['rank']}"
        print(f"jax peer: read process {other}: {host['hostname']} pid {host['pid']} ({host['platform']})", flush=True)
    client.wait_at_barrier("cluster_check/published", timeout_ms)
    entries = client.key_value_dir_get_bytes("cluster_check/hosts")
    assert len(entries) == num_processes, f"directory has {len(entries)} entries"
    arrived = client.key_value_try_get("cluster_check/arrived")
    assert arrived == str(num_processes), f"counter reads {arrived!r}"
    client.wait_at_barrier("cluster_check/read", timeout_ms)
    if hold:
        print(f"jax peer: holding for {hold} s", flush=True)
        time.sleep(hold)
    client.wait_at_barrier("cluster_check/done", timeout_ms)
    jax.distributed.shutdown()
    print(f"jax peer: process {rank} of {num_processes}: OK", flush=True)


if __name__ == "__main__":
    main()
