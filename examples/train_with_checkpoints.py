"""A job that keeps the checkpoint contract: resumes from the newest checkpoint of an earlier
attempt, checkpoints every N steps and when asked, and exits 0 when stopped on request.

    corral submit --gpus 1 --checkpoint-grace 30s -- python examples/train_with_checkpoints.py --steps 600

The "model" is a running sum, so the example needs nothing beyond the standard library; a real
job saves its model and optimiser state where this one writes `state.json`.
"""

from __future__ import annotations

import argparse
import json
import time

from corral import job


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--every", type=int, default=50, help="checkpoint every N steps")
    parser.add_argument("--step-seconds", type=float, default=0.1)
    args = parser.parse_args()

    state = {"step": 0, "total": 0}
    resume = job.resume_dir()
    if resume is not None:
        state = json.loads((resume / "state.json").read_text())
        print(f"attempt {job.attempt()}: resuming at step {state['step']} from {resume}", flush=True)
    while state["step"] < args.steps:
        time.sleep(args.step_seconds)  # one step of "training"
        state["step"] += 1
        state["total"] += state["step"]
        if state["step"] % args.every == 0 or job.checkpoint_requested():
            (job.checkpoint_dir() / "state.json").write_text(json.dumps(state))
            job.record_checkpoint(state["step"])
            print(f"checkpoint at step {state['step']}", flush=True)
            if job.checkpoint_requested():
                print("stopping on request", flush=True)
                return
    print(f"done: {state['total']}", flush=True)


if __name__ == "__main__":
    main()
