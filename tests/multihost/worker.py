"""Job code the multi-host tests submit (run by the agents as `python worker.py MODE`).

- `allreduce`: joins a gloo process group by `env://` and all-reduces each rank's `rank + 1`;
  writes `$OUT/rank-<RANK>.json` with what Corral (or torchrun) set, the sum, and which host it ran on.
- `torchrun`: the `launch: per_node` entry point: records the node's Corral environment, then
  execs `python -m torch.distributed.run ... worker.py allreduce` (DESIGN.md 4.3's torchrun line).
- `steps`: a training loop of `$STEPS` steps of `$STEP_S` seconds with the `corral.job` helper:
  resumes after the newest checkpoint of an earlier attempt, checkpoints every `$EVERY` steps and
  when asked to, then exits 0. Every step goes to an append-only `$OUT/steps-<RANK>.log`
  (`attempt step`), and events to `$OUT/events.log`; the pid to `$OUT/pid-<attempt>-<RANK>`.
  A second append-only record, `$OUT/record-<RANK>.log`, has one line when the process begins
  and one per step: `address attempt begin|step step monotonic wall` (the host's address; one
  monotonic clock for every namespace of the machine), from which a test proves that two
  attempts never ran at once.
- `uneven`: ranks that finish at different times, without any collective at the end.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path

KEYS = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "NODE_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "CUDA_VISIBLE_DEVICES",
    "CORRAL_JOB_ID",
    "CORRAL_ATTEMPT",
    "CORRAL_NUM_NODES",
    "CORRAL_GPUS_PER_NODE",
)


def write_json(path: Path, body: object) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(body))
    os.replace(tmp, path)


def host_identity() -> dict[str, str]:
    """This process's network namespace and the address it reaches the master from."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])))
        address = s.getsockname()[0]
    return {"netns": os.readlink("/proc/self/ns/net"), "address": address}


def allreduce() -> None:
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method="env://", timeout=timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    tensor = torch.full((1024,), float(rank + 1))
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    hosts: list[object] = [None] * world
    dist.all_gather_object(hosts, host_identity())
    body = {
        "env": {k: os.environ.get(k) for k in KEYS},
        "node_env": json.loads(os.environ.get("CORRAL_NODE_ENV") or "null"),
        "rank": rank,
        "world": world,
        "sum": sorted(set(tensor.tolist())),
        "hosts": hosts,
        **host_identity(),
    }
    write_json(Path(os.environ["OUT"]) / f"rank-{rank}.json", body)
    dist.barrier()  # every rank has written its file before any exits
    dist.destroy_process_group()


def torchrun() -> None:
    env = os.environ
    os.environ["CORRAL_NODE_ENV"] = json.dumps({k: env.get(k) for k in KEYS} | host_identity())
    argv = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nnodes={env['CORRAL_NUM_NODES']}",
        f"--node_rank={env['NODE_RANK']}",
        "--nproc_per_node=1",
        f"--master_addr={env['MASTER_ADDR']}",
        f"--master_port={env['MASTER_PORT']}",
        os.path.abspath(__file__),
        "allreduce",
    ]
    os.execv(sys.executable, argv)


def steps() -> None:
    from corral import job  # installs the checkpoint signal's handler

    out = Path(os.environ["OUT"])
    rank, attempt = int(os.environ["RANK"]), job.attempt()
    total, every, step_s = int(os.environ["STEPS"]), int(os.environ["EVERY"]), float(os.environ["STEP_S"])
    (out / f"pid-{attempt}-{rank}").write_text(str(os.getpid()))

    def event(what: str, **fields: object) -> None:
        line = {"t": time.time(), "attempt": attempt, "rank": rank, "event": what, **fields}
        with open(out / "events.log", "a") as f:
            f.write(json.dumps(line) + "\n")

    done = 0
    resume = job.resume_dir()
    if resume is not None:
        done = json.loads((resume / "state.json").read_text())["step"]
        assert done == job.resume_step(), (done, job.resume_step())
    event("start", resume_step=done, resume_dir=str(resume) if resume else None)
    print(f"rank {rank} of attempt {attempt}: resuming after step {done}", flush=True)  # its log
    address = host_identity()["address"]
    record = open(out / f"record-{rank}.log", "a", buffering=1)  # noqa: SIM115  (lives as long as we do)

    def note(kind: str, step: int) -> None:
        record.write(f"{address} {attempt} {kind} {step} {time.monotonic():.6f} {time.time():.6f}\n")

    note("begin", done)
    with open(out / f"steps-{rank}.log", "a") as log:
        for step in range(done + 1, total + 1):
            time.sleep(step_s)  # one step of "work"
            log.write(f"{attempt} {step}\n")
            log.flush()
            note("step", step)
            asked = job.checkpoint_requested()
            if rank == 0 and (step % every == 0 or asked):
                write_json(job.checkpoint_dir() / "state.json", {"step": step})
                job.record_checkpoint(step)
                event("checkpoint", step=step, asked=asked)
            if asked:
                event("stopped", step=step)
                return
    event("finished", step=total)
    # like a real job's last collective: no rank leaves before every rank has finished
    (out / f"done-{attempt}-{rank}").touch()
    world = int(os.environ["WORLD_SIZE"])
    deadline = time.monotonic() + 30
    while not all((out / f"done-{attempt}-{r}").exists() for r in range(world)):
        assert time.monotonic() < deadline, "the other ranks did not finish"
        time.sleep(0.02)


def uneven() -> None:
    """Rank r works r x $SLOW_S seconds longer than rank 0, then writes `$OUT/done-<rank>`."""
    rank = int(os.environ["RANK"])
    time.sleep(rank * float(os.environ["SLOW_S"]))
    (Path(os.environ["OUT"]) / f"done-{rank}").write_text(str(time.time()))


if __name__ == "__main__":
    {"allreduce": allreduce, "torchrun": torchrun, "steps": steps, "uneven": uneven}[sys.argv[1]]()
