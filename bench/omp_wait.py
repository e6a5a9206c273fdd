"""OpenMP's wait policy on a shared CPU: SmolLM2 forward + backward, default (spinning) against PASSIVE.

Each policy runs in its own process (the setting is read when torch loads), alternating, ``--repeats``
times: one forward and backward pass of the embedded SmolLM2 over 4 × 288 tokens, 2 torch threads, mean
of 3 passes after a warm-up. Run it while another job holds a core to see what a busy machine costs::

    python bench/omp_wait.py --repeats 2
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

CHILD = r"""
import os, time, torch
from qgmem.lm import load_causal_lm, EMBEDDED_LM
m = load_causal_lm(EMBEDDED_LM)
for p in m.parameters():
    p.requires_grad_(True)
torch.set_num_threads(2)
x = torch.randint(0, 1000, (4, 288))
m(x)
t = time.perf_counter()
for _ in range(3):
    m(x).logits.sum().backward()
print(f"{os.environ.get('OMP_WAIT_POLICY', 'default')}: {(time.perf_counter() - t) / 3:.2f} s per forward+backward "
      f"(load {os.getloadavg()[0]:.1f})", flush=True)
"""


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=2)
    args = p.parse_args()
    for _ in range(args.repeats):
        for policy in (None, "PASSIVE"):
            env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
            if policy:
                env["OMP_WAIT_POLICY"] = policy
            out = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, check=True)
            print(out.stdout.strip().splitlines()[-1], flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
