"""The evaluate and report flows as library calls: a checkpoint, and beside it the starting
policy on the same initial states, played against a split of the population; and the report
of such tables. Works from a notebook::

    from mage.run import evaluate, report
    from mage.settings import load_settings

    settings = load_settings(["game=kuhn_poker"])
    evaluate(settings)   # the run's final checkpoint and the starting policy, reported side by side
    report(settings)     # the report of the final checkpoint's tables, into paths.report

The Prefect flows (``flows/evaluation.py``) call these same functions with steps that run each
play and the report as a task (``tasks.evaluation.FlowEvaluationSteps``): cached, retried and
shown in the UI, the splits side by side on a Ray cluster. What is paired with what, what is
refused, what the report says it is about, and when ``paths.metrics`` is written are decided
here, once.

Games held out at evaluation (``eval.games``) are played by the same checkpoint and the same
starting policy as the run's own game, each against its own population
(:func:`mage.settings.held_out_settings`), into a folder of its name inside the evaluation's
(:func:`mage.run.layout.held_out_dir`); the report has a section per game.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mage import io
from mage.config.sections import SPLITS, splits_of
from mage.evaluation import exploitability
from mage.evaluation.play import (
    EXPLOITABILITY_FILE,
    recorded_policy,
    same_policy,
    same_sampling,
    write_exploitability,
)
from mage.models import checkpoint as ckpt
from mage.population.manifest import load_manifest, seed_population, write_manifest
from mage.report.tables import build_report, headline_metrics, held_out_game
from mage.report.tables import write_report as write_report_files
from mage.rollout import read_trajectories
from mage.run.layout import RunLayout, evaluation_dir, held_out_dir
from mage.run.layout import evaluation_dir as evaluation_dir_of  # report() takes a parameter of that name
from mage.run.record import METRICS_REMEDY
from mage.settings import Settings, held_out_settings

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Policy:
    """A checkpoint by path and content hash (:func:`mage.models.checkpoint.content_hash`), as a
    report names it; ``None`` in its place is the starting policy."""

    path: str
    sha256: str | None

    @classmethod
    def at(cls, path: str | Path) -> Policy:
        """The checkpoint at ``path``, checked whole (a damaged one is an error naming its file)."""
        if not (Path(path) / ckpt.MANIFEST).is_file():
            raise FileNotFoundError(f"cannot reference {path}: it does not exist (or is an incomplete checkpoint)")
        ckpt.require_complete(path)
        return cls(str(path), ckpt.content_hash(path))

    @classmethod
    def recorded(cls, record: Mapping[str, Any]) -> Policy | None:
        """The checkpoint a tables' policy record names (not checked against the disk: it only labels)."""
        return None if record["checkpoint"] is None else cls(record["checkpoint"], record["checkpoint_sha256"])


def final_policy(settings: Settings, run: str | None = None) -> Policy | None:
    """The final checkpoint of run ``run`` (default ``run.name``; :meth:`RunLayout.final_checkpoint`),
    or None: none yet, so the starting policy."""
    found = RunLayout.of(settings, run).final_checkpoint()
    return Policy.at(found) if found is not None else None


def start_policy(settings: Settings) -> str:
    """What a run starts from, in words: the tiny warm start (and whom it imitates) or the base model."""
    model = settings.model
    if model.tiny is not None and model.build == "tiny":
        rules = ", ".join(r if isinstance(r, str) else str(r.get("rule")) for r in model.tiny.bc_rules)
        return f"{model.path} (the tiny preset's warm start: behaviour cloning of {rules})"
    return f"{model.local_dir or model.path} (the base model {model.path})"


def report_about(settings: Settings, policy: Policy | None, record: Mapping[str, Any] | None,
                 compared_with: str | None) -> dict[str, Any]:
    """What a report is about: the policy that played (its tables' own ``record`` where they
    have one, which also names the iteration and the sampling), the run, the game, and the
    checkpoint whose tables stand in for the starting policy's (``compared_with``)."""
    if record is not None:
        policy, iteration, sampling = Policy.recorded(record), record["iteration"], record["sampling"]
    else:
        iteration = ckpt.Checkpoint.at(policy.path).iteration if policy is not None else 0
        sampling = dataclasses.asdict(settings.eval.sampling)
    about = {
        "checkpoint": policy.path if policy is not None else f"the starting policy {start_policy(settings)}",
        "checkpoint_sha256": policy.sha256 if policy is not None else None,
        "iteration": iteration,
        "run": settings.run_name,
        "started_from": start_policy(settings),
        "game": settings.game.name,
        "sampling": sampling,
    }
    if compared_with is not None:
        about["compared_with"] = compared_with
    return about


