"""Job specs: parsing, errors with file, line and fix, and resolution against a cluster."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from corral.config.cluster_file import ClusterConfig, parse_cluster_config
from corral.config.job_spec import JobRequest, gpus_shorthand, load_job_spec, parse_job_spec, to_job_spec
from corral.core.errors import ConfigError
from corral.core.model import JobSpec, Launch, Topology

JOB = """\
name: llama-finetune
queue: research
priority: normal
replicas: 4
gpus_per_replica: 8
launch: per_node
gpu_model: NVIDIA H100 80GB HBM3
topology: {pack: leaf, required: false}
time_limit: 4h
preemptible: true
checkpoint: {signal: SIGTERM, grace: 60s}
max_restarts: 3
command: ["python", "train.py", "--epochs", 10]
env: {WANDB_MODE: offline, SEED: 7}
mounts: [{source: /datasets/imagenet, target: /data, read_only: true}]
cpus_per_replica: 16
memory_gib_per_replica: 256
"""


def cluster() -> ClusterConfig:
    return parse_cluster_config(
        {
            "topology": ["spine", "leaf"],
            "nodes": [{"name": "dgx[01-04]", "gpus": 8, "labels": {"spine": "s1", "leaf": "l1"}}],
            "queues": [
                {"name": "research", "default_time_limit": "4h", "max_time_limit": "1d"},
                {"name": "prod", "priorities": ["normal", "high"]},
            ],
        },
        "cluster.yaml",
    )


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def line_of(path: Path, needle: str) -> int:
    return next(n for n, line in enumerate(path.read_text().splitlines(), 1) if needle in line)


def parse_error(path: Path) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_job_spec(path)
    return info.value


def resolve(request: JobRequest, default_queue: str = "research") -> JobSpec:
    return to_job_spec(
        request, job_id="j1", seq=7, submit_time=12.5, cluster=cluster(), default_queue=default_queue
    )


def resolve_error(request: JobRequest, default_queue: str = "research") -> ConfigError:
    with pytest.raises(ConfigError) as info:
        resolve(request, default_queue)
    return info.value


def test_full_spec(tmp_path: Path) -> None:
    request = load_job_spec(write(tmp_path, JOB))
    assert request.name == "llama-finetune"
    assert (request.replicas, request.gpus_per_replica, request.launch) == (4, 8, Launch.PER_NODE)
    assert request.gpu_model == ("H100-80GB",)
    assert (request.topology.pack, request.topology.required) == ("leaf", False)
    assert request.time_limit == 14400.0
    assert (request.checkpoint.signal, request.checkpoint.grace) == ("SIGTERM", 60.0)
    assert request.command == ("python", "train.py", "--epochs", "10")
    assert request.env == {"WANDB_MODE": "offline", "SEED": "7"}
    assert [(m.source, m.target, m.read_only) for m in request.mounts] == [
        ("/datasets/imagenet", "/data", True)
    ]
    spec = to_job_spec(
        request, job_id="j1", seq=7, submit_time=12.5, cluster=cluster(), default_queue="prod", user="ada"
    )
    assert (spec.id, spec.queue, spec.seq, spec.submit_time, spec.user) == ("j1", "research", 7, 12.5, "ada")
    assert (spec.priority, spec.priority_class, spec.gpus, spec.time_limit) == (100, "normal", 32, 14400.0)
    assert spec.topology == Topology("leaf", False)
    assert (spec.checkpoint_grace, spec.cpus_per_replica, spec.memory_gib_per_replica) == (60.0, 16, 256.0)
    assert (spec.launch, spec.gpu_model, spec.name, spec.preemptible) == (
        Launch.PER_NODE,
        ("H100-80GB",),
        "llama-finetune",
        True,
    )


def test_defaults(tmp_path: Path) -> None:
    request = load_job_spec(write(tmp_path, "command: [sleep, '1']\n"))
    assert (request.replicas, request.gpus_per_replica, request.launch) == (1, 1, Launch.PER_GPU)
    assert (request.queue, request.priority, request.time_limit, request.preemptible) == (
        None,
        None,
        None,
        True,
    )
    assert (request.checkpoint.signal, request.checkpoint.grace, request.max_restarts) == ("SIGTERM", 30.0, 3)
    assert (request.gpu_model, request.env, request.mounts) == ((), {}, [])
    spec = to_job_spec(
        request, job_id="j2", seq=1, submit_time=0.0, cluster=cluster(), default_queue="research"
    )
    assert (spec.queue, spec.priority_class, spec.priority) == ("research", "normal", 100)
    assert spec.time_limit == 14400.0  # the queue's default_time_limit
    assert spec.topology == Topology()


def test_empty_spec_is_all_defaults(tmp_path: Path) -> None:
    assert load_job_spec(write(tmp_path, "")).command == ()


def test_queue_without_default_gets_no_limit_and_gpu_model_list() -> None:
    request = parse_job_spec({"queue": "prod", "gpu_model": ["h100-80gb", "A100*"], "priority": 1000})
    spec = resolve(request)
    assert spec == resolve(request)
    assert request.gpu_model == ("H100-80GB", "A100*")
    assert (spec.time_limit, spec.priority_class) == (None, "high")


def test_time_limit_defaults_to_the_queues_maximum_when_it_has_no_default() -> None:
    config = parse_cluster_config({"queues": [{"name": "q", "max_time_limit": "2h"}]})
    spec = to_job_spec(
        parse_job_spec({}), job_id="j", seq=0, submit_time=0, cluster=config, default_queue="q"
    )
    assert spec.time_limit == 7200.0


def test_integer_priority_must_equal_a_class_value(tmp_path: Path) -> None:
    path = write(tmp_path, "queue: research\npriority: 150\n")
    error = resolve_error(load_job_spec(path))
    assert str(error).startswith(f"{path}:2: priority: no priority class has the value 150")
    assert "normal (100)" in error.fix


def test_unknown_priority_class(tmp_path: Path) -> None:
    path = write(tmp_path, "priority: critical\n")
    error = resolve_error(load_job_spec(path))
    assert str(error).startswith(f"{path}:1: priority: unknown priority class 'critical'")
    assert error.fix == "use one of: low, normal, high, urgent"


def test_queue_that_does_not_allow_the_class(tmp_path: Path) -> None:
    path = write(tmp_path, "name: x\nqueue: prod\npriority: urgent\n")
    error = resolve_error(load_job_spec(path))
    assert str(error).startswith(f"{path}:3: priority: queue 'prod' does not allow priority class 'urgent'")
    assert "use one of: normal, high" in error.fix


def test_unknown_queue(tmp_path: Path) -> None:
    path = write(tmp_path, "queue: nope\n")
    error = resolve_error(load_job_spec(path))
    assert str(error).startswith(f"{path}:1: queue: unknown queue 'nope'")
    assert error.fix == "use one of: research, prod"
    assert "unknown queue 'elsewhere'" in str(resolve_error(parse_job_spec({}), default_queue="elsewhere"))


def test_time_limit_above_the_queue_maximum(tmp_path: Path) -> None:
    path = write(tmp_path, "queue: research\ntime_limit: 2d\n")
    error = resolve_error(load_job_spec(path))
    assert str(error).startswith(f"{path}:2: time_limit: time limit 2d exceeds the queue's maximum 1d")
    assert error.fix == "ask for at most 1d"


def test_unknown_pack_level(tmp_path: Path) -> None:
    path = write(tmp_path, "topology:\n  pack: rack\n")
    error = resolve_error(load_job_spec(path))
    assert str(error).startswith(f"{path}:2: topology.pack: unknown pack level 'rack'")
    assert error.fix == "use one of: nvlink, node, leaf, spine"


@pytest.mark.parametrize(
    ("text", "field", "fix"),
    [
        ("command: python train.py\n", "command", 'write the argv as a list: ["python", "train.py"]'),
        ("command: ['python train.py --lr 0.1']\n", "command", '["python", "train.py", "--lr", "0.1"]'),
        ("command: [python, true]\n", "command", 'e.g. ["python", "train.py"]'),
        ("time_limit: 90\n", "time_limit", "90m or 4h"),
        ("time_limit: '240'\n", "time_limit", "90m or 4h"),
        ("time_limit: 0s\n", "time_limit", "90m or 4h"),
        ("checkpoint: {grace: 60}\n", "checkpoint.grace", "90m or 4h"),
        ("checkpoint: {grace: 2h}\n", "checkpoint.grace", "use at most 1h"),
        ("checkpoint: {signal: SIGKILL}\n", "checkpoint.signal", "use SIGTERM, SIGINT or SIGUSR1"),
        ("checkpoint: {signal: SIGFOO}\n", "checkpoint.signal", "use SIGTERM"),
        ("launch: per_rack\n", "launch", "use one of 'per_gpu' or 'per_node'"),
        ("replicas: 0\n", "replicas", "use a value >= 1"),
        ("gpus_per_replica: -1\n", "gpus_per_replica", "use a value >= 0"),
        ("replicas: two\n", "replicas", "write a whole number"),
        ("preemptible: maybe\n", "preemptible", "write true or false"),
        ("priority: [high]\n", "priority", "write a class name"),
        ("gpu_model: [H100, 3]\n", "gpu_model", "a glob (H100*)"),
        ("env: {DEBUG: true}\n", "env", 'quote the value, e.g. DEBUG: "true"'),
        ("env: {'1X': a}\n", "env", "use letters, digits and _"),
        ("mounts: [{source: data, target: /data}]\n", "mounts[0].source", "starts with /"),
        ("mounts: [{source: /data}]\n", "mounts[0].target", "add `target:`"),
        ("topology: {pack: leaf, required: yes please}\n", "topology.required", "write true or false"),
    ],
)
def test_invalid_fields(tmp_path: Path, text: str, field: str, fix: str) -> None:
    path = write(tmp_path, "name: job\n" + text)
    error = parse_error(path)
    assert str(error).startswith(f"{path}:2: {field}:"), str(error)
    assert fix in error.fix, error.fix


def test_signal_names_are_normalised() -> None:
    assert parse_job_spec({"checkpoint": {"signal": "usr1"}}).checkpoint.signal == "SIGUSR1"


@pytest.mark.parametrize(("text", "kind"), [("- a\n", "list"), ("text\n", "str")])
def test_not_a_mapping(tmp_path: Path, text: str, kind: str) -> None:
    path = write(tmp_path, text)
    assert str(parse_error(path)).startswith(f"{path}: the job spec is a {kind}, not a mapping")


def test_yaml_error_names_the_line(tmp_path: Path) -> None:
    path = write(tmp_path, "name: a\ncommand: [python\nenv: {}\n")
    assert str(parse_error(path)).startswith(f"{path}:")


def test_unknown_fields_are_refused_with_the_nearest_name(tmp_path: Path) -> None:
    path = write(tmp_path, "name: a\ngpu_per_replica: 4\ntopology: {pakc: leaf}\ncommand: [x]\n")
    error = str(parse_error(path))
    assert error.startswith(f"{path}: 2 problems:")
    assert (
        f"{path}:2: gpu_per_replica: unknown field `gpu_per_replica` (fix: did you mean `gpus_per_replica`?)"
        in error
    )
    assert f"{path}:3: topology.pakc: unknown field `pakc` (fix: did you mean `pack`?)" in error
    mount = {"mounts": [{"source": "/a", "target": "/b", "readonly": True}]}
    with pytest.raises(ConfigError, match=r"mounts\[0\]\.readonly: unknown field .*did you mean `read_only`"):
        parse_job_spec(mount)
    with pytest.raises(ConfigError, match="remove it; the known fields here are: array, checkpoint, command"):
        parse_job_spec({"name": "a", "future": 1})


def test_a_job_object_from_the_server_is_accepted_back() -> None:
    """`corral show --json` output carries fields the server added; they are dropped, not refused."""
    shown = {"id": "j1", "state": "done", "user": "ann", "attempt": 2, "placement": [], "exit_code": 0}
    request = parse_job_spec({**shown, "replicas": 2, "gpus_per_replica": 4, "gpus": 8, "command": ["x"]})
    assert (request.replicas, request.gpus_per_replica) == (2, 4)
    with pytest.raises(ConfigError, match=r"`gpus` is not a job spec field, and 8 disagrees .* \(1 x 1\)"):
        parse_job_spec({"gpus": 8, "command": ["x"]})


@pytest.mark.parametrize(
    ("n", "largest", "split"),
    [(8, 8, (1, 8)), (3, 8, (1, 3)), (0, 8, (1, 0)), (0, 0, (1, 0)), (4, 4, (1, 4))],
)
def test_gpus_shorthand_fits_one_node(n: int, largest: int, split: tuple[int, int]) -> None:
    assert gpus_shorthand(n, largest) == split


@pytest.mark.parametrize(
    ("n", "largest", "fix"),
    [
        (16, 8, "--replicas 2 --gpus-per-replica 8"),
        (64, 8, "--replicas 8 --gpus-per-replica 8"),
        (12, 8, "--replicas 3 --gpus-per-replica 4"),
        (10, 8, "--replicas 5 --gpus-per-replica 2"),
        (9, 8, "--replicas 9 --gpus-per-replica 1"),
        (12, 6, "--replicas 2 --gpus-per-replica 6"),
        (20, 6, "--replicas 5 --gpus-per-replica 4"),
    ],
)
def test_gpus_shorthand_suggests_the_split(n: int, largest: int, fix: str) -> None:
    with pytest.raises(ConfigError) as info:
        gpus_shorthand(n, largest)
    assert str(info.value).startswith(f"--gpus: {n} GPUs do not fit one node (the largest has {largest})")
    assert fix in info.value.fix


@pytest.mark.parametrize(("n", "largest"), [(-1, 8), (4, 0)])
def test_gpus_shorthand_refuses_the_impossible(n: int, largest: int) -> None:
    with pytest.raises(ConfigError) as info:
        gpus_shorthand(n, largest)
    assert info.value.fix
