#!/usr/bin/env python3
"""A stand-in for a framework's per-rank entry point (run by torchrun like `uccl-ep bench`): writes
what the launch gave it to $PROBE_DIR/rank<RANK>.json, then exits 0, or fails / sleeps on request:

  PROBE_FAIL_NODE=R   the ranks on node R exit 3 after a short delay
  PROBE_SLEEP=S       every other rank sleeps S seconds (a hung job, for the stop-on-failure tests)
"""
import json
import os
import socket
import sys
import time

KEYS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "NODE_RANK", "NNODES",
        "FI_PROVIDER", "UCCL_EP_FABRIC_PROVIDER", "PYXIS_STUB_IMAGE", "PYXIS_STUB_MOUNTS", "SLURMD_NODENAME",
        "CUDA_VISIBLE_DEVICES", "PROBE_TAG")
out = {k: os.environ.get(k) for k in KEYS}
out.update(argv=sys.argv[1:], pid=os.getpid(), host=socket.gethostname())
path = os.path.join(os.environ["PROBE_DIR"], f"rank{os.environ.get('RANK', 'x')}.json")
with open(path, "w") as f:
    json.dump(out, f)
if os.environ.get("PROBE_FAIL_NODE") == os.environ.get("NODE_RANK"):
    time.sleep(1.0)
    sys.exit(3)
time.sleep(float(os.environ.get("PROBE_SLEEP", "0")))