@dataclass(frozen=True)
class HeldOutTables:
    """A game held out at evaluation, as a report takes it (:func:`write_report`): its population
    manifest, the evaluated policy's tables (split -> path), the starting policy's (empty: none)
    and the ``exploitability.json`` of either side (``policy``, ``start``) where it is measured."""

    manifest: Path
    tables: Mapping[str, Path]
    start_tables: Mapping[str, Path]
    exploitability_files: Mapping[str, Path]


def write_report(settings: Settings, manifest: Path, tables: Mapping[str, Path], about: dict[str, Any], out_dir: Path,
                 history: Path | None = None, start_tables: Mapping[str, Path] | None = None,
                 exploitability_files: Mapping[str, Path] | None = None,
                 games: Mapping[str, HeldOutTables] | None = None) -> dict[str, Any]:
    """The report of evaluation ``tables`` (split -> table) beside the ``start_tables`` played on
    the same initial states: JSON, metrics, Markdown and plots in ``out_dir``. ``history``: the
    run's ``metrics.jsonl`` (learning curves); ``exploitability_files``: Kuhn Poker's
    ``exploitability.json`` of either side (``policy``, ``start``); ``games``: the games held out
    at evaluation, by name, each with a section of its own."""
    history_records = io.read_json_lines(history, METRICS_REMEDY) if history is not None else []
    start = {split: read_trajectories(path) for split, path in (start_tables or {}).items()}
    held_out = {}
    for game, side in (games or {}).items():
        game_start = {split: read_trajectories(path) for split, path in side.start_tables.items()}
        held_out[game] = held_out_game({split: read_trajectories(path) for split, path in side.tables.items()},
                                       load_manifest(side.manifest), settings.eval.episodes, settings.eval.early_stop,
                                       game_start or None,
                                       {name: io.read_json(path) for name, path in side.exploitability_files.items()})
    report = build_report({split: read_trajectories(path) for split, path in tables.items()}, load_manifest(manifest),
                          about, settings.eval.episodes, settings.eval.early_stop, start_tables=start or None,
                          history=history_records, training_temperature=settings.engine.sampling.temperature,
                          exploitability={side: io.read_json(path) for side, path in (exploitability_files or {}).items()},
                          games=held_out or None)
    written = write_report_files(report, out_dir, history=history_records)
    return {"directory": str(out_dir), "files": {name: str(path) for name, path in written.items()},
            "metrics": headline_metrics(report)}


class EvaluationSteps:
    """The steps of an evaluation and its report, each run in this process. The flows run each
    as a Prefect task instead (``tasks.evaluation.FlowEvaluationSteps``); what the steps are
    given and return is the same either way: paths, and a checkpoint as a :class:`Policy`."""

    def __init__(self, settings: Settings, progress: bool = True) -> None:
        self.settings = settings
        self.progress = progress
        # the run's: what prepares the model, on a held-out game too (its build is the run's game's)
        self.model_settings = settings
        self.held_out: str | None = None  # the game held out at evaluation these steps play, if any
        self._games: dict[str, EvaluationSteps] = {}

    @property
    def log(self) -> Any:
        return logger

    def for_game(self, game: str) -> EvaluationSteps:
        """These steps on ``game``, held out at evaluation (``eval.games``): its settings are
        :func:`mage.settings.held_out_settings`' (the game's own population, the run's model and
        evaluation), the model is prepared as the run's."""
        if game not in self._games:
            steps = copy.copy(self)
            steps.settings, steps.held_out, steps._games = held_out_settings(self.settings, game), game, {}
            self._games[game] = steps
        return self._games[game]

    def play(self, policy: Policy | None, splits: Sequence[str], out_dir: Path) -> tuple[dict[str, Any], Path | None]:
        """``policy`` (None: the starting policy) against every split: per split its table's path
        and its final rows; and Kuhn Poker's ``exploitability.json``, where it is measured."""
        from mage.run import steps as run_steps
        from mage.warmstart import prepare_model

        prepare_model(self.model_settings, progress=self.progress)
        loaded = ckpt.Checkpoint.at(policy.path) if policy is not None else None
        results = {split: run_steps.evaluate(self.settings, loaded, split, out_dir, progress=self.progress)
                   for split in splits}
        measured = write_exploitability(self.settings, loaded, out_dir) if exploitability.measured(self.settings) else None
        return {split: {"table": Path(r["table"]), "final": r["final"]} for split, r in results.items()}, measured

    def manifest(self) -> Path:
        """The population manifest, seeded and written (``paths.population_manifest``)."""
        return write_manifest(seed_population(self.settings, progress=self.progress),
                              self.settings.paths.population_manifest)

    def write_report(self, manifest: Path, tables: Mapping[str, Path], about: dict[str, Any], out_dir: Path,
                     history: Path | None, start_tables: Mapping[str, Path] | None,
                     exploitability_files: Mapping[str, Path],
                     games: Mapping[str, HeldOutTables] | None = None) -> dict[str, Any]:
        return write_report(self.settings, manifest, tables, about, out_dir, history, start_tables,
                            exploitability_files, games)

    def publish(self, title: str, markdown: Path, description: str) -> None:
        """A report's Markdown file where people look (the flows: an artifact in the Prefect UI);
        the library has nowhere to show it but the file itself."""


