"""Loading the cluster file: expansion, defaults, and errors that name the file, the line and the fix."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from corral.config.cluster_file import ClusterConfig, load_cluster_file, parse_cluster_config
from corral.core.errors import ConfigError
from corral.core.model import DEFAULT_PRIORITY_CLASSES

NODES = """\
name: lab
topology: [spine, leaf]
nodes:
  - name: dgx[01-04]
    gpus: 8
    gpu_model: NVIDIA H100 80GB HBM3
    gpu_memory_gib: 80
    cpus: 192
    memory_gib: 2048
    labels: {spine: s1, leaf: l1}
    network: {nccl_socket_ifname: eth0}
    address: 10.0.0.1
  - name: dgx[05-06],spare
    gpus: 4
    nvlink: [[0, 1], [2, 3]]
    labels: {spine: s1, leaf: l2}
"""


def write(tmp_path: Path, text: str, name: str = "cluster.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def line_of(path: Path, needle: str, occurrence: int = 1) -> int:
    """1-based line of the `occurrence`-th line of the file that contains `needle`."""
    hits = [n for n, line in enumerate(path.read_text().splitlines(), 1) if needle in line]
    return hits[occurrence - 1]


def load_error(path: Path) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_cluster_file(path)
    return info.value


def assert_points_at(error: ConfigError, path: Path, line: int | None, field: str, fix: str) -> None:
    text = str(error)
    where = f"{path}:{line}: {field}:" if line is not None else f"{path}: {field}:"
    assert text.startswith(where), text
    assert f"(fix: {fix}" in text or fix in error.fix, text
    assert error.fix


def test_loads_nodes_expanded_in_file_order(tmp_path: Path) -> None:
    config = load_cluster_file(write(tmp_path, NODES))
    assert isinstance(config, ClusterConfig)
    assert config.name == "lab"
    assert config.topology == ("spine", "leaf")
    names = [node.name for node in config.nodes]
    assert names == ["dgx01", "dgx02", "dgx03", "dgx04", "dgx05", "dgx06", "spare"]
    first = config.nodes[0]
    assert first.gpu_model == "H100-80GB"
    assert (first.gpus, first.cpus, first.memory_gib, first.gpu_memory_gib) == (8, 192, 2048.0, 80.0)
    assert first.labels == {"spine": "s1", "leaf": "l1"}
    assert first.network == {"nccl_socket_ifname": "eth0"}
    assert first.address == "10.0.0.1"
    assert first.nvlink == (tuple(range(8)),)
    assert config.nodes[-1].nvlink == ((0, 1), (2, 3))
    assert config.gpus == 44
    assert config.largest_node_gpus == 8
    assert config.checkpoint_root is None


def test_defaults_without_queues_or_classes(tmp_path: Path) -> None:
    config = load_cluster_file(write(tmp_path, NODES))
    assert [q.name for q in config.queues] == ["default"]
    default = config.queues[0]
    assert (default.teams, default.quota, default.limit, default.cohort) == (("default",), 0, None, "")
    assert config.priority_classes == DEFAULT_PRIORITY_CLASSES
    assert config.default_priority == "normal"
    assert config.priority_class("high").value == 1000
    with pytest.raises(KeyError):
        config.priority_class("nope")
    with pytest.raises(KeyError):
        config.queue("nope")


def test_queues_and_priority_classes(tmp_path: Path) -> None:
    text = NODES + textwrap.dedent(
        """\
        checkpoint_root: /shared/ckpt
        queues:
          - name: research
            weight: 2
            quota: 16
            limit: 32
            cohort: main
            lending_limit: 8
            teams: [research, interns]
            default_time_limit: 4h
            max_time_limit: 7d
          - {name: prod, quota: 8, priorities: [normal, top]}
        priority_classes:
          normal: {value: 100, min_runtime: 10m}
          top: {value: 500}
        default_priority: normal
        """
    )
    config = load_cluster_file(write(tmp_path, text))
    research, prod = config.queues
    assert (research.weight, research.quota, research.limit, research.cohort) == (2.0, 16, 32, "main")
    assert (research.lending_limit, research.teams) == (8, ("research", "interns"))
    assert (research.default_time_limit, research.max_time_limit) == (14400.0, 604800.0)
    assert (prod.teams, prod.priorities, prod.cohort, prod.limit) == (("prod",), ("normal", "top"), "", None)
    assert [(c.name, c.value, c.min_runtime) for c in config.priority_classes] == [
        ("normal", 100, 600.0),
        ("top", 500, 0.0),
    ]
    assert config.queue("prod") is prod
    assert config.checkpoint_root == "/shared/ckpt"


def test_nvlink_none_puts_every_gpu_alone(tmp_path: Path) -> None:
    text = "nodes:\n  - {name: n1, gpus: 3, nvlink: none}\n  - {name: n2, gpus: 0}\n"
    config = load_cluster_file(write(tmp_path, text))
    assert config.nodes[0].nvlink == ((0,), (1,), (2,))
    assert config.nodes[1].nvlink == ()
    assert config.topology == ()


def test_numeric_labels_become_names(tmp_path: Path) -> None:
    text = "topology: [rack]\nnodes:\n  - {name: n1, gpus: 1, labels: {rack: 7}, network: {any: 1}}\n"
    config = load_cluster_file(write(tmp_path, text))
    assert config.nodes[0].labels == {"rack": "7"}


def test_unknown_fields_are_refused_with_the_nearest_name(tmp_path: Path) -> None:
    text = (
        "nodes:\n  - {name: n1, gpus: 1, gpu_modle: A100}\nqueues:\n  - name: q\n    qouta: 1\n"
        "priority_classes:\n  normal: {value: 1, min_runtme: 1m}\nfuture_field: 1\n"
    )
    path = write(tmp_path, text)
    error = str(load_error(path))
    assert error.startswith(f"{path}: 4 problems:")
    for line in (
        f"{path}:2: nodes[0].gpu_modle: unknown field `gpu_modle` (fix: did you mean `gpu_model`?)",
        f"{path}:5: queues[0].qouta: unknown field `qouta` (fix: did you mean `quota`?)",
        f"{path}:7: priority_classes.normal.min_runtme: unknown field `min_runtme` "
        "(fix: did you mean `min_runtime`?)",
        f"{path}:8: future_field: unknown field `future_field` (fix: remove it; the known fields here are: ",
    ):
        assert line in error


@pytest.mark.parametrize(
    ("bad", "message", "fix"),
    [
        ("dgx[08-01]", "runs backwards", "write the low number first, e.g. [01-08]"),
        ("dgx[01-", "never closed", "write ranges like dgx[01-08]"),
        ("dgx[a-b]", "not a number range", "write ranges like dgx[01-08]"),
        ("''", "empty", "write ranges like dgx[01-08]"),
    ],
)
def test_malformed_name_range(tmp_path: Path, bad: str, message: str, fix: str) -> None:
    path = write(tmp_path, NODES.replace("dgx[05-06],spare", bad))
    error = load_error(path)
    assert_points_at(error, path, line_of(path, "gpus: 4") - 1, "nodes[1].name", fix)
    assert message in str(error)


def test_duplicate_node_name(tmp_path: Path) -> None:
    path = write(tmp_path, NODES.replace("dgx[05-06],spare", "dgx[04-05]"))
    error = load_error(path)
    assert_points_at(error, path, line_of(path, "dgx[04-05]"), "nodes[1].name", "remove one of the two")
    assert "dgx04 is declared twice (also by nodes[0])" in str(error)


def test_duplicate_node_name_inside_one_entry(tmp_path: Path) -> None:
    path = write(tmp_path, "nodes:\n  - {name: 'a,a', gpus: 1}\n")
    assert_points_at(load_error(path), path, 2, "nodes[0].name", "remove one of the two")


def test_label_naming_an_undeclared_level(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        NODES.replace(
            "labels: {spine: s1, leaf: l2}", "labels:\n      spine: s1\n      leaf: l2\n      rack: r1"
        ),
    )
    error = load_error(path)
    assert_points_at(
        error,
        path,
        line_of(path, "rack: r1"),
        "nodes[1].labels.rack",
        "add rack to `topology:` or remove the label",
    )


def test_node_missing_a_level_label(tmp_path: Path) -> None:
    path = write(tmp_path, NODES.replace("labels: {spine: s1, leaf: l2}", "labels: {spine: s1}"))
    error = load_error(path)
    assert_points_at(
        error, path, line_of(path, "labels: {spine: s1}"), "nodes[1].labels", "add `leaf: <name>`"
    )


def test_node_without_labels_points_at_the_entry(tmp_path: Path) -> None:
    path = write(tmp_path, "topology: [leaf]\nnodes:\n  - name: n1\n    gpus: 1\n")
    assert_points_at(load_error(path), path, 3, "nodes[0].labels", "add `leaf: <name>`")


def test_labels_without_topology_are_refused(tmp_path: Path) -> None:
    path = write(tmp_path, "nodes:\n  - name: n1\n    gpus: 1\n    labels: {leaf: l1}\n")
    error = load_error(path)
    assert_points_at(error, path, 4, "nodes[0].labels.leaf", "add leaf to `topology:`")
    assert "none declared" in str(error)


QUEUES_OVER = """\
queues:
  - {name: a, quota: 24, cohort: main}
  - {name: b, quota: 16}
  - {name: c, quota: 24, cohort: main}
