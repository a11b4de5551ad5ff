"""The tasks of an evaluation (``evaluate-checkpoint``, ``measure-exploitability``,
``write-report``) and :class:`FlowEvaluationSteps`, which runs :func:`mage.run.evaluate` and
:func:`mage.run.report` with each step as one of them."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, ContextManager

from prefect import get_run_logger, task
from prefect.task_runners import TaskRunner

from mage.evaluation import exploitability
from mage.evaluation.play import write_exploitability
from mage.models import checkpoint as ckpt
from mage.run import steps
from mage.run.evaluation import EvaluationSteps, HeldOutTables, Policy
from mage.run.evaluation import write_report as write
from mage.settings import Settings
from tasks.artifacts import publish_markdown
from tasks.caching import TASK_DEFAULTS, ArtifactCachePolicy, configured
from tasks.model import prepare_model
from tasks.population import seed_population
from tasks.refs import FileRef


@task(name="evaluate-checkpoint", task_run_name="evaluate-{split}", cache_policy=ArtifactCachePolicy(step="evaluate"),
      **TASK_DEFAULTS)
def evaluate_split(
    settings: Settings, model: FileRef, checkpoint: FileRef | None, split: str, out_dir: str | None = None
) -> dict[str, Any]:
    """Play ``checkpoint`` (None: the starting policy) against the ``split`` opponents; the table
    and its record go to ``out_dir`` (default: the run's folder for that checkpoint)."""
    model.resolve()
    loaded = ckpt.Checkpoint.at(checkpoint.resolve()) if checkpoint is not None else None
    written = steps.evaluate(settings, loaded, split, out_dir)
    return {"table": FileRef.of(written["table"]), "metrics": FileRef.of(written["metrics"]), "final": written["final"]}


@task(name="measure-exploitability", task_run_name="exploitability", cache_policy=ArtifactCachePolicy(step="exploitability"),
      **TASK_DEFAULTS)
def measure_exploitability(settings: Settings, model: FileRef, checkpoint: FileRef | None, out_dir: str) -> FileRef | None:
    """Where it is measured (Kuhn Poker, an OpenSpiel game that fits): ``checkpoint``'s (None: the
    starting policy's) exploitability, written to ``out_dir/exploitability.json``
    (:func:`mage.evaluation.play.write_exploitability`); None elsewhere."""
    model.resolve()
    loaded = ckpt.Checkpoint.at(checkpoint.resolve()) if checkpoint is not None else None
    written = write_exploitability(settings, loaded, out_dir)
    return FileRef.of(written) if written is not None else None


@task(name="write-report", task_run_name="write-report", cache_policy=ArtifactCachePolicy(step="report"),
      **TASK_DEFAULTS)
def write_report(
    settings: Settings, manifest: FileRef, tables: dict[str, FileRef], about: dict[str, Any], out_dir: str,
    history: FileRef | None = None, start_tables: dict[str, FileRef] | None = None,
    exploitability_files: dict[str, FileRef] | None = None, games: dict[str, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The report of ``tables`` beside ``start_tables``, about ``about``
    (:func:`mage.run.evaluation.write_report`): JSON, metrics, Markdown and plots in ``out_dir``.
    ``games``: each game held out at evaluation, its :class:`~mage.run.evaluation.HeldOutTables`
    as references (:func:`_held_out_refs`)."""
    held_out = {game: HeldOutTables(refs["manifest"].resolve(), _resolved(refs["tables"]),
                                    _resolved(refs["start_tables"]), _resolved(refs["exploitability_files"]))
                for game, refs in (games or {}).items()}
    return write(settings, manifest.resolve(), _resolved(tables), about,
                 Path(out_dir), history.resolve() if history is not None else None,
                 _resolved(start_tables or {}) or None, _resolved(exploitability_files or {}), held_out or None)


def _resolved(refs: Mapping[str, FileRef]) -> dict[str, Path]:
    return {name: ref.resolve() for name, ref in refs.items()}


def _refs(paths: Mapping[str, Path] | None) -> dict[str, FileRef]:
    return {name: FileRef.of(path) for name, path in (paths or {}).items()}


def _held_out_refs(side: HeldOutTables) -> dict[str, Any]:
    """A held-out game's files as references: the report task's cache keys on their content."""
    return {"manifest": FileRef.of(side.manifest), "tables": _refs(side.tables), "start_tables": _refs(side.start_tables),
            "exploitability_files": _refs(side.exploitability_files)}


class FlowEvaluationSteps(EvaluationSteps):
    """The steps of :func:`mage.run.evaluate` and :func:`mage.run.report` as Prefect tasks: each
    play, the exploitability, the manifest and the report is a cached task, and the report a
    Markdown artifact in the UI. ``side_by_side`` (Ray): a started runner to play the splits
    on at once; without it they play one after the other in this process (a vLLM engine is
    one per process)."""

    def __init__(self, settings: Settings,
                 side_by_side: Callable[[], ContextManager[TaskRunner]] | None = None) -> None:
        super().__init__(settings, progress=False)
        self.side_by_side = side_by_side

    @property
    def log(self) -> Any:
        return get_run_logger()  # the flow run's: the UI shows it

    def play(self, policy: Policy | None, splits: Sequence[str], out_dir: Path) -> tuple[dict[str, Any], Path | None]:
        flow_cfg = self.settings.flow
        model = configured(prepare_model, flow_cfg)(self.model_settings)  # the run's model, on a held-out game too
        play_split = configured(evaluate_split, flow_cfg)
        measure = configured(measure_exploitability, flow_cfg) if exploitability.measured(self.settings) else None
        if self.held_out:  # a game held out at evaluation: its task runs named apart from the run's game's
            play_split = play_split.with_options(task_run_name=f"evaluate-{self.held_out}-{{split}}")
            measure = measure and measure.with_options(task_run_name=f"exploitability-{self.held_out}")
        # checked whole and hashed once already (Policy.at): referenced as it is, not read again
        checkpoint = FileRef(path=policy.path, sha256=policy.sha256, kind="checkpoint") if policy is not None else None
        common = {"settings": self.settings, "model": model, "checkpoint": checkpoint, "out_dir": str(out_dir)}
        if self.side_by_side is not None:  # one task per split, side by side on the cluster
            with self.side_by_side() as runner:
                futures = {split: runner.submit(play_split, {**common, "split": split}) for split in splits}
                measured = measure and runner.submit(measure, common)
                results = {split: future.result() for split, future in futures.items()}
                found = measured.result() if measured else None
        else:
            results = {split: play_split(**common, split=split) for split in splits}
            found = measure(**common) if measure else None
        return ({split: {"table": Path(r["table"].path), "final": r["final"]} for split, r in results.items()},
                Path(found.resolve()) if found is not None else None)

    def manifest(self) -> Path:
        return configured(seed_population, self.settings.flow)(self.settings).resolve()

    def write_report(self, manifest: Path, tables: Mapping[str, Path], about: dict[str, Any], out_dir: Path,
                     history: Path | None, start_tables: Mapping[str, Path] | None,
                     exploitability_files: Mapping[str, Path],
                     games: Mapping[str, HeldOutTables] | None = None) -> dict[str, Any]:
        return configured(write_report, self.settings.flow)(
            self.settings, FileRef.of(manifest), _refs(tables), about, str(out_dir),
            FileRef.of(history) if history is not None else None, _refs(start_tables) or None,
            _refs(exploitability_files), {game: _held_out_refs(side) for game, side in (games or {}).items()} or None)

    def publish(self, title: str, markdown: Path, description: str) -> None:
        publish_markdown(title, markdown.read_text(), description)
