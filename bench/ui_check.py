"""A browser look at what a run leaves in MLflow: the parent run's cross-round charts and a round's sample table.

    python -m bench.ui_check                      # a mini pipeline (2 rounds, ~2 min on 2 cores), then screenshots
    python -m bench.ui_check --store sqlite:///mlflow.db --experiment iterative-grpo   # an existing store
    python -m bench.ui_check --out docs/img       # where the PNGs go (default: docs/img)

Needs Debian's `chromium` (`apt-get install chromium`) and Playwright (`pip install -e ".[ui]"`; it drives the
system's Chromium and downloads no browser). It starts `mlflow ui` on a free localhost port (stopped by its own
pid at the end), loads pages in headless Chromium and saves:
- `mlflow_experiment.png`: the experiment's runs, in the model-training view;
- `mlflow_charts.png`: the parent run's model metrics as a user first sees them, unfiltered: the `accuracy`
  section (greedy, Maj@K, Pass@K; step = round) first, then best-of-N, collection, RM quality, ...;
- `mlflow_samples.png`: the last round's sample table (`samples/eval.json`, prompt, completion, answer,
  verifier, PRM step scores, ORM score) in the run's artifact view.
For each page it also reads the rendered page and prints whether the expected names are on it, so a page that
renders empty (a wrong URL, a view that needs a click) shows as a failed check, not as a blank picture; on the
charts page, also that the sections come in the order `tracking.metric_name` is for.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import yaml

from bench._common import ROOT, mini_config
from pipeline.tracking import HEADLINE_SECTION

SAMPLES_ARTIFACT = "samples/eval.json"


def free_port() -> int:
    with contextlib.closing(socket.socket()) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def mini_run(work: Path) -> tuple[str, str]:
    """`igrpo run` on configs/mini.yaml (2 rounds); returns (tracking URI, experiment)."""
    data = mini_config(work)
    (work / "mini.yaml").write_text(yaml.safe_dump(data))
    env = {**os.environ, "PREFECT_HOME": str(work / "prefect"), "PYTHONPATH": str(ROOT)}
    env.pop("PREFECT_API_URL", None)
    subprocess.run([sys.executable, "-m", "flows.cli", "run", "mini.yaml"], cwd=work, env=env, check=True,
                   stdout=subprocess.DEVNULL)
    return data["tracking"]["tracking_uri"], data["tracking"]["experiment"]


@contextlib.contextmanager
def mlflow_ui(store: str, cwd: Path):
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", store, "--host", "127.0.0.1",
                             "--port", str(port)], cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 120
        while True:
            with contextlib.suppress(OSError):
                with urllib.request.urlopen(f"{url}/health", timeout=2):
                    break
            if time.time() > deadline or proc.poll() is not None:
                raise RuntimeError(f"mlflow ui did not start on {url}")
            time.sleep(0.5)
        yield url
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if path := shutil.which(name):
            return path
    raise SystemExit("ui_check: no chromium on PATH (Debian: apt-get install chromium)")


# Headless, no GPU, and nothing fetched but the page: no QUIC, sync, component or background updates.
CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@contextlib.contextmanager
def browser():
    """A headless page in the system's Chromium, driven by Playwright (which then downloads no browser), with a
    fresh profile: no chart layout that MLflow's UI kept in the browser's local storage from an earlier look."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p, tempfile.TemporaryDirectory(prefix="igrpo-chromium-") as profile:
        context = p.chromium.launch_persistent_context(profile, executable_path=chromium(), headless=True,
                                                       args=CHROMIUM_FLAGS, viewport={"width": 1600, "height": 1100})
        try:
            yield context.pages[0] if context.pages else context.new_page()
        finally:
            context.close()


# MLflow 3.17's UI takes its view (GenAI or model training) from its own switch, not from the experiment's kind
# tag (which earlier 3.x read, and `tracking.connect` sets): this URL parameter sets the switch for a page.
TRAINING_VIEW = "?workflowType=machine_learning"


