"""Job arrays in `corral jobs`, `show`, `cancel`...: one line per array, its tasks counted by state."""

from __future__ import annotations

from typing import Any

STATE_ORDER = ("running", "starting", "stopping", "pending", "finished", "failed", "cancelled", "rejected")


def counts_text(states: dict[str, int]) -> str:
    """`2 running, 97 pending, 1 finished`, states in their usual order."""
    return ", ".join(f"{states[s]} {s}" for s in STATE_ORDER if states.get(s))


def group(jobs: list[dict[str, Any]]) -> list[dict[str, Any] | list[dict[str, Any]]]:
    """The jobs in order, the tasks of each array gathered (as a list) where its first task was."""
    out: list[dict[str, Any] | list[dict[str, Any]]] = []
    arrays: dict[str, list[dict[str, Any]]] = {}
    for job in jobs:
        array = job.get("array_id")
        if not array:
            out.append(job)
        elif array in arrays:
            arrays[array].append(job)
        else:
            arrays[array] = [job]
            out.append(arrays[array])
    return out


def array_row(tasks: list[dict[str, Any]], shape: str, age: str) -> tuple[str, ...]:
    """One table row for an array's listed tasks: `j12[0-99]`, its name, counts, shape, age."""
    first = tasks[0]
    states: dict[str, int] = {}
    for t in tasks:
        states[t["state"]] = states.get(t["state"], 0) + 1
    indices = sorted(int(t["array_task"]) for t in tasks)
    span = f"{indices[0]}-{indices[-1]}" if len(indices) > 1 else str(indices[0])
    state = next(s for s in STATE_ORDER if states.get(s))
    waiting = next((t for t in tasks if t["state"] == "pending" and t.get("reason")), None)
    return (
        f"{first['array_id']}[{span}]",
        first["name"],
        f"{state} ({len(tasks)} tasks)" if len(states) == 1 else state,
        first["queue"],
        first["user"],
        shape,
        age,
        counts_text(states) + (f"; {waiting['reason']}" if waiting else ""),
    )


def show_fields(array: dict[str, Any]) -> list[tuple[str, Any]]:
    """`corral show ARRAY`: the array as a whole."""
    cap = array.get("max_running") or 0
    return [
        ("array", f"{array['id']}  {array.get('name', '')}".strip()),
        ("tasks", f"{array['tasks']} ({array['spec']})"),
        ("at once", f"at most {cap} running" if cap else "no cap"),
        ("state", array["state"]),
        ("tasks by state", counts_text(array.get("states") or {})),
        ("queue", array.get("queue")),
        ("user", array.get("user")),
        ("dependency", array.get("dependency") or None),
        ("first task", array.get("first_task")),
        ("tasks list", f"corral jobs --expand --array {array['id']}"),
    ]
