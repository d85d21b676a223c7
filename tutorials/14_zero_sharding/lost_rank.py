"""Chapter 14, part 3: a ZeRO-1 job that loses a rank keeps training on the ranks that remain.

    python tutorials/14_zero_sharding/lost_rank.py            (needs mpiexec: pip install mpich)

Runs `python -m parallel.elastic` on 4 MPI ranks (--dp 4 --zero 1, a checkpoint every step),
kills rank 3 with SIGKILL once step 3 is saved, and lets the agent restart the job (at dp 2; on a
busy machine ranks that had not written their line before the abort count as lost too, and dp is 1):
the AdamW moments that 4 ranks held a quarter each are resharded to halves by --resume.
Prints the agent's log, then the timeline of elastic.trace.json (the attempts and the restart).
"""
import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from parallel.elastic import rank_after_step
from parallel.launch import find_mpiexec

FLAGS = ["--d-model", "16", "--n-head", "4", "--n-layer", "2", "--batch", "8", "--digits", "2", "--steps", "10",
         "--zero", "1", "--save-every", "1", "--timeout", "10", "--log-every", "1", "--dp", "4"]


def timeline(trace):
    """One line per event of a Chrome trace: when, how long, what."""
    for event in json.loads(trace.read_text())["traceEvents"]:
        span = f"{event['ts'] / 1e6:6.1f} s" + (f" for {event['dur'] / 1e6:4.1f} s" if "dur" in event else " " * 11)
        print(f"  {span}  {event['name']:58s} {json.dumps(event['args'])}")


def main():
    if find_mpiexec() is None:
        sys.exit("this demonstration needs mpiexec (pip install mpich)")
    with tempfile.TemporaryDirectory() as tmp:
        return lose_a_rank(Path(tmp) / "ckpt")


def lose_a_rank(save):
    agent = subprocess.Popen([sys.executable, "-m", "parallel.elastic", "--ranks", "4", "--min-ranks", "1", "--",
                              *FLAGS, "--save", str(save)], stdout=subprocess.PIPE, text=True)
    pid = rank_after_step(agent, save, 3, 3)
    if pid is not None:
        os.kill(pid, signal.SIGKILL)
    out, _ = agent.communicate()
    print("\n".join(line for line in out.splitlines() if line.startswith(("elastic", "step", "resumed"))))
    print("\nthe timeline (ckpt/elastic.trace.json):")
    timeline(save / "elastic.trace.json")
    return agent.returncode


if __name__ == "__main__":
    sys.exit(main())