def shoot(page, url: str, png: Path, wait_for: str, search: str | None = None, names: tuple[str, ...] = ()) -> list[str]:
    """Open `url` in the model-training view, wait for the text `wait_for` (and for a runs table to fill),
    optionally type `search` into the metric search box, let the charts draw, close MLflow's assistant
    panel, screenshot to `png`. Returns the `names` not on the page."""
    from playwright.sync_api import TimeoutError as PageTimeout

    page.goto(url + TRAINING_VIEW)
    try:
        page.get_by_text(wait_for).first.wait_for(timeout=90_000)
        page.wait_for_function("() => !document.body.innerText.includes('0 matching runs')", timeout=90_000)
    except PageTimeout:
        return [f"{wait_for!r} (the page never showed it)"]
    if search:
        box = page.get_by_placeholder("Search metric charts")
        box.wait_for(timeout=60_000)
        box.fill(search)
    page.wait_for_timeout(6000)  # the charts fetch their histories and draw
    with contextlib.suppress(Exception):  # MLflow 3.x's assistant side panel, when it is open
        page.locator("[aria-label='Close']").last.click(timeout=2000)
        page.wait_for_timeout(500)
    page.screenshot(path=str(png))
    html = page.content()
    return [n for n in names if n not in html]


def section_order(page) -> list[str]:
    """The chart sections of a run's metrics page, top to bottom (a header's text: "accuracy(11)Add chart")."""
    headers = page.get_by_test_id("experiment-view-compare-runs-section-header").all_text_contents()
    return [m.group(1) for h in headers if (m := re.match(r"(.+?)\(\d+\)", h))]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--store", help="an MLflow tracking URI to look at (default: run a mini pipeline first)")
    ap.add_argument("--experiment", default="mini")
    ap.add_argument("--out", default=str(ROOT / "docs" / "img"))
    args = ap.parse_args(argv)
    from mlflow import MlflowClient

    work = Path(tempfile.mkdtemp(prefix="igrpo-ui-"))
    store, experiment = (args.store, args.experiment) if args.store else mini_run(work)
    client = MlflowClient(store)
    exp = client.get_experiment_by_name(experiment)
    runs = client.search_runs([exp.experiment_id], max_results=1000)
    parent = next(r for r in runs if "mlflow.parentRunId" not in r.data.tags)
    evals = sorted((r for r in runs if r.info.run_name.endswith("-eval")), key=lambda r: r.info.run_name)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    failed = []
    with mlflow_ui(store, work) as url, browser() as page:
        base = f"{url}/#/experiments/{exp.experiment_id}/runs"
        png = out / "mlflow_experiment.png"
        missing = shoot(page, f"{url}/#/experiments/{exp.experiment_id}", png, "matching run",
                        names=(parent.info.run_name,))
        print(f"experiment {experiment}: {png}  " + ("ok" if not missing else f"MISSING {missing}"))
        failed += missing
        png = out / "mlflow_charts.png"
        missing = shoot(page, f"{base}/{parent.info.run_id}/model-metrics", png, "Model metrics",
                        names=(f"{HEADLINE_SECTION}/greedy", f"{HEADLINE_SECTION}/maj_at_1"))  # drawn on screen
        sections = section_order(page)
        print(f"  sections, top to bottom: {', '.join(sections)}")
        if sections[:1] != [HEADLINE_SECTION]:
            missing.append(f"the {HEADLINE_SECTION} section first")
        print(f"charts of {parent.info.run_name}: {png}  " + ("ok" if not missing else f"MISSING {missing}"))
        failed += missing
        if evals:
            last, png = evals[-1], out / "mlflow_samples.png"
            missing = shoot(page, f"{base}/{last.info.run_id}/artifacts/{SAMPLES_ARTIFACT}", png,
                            SAMPLES_ARTIFACT.split("/")[-1], names=("completion", "verifier", "prm"))
            print(f"samples of {last.info.run_name}: {png}  " + ("ok" if not missing else f"MISSING {missing}"))
            failed += missing
    shutil.rmtree(work, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
