"""End to end: a Prefect server, the served deployments, and a `pipeline` run started from the UI.

A real ``prefect server`` on 127.0.0.1 and ``python -m flows.deploy`` run as subprocesses (as a
researcher runs them); headless Chromium (Debian's, driven by Playwright) opens the UI, starts
the ``pipeline`` deployment with *Run > Quick run*, follows the run to its page and waits until
the UI shows it Completed. The screenshot is kept in ``$MAGE_SCREENSHOT_DIR`` (default
``artifacts/screenshots``). Both processes are stopped by the test.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest
from conftest import get_json, start_process, stop_process, wait_for

pytestmark = pytest.mark.e2e

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]
REPO = Path(__file__).resolve().parent.parent

if not Path(CHROMIUM).exists():
    if os.environ.get("MAGE_REQUIRE_BROWSER") == "1":  # CI: scripts/setup.sh installs it
        raise RuntimeError(f"Chromium not found at {CHROMIUM}; scripts/setup.sh installs Debian's chromium")
    pytest.skip("Debian's chromium is not installed (scripts/setup.sh installs it)", allow_module_level=True)


@pytest.fixture
def served(tmp_path, tiny_model_dir, prefect_server):
    """The deployments (tiny, one iteration) served to a Prefect server, stopped afterwards."""
    env, api = prefect_server["env"], prefect_server["api"]
    overrides = [
        f"model.path={tiny_model_dir}", "model.build=null", "train.iterations=1", "engine.groups=2",
        "engine.group_size=2", "engine.episodes=2", "engine.sampling.max_new_tokens=6",
        "eval.meta_episodes=2", "eval.sampling.max_new_tokens=6", f"paths.artifacts={tmp_path / 'artifacts'}", f"paths.results={tmp_path / 'results'}",
    ]
    deploy = start_process([sys.executable, "-m", "flows.deploy", *overrides], env, tmp_path / "deploy.log", cwd=REPO)
    try:
        names = lambda: {d["name"] for d in get_json(f"{api}/deployments/filter", {"limit": 50})}  # noqa: E731
        wait_for(lambda: {"pipeline", "nightly_evaluation"} <= names(), 120, "the deployments", deploy, tmp_path / "deploy.log")
        yield {"ui": prefect_server["ui"], "api": api, "log": tmp_path / "deploy.log"}
    finally:
        stop_process(deploy)


def test_pipeline_started_from_the_ui_completes(served):
    from playwright.sync_api import sync_playwright

    screenshots = Path(os.environ.get("MAGE_SCREENSHOT_DIR", REPO / "artifacts" / "screenshots"))
    screenshots.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.goto(f"{served['ui']}/deployments", wait_until="networkidle")
            page.get_by_role("link", name="pipeline", exact=True).first.click()
            page.wait_for_url("**/deployments/deployment/**")
            page.get_by_role("button", name="Run", exact=True).click()
            page.get_by_text("Quick run").click()
            # The run the click created, from the API: the toast that links to it is transient
            # (it slid away unseen in one CI run), so the test opens the run's page itself.
            def top_level_runs() -> list[str]:
                return [r["id"] for r in get_json(f"{served['api']}/flow_runs/filter", {"limit": 10})
                        if r["parent_task_run_id"] is None]

            run_id = wait_for(top_level_runs, 60, "the flow run the click created", log=served["log"])[0]
            page.goto(f"{served['ui']}/runs/flow-run/{run_id}", wait_until="networkidle")

            def finished() -> str | None:
                state = get_json(f"{served['api']}/flow_runs/{run_id}")["state"]["type"]
                return state if state in ("COMPLETED", "FAILED", "CRASHED", "CANCELLED") else None

            assert top_level_runs() == [run_id]  # one run, from the click
            final = wait_for(finished, 420, "the pipeline run", log=served["log"])
            assert final == "COMPLETED", served["log"].read_text()[-4000:]
            page.reload(wait_until="networkidle")
            page.get_by_text("Completed").first.wait_for(timeout=30_000)  # what the researcher sees
            page.screenshot(path=str(screenshots / "pipeline-run-completed.png"), full_page=True)
        finally:
            browser.close()
    assert (screenshots / "pipeline-run-completed.png").stat().st_size > 10_000