def tables_in(directory: Path) -> dict[str, Path]:
    """The evaluation tables (``train.parquet``, ``held_out.parquet``) that ``directory`` holds."""
    return {split: directory / f"{split}.parquet" for split in SPLITS if (directory / f"{split}.parquet").is_file()}


def exploitability_beside(tables: Mapping[str, Path] | None) -> Path | None:
    """The ``exploitability.json`` that the evaluation which wrote ``tables`` wrote beside them (Kuhn Poker)."""
    if not tables:
        return None
    found = Path(next(iter(tables.values()))).parent / EXPLOITABILITY_FILE
    return found if found.is_file() else None


def play(steps: EvaluationSteps, policy: Policy | None, splits: Sequence[str], out_dir: Path) -> dict[str, Path]:
    """The evaluation tables of ``policy`` against every split, written into ``out_dir``."""
    results, measured = steps.play(policy, splits, out_dir)
    game = f"{steps.held_out}, " if steps.held_out else ""  # a game held out at evaluation: named in each line
    if measured is not None:
        figures = io.read_json(measured)
        steps.log.info(f"{game}exploitability {figures['exploitability']:.4f} {figures['units']} (NashConv "
                       f"{figures['nash_conv']:.4f}; against a best response "
                       f"{figures['value_vs_best_response']['mean']:+.4f})")
    for split, result in results.items():
        for row in result["final"]:
            steps.log.info(f"{game}{split} {row['opponent']}: first-episode win rate {row['first_win_rate']:.2f}, "
                           f"final {row['final_win_rate']:.2f}, final mean return {row['final_mean_return']:+.2f}")
    return {split: Path(result["table"]) for split, result in results.items()}


def play_held_out(steps: EvaluationSteps, policy: Policy | None, splits: Sequence[str], out_dir: Path
                  ) -> dict[str, dict[str, Path]]:
    """``policy`` on every game of ``eval.games``, against the ``splits`` of that game's own
    population: per game, its tables, written into ``out_dir/<game>``."""
    return {game: play(steps.for_game(game), policy, splits, held_out_dir(out_dir, game))
            for game in steps.settings.eval.games}


def report_on(steps: EvaluationSteps, tables: Mapping[str, Path], policy: Policy | None, out_dir: Path, title: str,
              start_tables: Mapping[str, Path] | None = None, record: Mapping[str, Any] | None = None,
              compared_with: str | None = None, games: Mapping[str, Mapping[str, Path]] | None = None,
              start_games: Mapping[str, Mapping[str, Path]] | None = None) -> dict[str, Any]:
    """Write the report of evaluation ``tables`` (beside ``start_tables``; ``record`` and
    ``compared_with`` as in :func:`report_about`) into ``out_dir``, and publish it. ``games``
    (``start_games``): the tables of each game held out at evaluation, by name, of the same
    policy (of the same start)."""
    settings = steps.settings
    history = RunLayout.of(settings).metrics
    sides = (("policy", exploitability_beside(tables)), ("start", exploitability_beside(start_tables)))
    about = report_about(settings, policy, record, compared_with)
    held_out = {}
    for game, game_tables in (games or {}).items():
        game_start = (start_games or {}).get(game) or {}
        measured = (("policy", exploitability_beside(game_tables)), ("start", exploitability_beside(game_start)))
        held_out[game] = HeldOutTables(steps.for_game(game).manifest(), game_tables, game_start,
                                       {side: path for side, path in measured if path is not None})
    if held_out:
        about["held_out_games"] = list(held_out)
    report = steps.write_report(steps.manifest(), tables, about, out_dir, history if history.is_file() else None,
                                start_tables or None, {side: path for side, path in sides if path is not None},
                                held_out or None)
    steps.publish(title, Path(report["files"]["markdown"]),
                  f"Evaluation report ({', '.join(tables)}) of {policy.path if policy else 'the starting policy'}")
    metrics = report["metrics"]
    for split in [*tables, *(f"{game}/{split}" for game in held_out for split in tables)]:
        if f"{split}/gain_over_start" in metrics:
            steps.log.info(f"{split}: final-episode win rate {metrics[f'{split}/start_final_win_rate']:.3f} at the "
                           f"start, {metrics[f'{split}/final_win_rate']:.3f} now ({metrics[f'{split}/gain_over_start']:+.3f})")
    steps.log.info(f"report: {report['files']['markdown']}")
    return report


