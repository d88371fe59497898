"""`launcher.kind: ray` on a real cluster: the job's size from the cluster's resources, the nodes checked to see the
run's paths before a job starts, and the workers' output and errors on the driver's console.

The 2-process GRPO step under Ray is in tests/test_launcher.py; the two-node fan-out of collection and eval in
tests/test_fanout.py.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipeline.config import LauncherConfig
from pipeline.launch import LaunchError, ray_launch, ray_workers
from pipeline.tracking import absolute_uri
from tests import launcher_step
from tests.helpers import ray_temp


def _node(cpus: float = 0, gpus: float = 0, alive: bool = True) -> dict:
    resources = {"CPU": cpus, **({"GPU": gpus} if gpus else {})}
    return {"Alive": alive, "Resources": resources}


def test_a_gpu_cluster_gets_a_worker_per_gpu_whatever_its_head_has():
    # Before, one worker per live node with a GPU each: a head without a GPU made the job ask for 3 GPUs of 2
    # nodes' worth (it waited forever), and a node of 8 GPUs used one.
    assert ray_workers([_node(cpus=8), _node(cpus=32, gpus=8)]) == (8, {"GPU": 1.0})
    assert ray_workers([_node(cpus=8), _node(cpus=16, gpus=2), _node(cpus=16, gpus=2)]) == (4, {"GPU": 1.0})
    assert ray_workers([_node(cpus=8), _node(cpus=16, gpus=4, alive=False), _node(gpus=2)]) == (2, {"GPU": 1.0})
    assert ray_workers([_node(cpus=8), _node(gpus=8)], wanted=3) == (3, {"GPU": 1.0})  # launcher.num_processes


def test_a_cpu_cluster_gets_a_worker_per_node_with_the_nodes_cores():
    # Each worker takes the CPUs of the smallest node: Ray gives a worker as many torch threads as it has CPUs.
    assert ray_workers([_node(cpus=4), _node(cpus=8), _node(cpus=8, alive=False)]) == (2, {"CPU": 4.0})
    assert ray_workers([_node(cpus=0), _node(cpus=2)]) == (1, {"CPU": 2.0})  # a head kept free of work
    assert ray_workers([_node(cpus=4), _node(cpus=4)], wanted=3) == (3, {"CPU": 1.0})
    with pytest.raises(LaunchError, match="no live node with a CPU or a GPU"):
        ray_workers([_node(cpus=0), _node(cpus=8, alive=False)])


def test_a_relative_tracking_store_is_named_absolutely_for_the_workers(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert absolute_uri("sqlite:///mlflow.db") == f"sqlite:///{tmp_path.resolve()}/mlflow.db"
    assert absolute_uri("mlruns") == str(tmp_path.resolve() / "mlruns")
    assert absolute_uri("file:./mlruns") == str(tmp_path.resolve() / "mlruns")
    for kept in ("sqlite:////srv/m.db", "http://127.0.0.1:5000", "postgresql://u@127.0.0.1/db", "/srv/mlruns"):
        assert absolute_uri(kept) == kept


@pytest.mark.slow
def test_a_workers_output_and_error_reach_the_drivers_console(ray_cluster, tmp_path, capfd):
    """Before, the job ran with `log_to_driver=False`: a worker's prints (its progress, its warnings) were in Ray's
    session logs only."""
    marker = f"worker-says-{os.getpid()}"
    with pytest.raises(LaunchError, match=f"{marker}: the worker's own error"):
        ray_launch(LauncherConfig(kind="ray", ray_address=ray_cluster.address), launcher_step.fails_loudly, [marker],
                   {}, tmp_path / "ray", "a failing job")
    out, err = capfd.readouterr()
    assert f"{marker} from rank 0" in out + err and f"{marker} from rank 1" in out + err


def _can_unshare() -> bool:
    return shutil.which("unshare") is not None and subprocess.run(
        ["unshare", "-m", "true"], capture_output=True).returncode == 0


@pytest.mark.slow
@pytest.mark.skipif(not _can_unshare(), reason="needs `unshare -m` (root, or a user namespace) to hide a folder "
                                               "from one node")
def test_a_node_that_cannot_see_the_run_directory_is_refused_before_the_job(tmp_path):
    """A cluster of a head (the driver's view) and a node started in a mount namespace of its own where the run's
    folder is an empty tmpfs: what a node of another machine without the shared disk sees. The job is refused in
    one sentence naming the node and the folder, before any worker starts; nothing of it stays in the folder."""
    from ray.cluster_utils import Cluster

    run_dir = tmp_path / "runs" / "r" / "round-001" / ".launch-policy"
    run_dir.mkdir(parents=True)
    node = None
    with ray_temp() as temp:  # before, RAY_TMPDIR was the node's only: the head failed where $TMPDIR/ray was absent
        cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False,
                                                                "object_store_memory": 80 * 2**20,
                                                                "temp_dir": os.path.join(temp, "ray")})
        try:
            ray_cli = str(Path(sys.executable).with_name("ray"))
            hide = f"mount -t tmpfs tmpfs {tmp_path} && exec {ray_cli} start --address={cluster.address} " \
                   "--num-cpus=1 --object-store-memory=83886080 --block"
            node = subprocess.Popen(["unshare", "-m", "--propagation", "private", "sh", "-c", hide],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
            _wait_for_live_nodes(cluster.address, 2)
            with pytest.raises(LaunchError) as refused:
                ray_launch(LauncherConfig(kind="ray", ray_address=cluster.address), launcher_step.fails_loudly,
                           ["never-runs"], {}, run_dir / "ray", "the policy phase", shared={"the run directory": run_dir})
            message = str(refused.value)
            assert "cannot see the run directory" in message and str(run_dir) in message
            assert "never-runs" not in message and not (run_dir / "ray").exists()  # no worker started
            assert list(run_dir.iterdir()) == []  # the check's token is gone
        finally:
            if node is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(node.pid, signal.SIGTERM)
                try:
                    node.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    os.killpg(node.pid, signal.SIGKILL)
                    node.wait()
            cluster.shutdown()


def _wait_for_live_nodes(address: str, count: int, timeout: float = 60) -> None:
    import ray

    deadline = time.monotonic() + timeout
    ray.init(address=address)
    try:
        while sum(n["Alive"] for n in ray.nodes()) < count:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{count} Ray nodes did not come up in {timeout:.0f} s")
            time.sleep(0.5)
    finally:
        ray.shutdown()