"""


def test_quotas_of_a_cohort_above_the_cluster(tmp_path: Path) -> None:
    path = write(tmp_path, NODES + QUEUES_OVER)
    error = load_error(path)
    assert_points_at(error, path, line_of(path, "name: c"), "queues[2].quota", "lower the quotas")
    assert "cohort 'main' add up to 48 GPUs (a 24 + c 24) but the cluster has 44" in str(error)


def test_quotas_of_queues_without_a_cohort_share_one_implicit_cohort(tmp_path: Path) -> None:
    text = (
        NODES
        + "queues:\n  - {name: a, quota: 30}\n  - {name: b, quota: 20, cohort: other}\n"
        + "  - {name: c, quota: 20}\n"
    )
    path = write(tmp_path, text)
    error = load_error(path)
    assert_points_at(error, path, line_of(path, "name: c"), "queues[2].quota", "lower the quotas")
    assert "the queues without a cohort add up to 50" in str(error)


def test_quotas_in_separate_cohorts_may_each_use_the_cluster(tmp_path: Path) -> None:
    text = NODES + "queues:\n  - {name: a, quota: 44, cohort: x}\n  - {name: b, quota: 44, cohort: y}\n"
    assert len(load_cluster_file(write(tmp_path, text)).queues) == 2


def test_quota_above_limit(tmp_path: Path) -> None:
    path = write(tmp_path, NODES + "queues:\n  - name: a\n    quota: 16\n    limit: 8\n")
    error = load_error(path)
    assert_points_at(
        error, path, line_of(path, "quota: 16"), "queues[0].quota", "lower quota to at most 8 or raise limit"
    )


def test_unknown_default_priority(tmp_path: Path) -> None:
    path = write(tmp_path, NODES + "default_priority: medium\n")
    error = load_error(path)
    assert_points_at(
        error,
        path,
        line_of(path, "default_priority"),
        "default_priority",
        "set default_priority to one of: low, normal, high, urgent",
    )


def test_default_priority_missing_from_custom_classes(tmp_path: Path) -> None:
    path = write(tmp_path, NODES + "priority_classes:\n  batch: {value: 1}\n")
    error = load_error(path)
    assert_points_at(error, path, None, "default_priority", "set default_priority to one of: batch")


def test_queue_priority_naming_an_unknown_class(tmp_path: Path) -> None:
    path = write(
        tmp_path, NODES + "queues:\n  - name: a\n    priorities:\n      - normal\n      - critical\n"
    )
    error = load_error(path)
    assert_points_at(
        error, path, line_of(path, "- critical"), "queues[0].priorities[1]", "use one of: low, normal"
    )


def test_negative_gpus(tmp_path: Path) -> None:
    path = write(tmp_path, NODES.replace("gpus: 4", "gpus: -4"))
    error = load_error(path)
    assert_points_at(error, path, line_of(path, "gpus: -4"), "nodes[1].gpus", "use a value >= 0")
    assert "must be >= 0, got -4" in str(error)


@pytest.mark.parametrize(
    ("groups", "problem"),
    [
        ("[[0, 1], [2]]", "missing [3]"),
        ("[[0, 1], [1, 2, 3]]", "listed twice [1]"),
        ("[[0, 1], [2, 3, 4]]", "out of range [4]"),
    ],
)
def test_nvlink_groups_must_cover_every_gpu_once(tmp_path: Path, groups: str, problem: str) -> None:
    path = write(tmp_path, NODES.replace("[[0, 1], [2, 3]]", groups))
    error = load_error(path)
    assert_points_at(
        error,
        path,
        line_of(path, "nvlink:"),
        "nodes[1].nvlink",
        "put every GPU index of the node in exactly one group",
    )
    assert problem in str(error)


@pytest.mark.parametrize("value", ["bogus", "[0, 1]", "[]"])
def test_nvlink_of_the_wrong_shape(tmp_path: Path, value: str) -> None:
    path = write(tmp_path, NODES.replace("[[0, 1], [2, 3]]", value))
    assert_points_at(
        load_error(path), path, line_of(path, "nvlink:"), "nodes[1].nvlink", "write nvlink: all, nvlink: none"
    )


@pytest.mark.parametrize("value", ["90", "'90'", "4.5"])
def test_duration_without_units(tmp_path: Path, value: str) -> None:
    path = write(tmp_path, NODES + f"queues:\n  - name: a\n    default_time_limit: {value}\n")
    error = load_error(path)
    assert_points_at(
        error, path, line_of(path, "default_time_limit"), "queues[0].default_time_limit", "90m or 4h"
    )
    assert "has no unit" in str(error)


def test_min_runtime_without_units(tmp_path: Path) -> None:
    path = write(tmp_path, NODES + "priority_classes:\n  normal: {value: 1, min_runtime: 600}\n")
    error = load_error(path)
    assert_points_at(
        error, path, line_of(path, "min_runtime"), "priority_classes.normal.min_runtime", "90m or 4h"
    )


def test_default_time_limit_above_max(tmp_path: Path) -> None:
    path = write(
        tmp_path, NODES + "queues:\n  - name: a\n    default_time_limit: 8h\n    max_time_limit: 4h\n"
    )
    error = load_error(path)
    assert_points_at(
        error, path, line_of(path, "default_time_limit"), "queues[0].default_time_limit", "at most 4h"
    )


def test_yaml_syntax_error_names_the_line(tmp_path: Path) -> None:
    path = write(tmp_path, "name: lab\nnodes:\n  - name: a\n   gpus: 1\n")
    error = load_error(path)
    assert str(error).startswith(f"{path}:4: invalid YAML")
    assert "indentation" in error.fix


def test_yaml_unclosed_bracket(tmp_path: Path) -> None:
    path = write(tmp_path, "name: lab\ntopology: [spine, leaf\nnodes: []\n")
    error = load_error(path)
    assert str(error).startswith(f"{path}:")
    assert "invalid YAML" in str(error)


def test_duplicate_yaml_key(tmp_path: Path) -> None:
    path = write(tmp_path, "name: lab\nnodes:\n  - name: a\n    gpus: 1\n    gpus: 2\n")
    error = load_error(path)
    assert_points_at(error, path, 5, "nodes[0]", "keep one of the two entries")


@pytest.mark.parametrize(
    ("replace", "field", "fix"),
    [
        (("gpus: 4", "gpus: four"), "nodes[1].gpus", "write a whole number"),
        (("gpus: 4", "gpus: 4.5"), "nodes[1].gpus", "write a whole number"),
        (("gpus: 4", "gpus: true"), "nodes[1].gpus", "write a whole number"),
        (("topology: [spine, leaf]", "topology: spine"), "topology", "write a list"),
        (("labels: {spine: s1, leaf: l2}", "labels: [s1, l2]"), "nodes[1].labels", "write a mapping"),
        (("gpus: 4", "gpus: 4\n    cpus: many"), "nodes[1].cpus", "write a whole number"),
    ],
)
def test_wrong_types(tmp_path: Path, replace: tuple[str, str], field: str, fix: str) -> None:
    path = write(tmp_path, NODES.replace(*replace))
    error = load_error(path)
    line = line_of(path, replace[1].splitlines()[-1])
    assert_points_at(error, path, line, field, fix)
    assert "\n" not in str(error)


def test_missing_required_field(tmp_path: Path) -> None:
    path = write(tmp_path, NODES.replace("    gpus: 4\n", ""))
    assert_points_at(load_error(path), path, line_of(path, "spare"), "nodes[1].gpus", "add `gpus:`")


def test_several_problems_one_line_each_in_line_order(tmp_path: Path) -> None:
    path = write(tmp_path, NODES.replace("gpus: 4", "gpus: -1").replace("cpus: 192", "cpus: lots"))
    text = str(load_error(path))
    lines = text.splitlines()
    assert lines[0] == f"{path}: 2 problems:"
    assert lines[1].strip().startswith(f"{path}:{line_of(path, 'cpus: lots')}: nodes[0].cpus:")
    assert lines[2].strip().startswith(f"{path}:{line_of(path, 'gpus: -1')}: nodes[1].gpus:")
    assert all("(fix: " in line for line in lines[1:])


@pytest.mark.parametrize("text", ["", "# only a comment\n"])
def test_empty_file(tmp_path: Path, text: str) -> None:
    path = write(tmp_path, text)
    error = load_error(path)
    assert str(error).startswith(f"{path}: the cluster file is empty")
    assert "nodes:" in error.fix


@pytest.mark.parametrize(("text", "kind"), [("- a\n- b\n", "list"), ("just text\n", "str")])
def test_not_a_mapping(tmp_path: Path, text: str, kind: str) -> None:
    path = write(tmp_path, text)
    assert f"the top level is a {kind}, not a mapping" in str(load_error(path))


def test_unreadable_file(tmp_path: Path) -> None:
    path = tmp_path / "missing.yaml"
    error = load_error(path)
    assert str(error).startswith(f"{path}: cannot read the file")
    assert error.fix == "check the path"


@pytest.mark.parametrize(
    ("text", "field", "fix"),
    [
        ("topology: [rack, rack]\n", "topology[1]", "list each level once"),
        ("topology: [node]\n", "topology[0]", "rename the level"),
        ("queues:\n  - {name: a}\n  - {name: a}\n", "queues[1].name", "rename one"),
        (
            "priority_classes:\n  a: {value: 1}\n  b: {value: 1}\n",
            "priority_classes.b.value",
            "its own value",
        ),
        ("priority_classes: {}\n", "priority_classes", "define at least one"),
        ("queues:\n  - {name: a, weight: 0}\n", "queues[0].weight", "use a value > 0"),
        ("queues:\n  - {name: a, max_time_limit: 0s}\n", "queues[0].max_time_limit", "positive duration"),
    ],
)
def test_other_rules(tmp_path: Path, text: str, field: str, fix: str) -> None:
    path = write(tmp_path, "nodes: []\n" + text)
    error = load_error(path)
    assert field + ":" in str(error)
    assert fix in error.fix
    assert str(error).startswith(f"{path}:")


def test_parse_without_lines_names_the_field() -> None:
    data = {"nodes": [{"name": "a", "gpus": 1}], "queues": [{"name": "q", "quota": 2}]}
    with pytest.raises(ConfigError) as info:
        parse_cluster_config(data, "api")
    assert str(info.value).startswith("api: queues[0].quota: quotas of the queues without a cohort")
    assert parse_cluster_config({"nodes": [{"name": "a", "gpus": 1}]}).nodes[0].name == "a"