def evaluate(settings: Settings, checkpoint: str | Path | None = None, split: str | None = None,
             out_dir: str | Path | None = None, report: bool = True, start: bool = False, title: str | None = None,
             steps: EvaluationSteps | None = None) -> dict[str, Any]:
    """Evaluate ``checkpoint`` (default: the run's final one; none yet: the starting policy), or
    with ``start`` the starting policy itself (the tiny warm start or the base model), against
    the opponents of ``split`` (default ``eval.split``; ``all``: training and held-out), per
    episode and per opponent; and on each game of ``eval.games``, against the same splits of
    that game's population. The tables go to ``out_dir`` (default
    ``paths.evaluations/<run>/<checkpoint>``, or ``paths.start_evaluation``; a held-out game's
    into ``<out_dir>/<game>``) and, with ``report``, the report beside them: a checkpoint's
    beside the starting policy's tables, played on the same initial states. ``title`` names the
    published report."""
    steps = steps or EvaluationSteps(settings)
    splits = splits_of(split or settings.eval.split)
    if start and checkpoint:
        raise ValueError("give a checkpoint or start=True (the starting policy), not both")
    policy = None if start else Policy.at(checkpoint) if checkpoint else final_policy(settings)
    directory = Path(out_dir) if out_dir else evaluation_dir(settings, policy.path if policy else None)
    tables = play(steps, policy, splits, directory)
    games = play_held_out(steps, policy, splits, directory)
    if not report:
        return {"directory": str(directory), "tables": {split: str(path) for split, path in tables.items()},
                "games": {game: {split: str(path) for split, path in played.items()} for game, played in games.items()}}
    start_dir = evaluation_dir(settings, None)
    start_tables = None if policy is None else play(steps, None, splits, start_dir)
    start_games = None if policy is None else play_held_out(steps, None, splits, start_dir)
    return report_on(steps, tables, policy, directory, title or f"{settings.run_name}-evaluation", start_tables,
                     games=games, start_games=start_games)


def report(settings: Settings, evaluation_dir: str | Path | None = None, out_dir: str | Path | None = None,
           start_dir: str | Path | None = None, steps: EvaluationSteps | None = None) -> dict[str, Any]:
    """The report of the evaluation tables in ``evaluation_dir`` (default: those of the run's
    final checkpoint) beside the starting policy's in ``start_dir`` (default
    ``paths.start_evaluation``, if it holds the same splits), written to ``out_dir`` (default
    ``paths.report``): JSON, metrics, Markdown and plots; with a section per game of
    ``eval.games``, whose tables are in ``<evaluation_dir>/<game>`` (``<start_dir>/<game>``). The
    tables' own record names the policy and the sampling. Only a report of the run's final
    checkpoint against its starting policy updates ``paths.metrics`` (what ``dvc exp show`` lists)."""
    steps = steps or EvaluationSteps(settings)
    log = steps.log
    final = final_policy(settings)
    source = Path(evaluation_dir) if evaluation_dir else evaluation_dir_of(settings, final.path if final else None)
    tables = tables_in(source)
    if not tables:
        raise FileNotFoundError(f"no evaluation table (train.parquet, held_out.parquet) in {source}")
    record = recorded_policy(tables)
    # the policy that played the tables, where they record it; else the run's final checkpoint
    policy = Policy.recorded(record) if record is not None else final
    if record is None:
        log.warning(f"{source}: its tables record no policy (written before tables recorded it, or the record "
                    "is damaged); the report names the run's final checkpoint, "
                    f"{final.path if final else 'none'}, and the configured sampling")
    is_final = (policy.sha256 if policy else None) == (final.sha256 if final else None)
    if not evaluation_dir and not is_final:
        log.warning(f"{source}: its tables were played by {record['checkpoint']}, not by the run's final "
                    f"checkpoint {final.path if final else '(none)'}; the report names the tables' policy")
    start, compared_with = start_for(steps, tables, record, source, start_dir, paired=policy is not None)
    games, start_games = held_out_for(steps, tables, record, source, start_dir, start, compared_with)
    target = Path(out_dir) if out_dir else Path(settings.paths.report)
    written = report_on(steps, tables, policy, target, f"{settings.run_name}-report", start, record, compared_with,
                        games, start_games)
    if is_final and compared_with is None:
        # the headline numbers where git (and so `dvc exp show`) tracks them: the run's final report's
        io.write_json(settings.paths.metrics, written["metrics"])
    else:
        log.info(f"{settings.paths.metrics} is left as it was: it holds the run's final checkpoint against its "
                 "starting policy, and this report is of another pair")
    return written


