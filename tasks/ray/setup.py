"""What every Ray worker process of a flow is set up with, kept apart from the tasks' code.

Ray imports the module of ``worker_process_setup_hook`` in every worker process it starts:
idle ones it starts ahead of work, and Ray Train's controller and bookkeeping actors among
them. This module imports nothing heavy (nor do the package faces Python runs first,
``tasks/__init__.py`` and ``tasks/ray/__init__.py``), so those pay for Ray alone; the workers
that play or train import the library when they unpickle their task (``tasks.ray.rollouts``,
``tasks.ray.update``). With the hook in the rollout actors' module every worker imported torch
and transformers first (BENCHMARKS.md, "The test suite": what that cost a worker, and the suite).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

#: The Ray namespace of the flows' named actors.
NAMESPACE = "mage"
#: Set by the runner for every Ray worker: the driver's working directory, where the
#: config's relative paths (``paths.artifacts``) start.
PROJECT_DIR = "MAGE_PROJECT_DIR"


def worker_runtime_env(env_vars: dict[str, str]) -> dict[str, Any]:
    """The runtime environment of a flow's Ray workers: ``env_vars``, the driver's working
    directory among them, and :func:`enter_project_dir` run first in every worker process."""
    return {"env_vars": {PROJECT_DIR: os.getcwd(), **env_vars},
            "worker_process_setup_hook": f"{__name__}.{enter_project_dir.__name__}"}


def enter_project_dir() -> None:
    """Ray's ``worker_process_setup_hook``: every Ray worker process starts in the driver's
    working directory, so the config's relative paths mean the same files. A node without
    that directory stays where it is, and the cluster check names it."""
    wanted = os.environ.get(PROJECT_DIR)
    if wanted and Path(wanted).is_dir():
        os.chdir(wanted)


def project_dir_problem() -> str | None:
    """Why this worker is not in the driver's working directory (None: it is)."""
    wanted = os.environ.get(PROJECT_DIR)
    if not wanted or (Path(wanted).is_dir() and Path.cwd().samefile(wanted)):
        return None
    return (f"has no {wanted}, the driver's working directory: every node needs the project at the same path "
            "(docs/gpu.md, 'What a cluster needs')")
