"""What every flow shares: settings from overrides, the task runner, task options, logging."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from prefect import get_run_logger
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.task_runners import ProcessPoolTaskRunner, TaskRunner, ThreadPoolTaskRunner

from mage.settings import FlowConfig, Settings, load_settings
from tasks.caching import backoff


def settings_for(overrides: Sequence[str] | None, config_file: str | None) -> Settings:
    """Compose and validate before any work: a wrong key fails the flow run at once."""
    return load_settings(list(overrides or []), config_file)


def local_timezone() -> str:
    """This machine's time zone (the nightly schedule's default)."""
    import tzlocal

    return tzlocal.get_localzone_name() or "UTC"


def make_runner(flow_cfg: FlowConfig) -> TaskRunner:
    """The task runner that fans rollout shards out (``flow.runner``)."""
    if flow_cfg.runner == "ray":
        from flows.ray_cluster import ray_runner

        return ray_runner(flow_cfg)
    if flow_cfg.runner == "process":
        return ProcessPoolTaskRunner(max_workers=flow_cfg.max_workers)
    if flow_cfg.runner == "sequential":
        return ThreadPoolTaskRunner(max_workers=1)
    return ThreadPoolTaskRunner(max_workers=flow_cfg.max_workers)


@contextlib.contextmanager
def shard_workers(settings: Settings, runner: TaskRunner, shards: int) -> Iterator[TaskRunner]:
    """Inside a started ``runner``: the runner to submit rollout shards to. On Ray the cluster
    is checked first, and with long-lived workers the run's actors are held until the block
    ends; a shard task then only hands its shard to its actor and waits, so it runs on a
    thread of this process (a Ray task would start a Ray worker process for that wait)."""
    if settings.flow.runner != "ray":
        yield runner
        return
    from flows.ray_cluster import on_ray

    with on_ray(settings, shards) as actors:
        if not actors:
            yield runner
            return
        with ThreadPoolTaskRunner(max_workers=len(actors)) as dispatcher:
            yield dispatcher


@contextlib.contextmanager
def shard_options(flow_cfg: FlowConfig) -> Iterator[None]:
    """Tasks submitted inside to the Ray runner take a shard's resources (``flow.ray``); other runners ignore this."""
    if flow_cfg.runner != "ray":
        yield
        return
    from flows.ray_cluster import shard_resources

    with shard_resources(flow_cfg):
        yield


def configured(task: Any, flow_cfg: FlowConfig) -> Any:
    """``task`` with the retries of ``params/flow`` (exponential backoff)."""
    return task.with_options(retries=flow_cfg.retries,
                             retry_delay_seconds=backoff(flow_cfg.retry_delay_seconds, flow_cfg.retries))


def artifact_key(*parts: str) -> str:
    """Prefect artifact keys allow lower-case letters, digits and dashes only."""
    text = "-".join(parts).lower()
    return "".join(c if c.isalnum() else "-" for c in text).strip("-")


def describe_iteration(metrics: Mapping[str, Any]) -> str:
    """One log line per iteration: what a researcher watches while training runs."""
    opponents = sorted({key.split("/")[1] for key in metrics if key.startswith("rollout/") and key.count("/") == 2
                        and key.endswith("final_win_rate")} - {"all"})
    per_opponent = ", ".join(f"{o} {metrics[f'rollout/{o}/final_win_rate']:.2f}" for o in opponents)
    return (
        f"iteration {metrics['iteration']}: final-episode return {metrics.get('rollout/all/final_mean_return', float('nan')):+.2f}, "
        f"win rate {metrics.get('rollout/all/final_win_rate', float('nan')):.2f} ({per_opponent}); "
        f"invalid {metrics.get('rollout/invalid_rate', float('nan')):.3f}; loss {metrics.get('train/loss', float('nan')):+.4f}, "
        f"KL {metrics.get('train/kl', float('nan')):.4f}; rollout {metrics.get('rollout/meta_episodes_per_second', 0):.1f} "
        f"meta-episodes/s, update {metrics.get('train/tokens_per_second', 0):.0f} tokens/s"
    )


TABLE_COLUMNS = (
    ("iteration", "iteration"),
    ("rollout/all/final_mean_return", "final return"),
    ("rollout/all/final_win_rate", "final win rate"),
    ("rollout/all/return_gain", "return gain"),
    ("rollout/invalid_rate", "invalid rate"),
    ("train/loss", "loss"),
    ("train/kl", "KL"),
    ("train/entropy", "entropy"),
    ("rollout/meta_episodes_per_second", "meta-episodes/s"),
    ("train/tokens_per_second", "train tokens/s"),
)


def publish_training_table(run_name: str, history: Sequence[Mapping[str, Any]]) -> None:
    """The per-iteration metrics as a table artifact (the UI's Artifacts tab)."""
    rows = [{label: _rounded(m.get(key)) for key, label in TABLE_COLUMNS} for m in history]
    create_table_artifact(table=rows, key=artifact_key(run_name, "training"),
                          description=f"Training metrics of {run_name}, one row per iteration")


def publish_markdown(key: str, markdown: str, description: str) -> None:
    create_markdown_artifact(markdown=markdown, key=artifact_key(key), description=description)


def _rounded(value: Any) -> Any:
    return round(value, 4) if isinstance(value, float) else value


def logger():
    return get_run_logger()