def start_for(steps: EvaluationSteps, tables: Mapping[str, Path], record: Mapping[str, Any] | None, source: Path,
              start_dir: str | Path | None, paired: bool) -> tuple[dict[str, Path], str | None]:
    """The tables to pair ``tables`` with (from ``start_dir``, default the starting policy's),
    checked against them, and the checkpoint they are of when not the starting policy's."""
    start_source = Path(start_dir) if start_dir else evaluation_dir(steps.settings, None)
    start = tables_in(start_source)
    if start_dir and set(start) != set(tables):
        raise FileNotFoundError(f"{start_dir} holds {sorted(start) or 'no'} evaluation tables, the report needs "
                                f"{sorted(tables)}")
    if not paired or set(start) != set(tables):
        if start_dir:
            steps.log.warning(f"{source} holds the starting policy's own tables: the report pairs them with nothing, "
                              f"and {start_dir} is not used")
        return {}, None
    start_record = recorded_policy(start)
    if (record is None) != (start_record is None):
        steps.log.warning(f"{source if record is None else start_source}: its tables record no policy, so the "
                          "report cannot check that both sides were played at the same sampling")
    if record is not None and start_record is not None:
        if not same_sampling(record, start_record):
            raise io.IncompatibleFilesError(
                f"{start_source} was played at sampling {start_record['sampling']}, {source} at "
                f"{record['sampling']}: a gain paired by initial state compares two policies at one sampling; "
                "evaluate both with the same eval.sampling")
        if same_policy(record, start_record):
            raise io.IncompatibleFilesError(f"{start_source} and {source} hold tables of one policy, "
                                            f"{record['checkpoint'] or 'the starting policy'}: nothing to compare")
    return start, start_record["checkpoint"] if start_record else None


def held_out_for(steps: EvaluationSteps, tables: Mapping[str, Path], record: Mapping[str, Any] | None, source: Path,
                 start_dir: str | Path | None, start: Mapping[str, Path], compared_with: str | None
                 ) -> tuple[dict[str, dict[str, Path]], dict[str, dict[str, Path]]]:
    """For each game of ``eval.games``: its tables in ``source/<game>``, which must hold the
    splits of ``tables`` played by the same policy (by their records); and where ``tables`` are
    paired with a ``start``, that game's start tables in ``<start dir>/<game>``, checked as
    :func:`start_for` checks them and of the same policy as ``start`` (``compared_with``)."""
    games: dict[str, dict[str, Path]] = {}
    start_games: dict[str, dict[str, Path]] = {}
    start_source = Path(start_dir) if start_dir else evaluation_dir(steps.settings, None)
    for game in steps.settings.eval.games:
        game_source = held_out_dir(source, game)
        found = tables_in(game_source)
        if set(found) != set(tables):
            raise FileNotFoundError(f"{game_source} holds {sorted(found) or 'no'} evaluation tables of {game} (held "
                                    f"out at evaluation: eval.games), the report needs {sorted(tables)}; evaluate "
                                    "with the same eval.games and split")
        game_record = recorded_policy(found)
        if record is not None and game_record is not None and not same_policy(record, game_record):
            raise io.IncompatibleFilesError(
                f"{game_source} was played by {game_record['checkpoint'] or 'the starting policy'} at sampling "
                f"{game_record['sampling']}, {source} by {record['checkpoint'] or 'the starting policy'} at "
                f"{record['sampling']}: one report is about one policy on every game")
        games[game] = found
        if start:
            game_start, game_compared = start_for(steps.for_game(game), found, game_record, game_source,
                                                  held_out_dir(start_source, game), paired=True)
            if game_compared != compared_with:
                raise io.IncompatibleFilesError(
                    f"{held_out_dir(start_source, game)} holds tables of {game_compared or 'the starting policy'}, "
                    f"{start_source} of {compared_with or 'the starting policy'}: a report compares one pair of "
                    "policies on every game")
            start_games[game] = game_start
    return games, start_games
