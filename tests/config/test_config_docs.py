"""The examples in docs/cluster-file.md and docs/job-spec.md load."""

from __future__ import annotations

import re
from pathlib import Path

from corral.config.cluster_file import ClusterConfig, load_cluster_file
from corral.config.job_spec import load_job_spec, to_job_spec
from corral.core.model import Launch

DOCS = Path(__file__).resolve().parents[2] / "docs"


def first_yaml_block(name: str) -> str:
    match = re.search(r"^```yaml\n(.*?)^```", (DOCS / name).read_text(encoding="utf-8"), re.S | re.M)
    assert match is not None, f"no ```yaml block in docs/{name}"
    return match.group(1)


def load_doc_cluster(tmp_path: Path) -> ClusterConfig:
    path = tmp_path / "cluster.yaml"
    path.write_text(first_yaml_block("cluster-file.md"), encoding="utf-8")
    return load_cluster_file(path)


def test_cluster_file_example_loads(tmp_path: Path) -> None:
    config = load_doc_cluster(tmp_path)
    assert config.gpus == 154
    assert config.topology == ("spine", "leaf")
    assert [q.name for q in config.queues] == ["research", "vision", "prod"]
    names = [node.name for node in config.nodes]
    assert names[:2] == ["dgx01", "dgx02"]
    assert names[-4:] == ["a100-01", "a100-02", "a100-spare", "ws01"]
    models = {str(node.name): node.gpu_model for node in config.nodes}
    assert (models["dgx01"], models["a100-01"], models["ws01"]) == ("H100-80GB", "A100-40GB", "RTX-4090")


def test_job_spec_example_loads_and_resolves(tmp_path: Path) -> None:
    cluster = load_doc_cluster(tmp_path)
    path = tmp_path / "job.yaml"
    path.write_text(first_yaml_block("job-spec.md"), encoding="utf-8")
    spec = to_job_spec(
        load_job_spec(path), job_id="j1", seq=1, submit_time=0.0, cluster=cluster, default_queue="prod"
    )
    assert (spec.queue, spec.gpus, spec.priority, spec.launch) == ("research", 32, 100, Launch.PER_NODE)
    assert spec.time_limit == 4 * 3600
