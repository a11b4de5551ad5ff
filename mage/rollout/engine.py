"""The meta-episode engine: many meta-episodes at once, one table row per LLM call.

A meta-episode is N episodes against one hidden opponent from the same initial state,
with a reflection between episodes (docs/method.md, The meta-episode)::

    play(1) -> reflect -> play(2) -> reflect -> ... -> play(N)

Groups of ``group_size`` meta-episodes share an initial-state seed, a seat and (unless
planned ``mixed``, an ablation) an opponent: the GiGPO groups of ``mage.algo``. At every
step the engine asks each live meta-episode for its next call and sends all of them to the
backend in one batch; a meta-episode that has finished stops asking. ``concurrency`` bounds how many meta-
episodes run together (1 gives the sequential baseline of the throughput benchmark).

Rules applied here: the turn limit counts the agent's calls in an episode; an invalid
reply changes nothing but uses up the turn; an episode cut by the turn limit is a loss
with the game's forfeit return; with ``early_stop`` a won episode ends the meta-episode.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import polars as pl
from tqdm.auto import tqdm

import mage.rollout.prompts as prompts
from mage import stopping
from mage.backends.base import Backend, Generation, GenerationRequest
from mage.config.sections import RolloutSection, SamplingSection
from mage.games import Episode, Game, Outcome
from mage.opponents import opponent_for
from mage.protocol import parse_action, parse_remark
from mage.rollout.plan import MetaEpisodeSpec
from mage.rollout.schema import from_rows
from mage.tensors import derive_seed

PROGRESS_SECONDS = 10.0  # a progress line at least this often while a rollout runs (log files too)


class MetaEpisode:
    """The state machine of one meta-episode; it yields requests and consumes replies."""

    def __init__(self, spec: MetaEpisodeSpec, game: Game, cfg: RolloutSection, base: Mapping[str, Any],
                 game_params: Mapping[str, Any] | None = None) -> None:
        self.spec, self.game, self.cfg, self.base = spec, game, cfg, dict(base)
        # the opponent plays the game built with ``game.params`` (an OpenSpiel game's parameters)
        self.opponent = opponent_for(spec.entry, game_params)
        self.first_initial = game.initial_state(spec.seed, spec.seat)
        self.finished: list[prompts.EpisodeRecord] = []
        #: the OpenSpiel histories of the finished episodes: what an opponent that remembers reads
        self.past: list[tuple[int, ...]] = []
        self.rows: list[dict[str, Any]] = []
        self.episode_rows: list[dict[str, Any]] = []
        self.number = 0
        self.phase = "play"
        self.done = False
        self.opponent_calls = 0  # a model-played opponent's calls so far (they make no rows)
        self._start_episode()

    # -- episode lifecycle --------------------------------------------------------------
    def _start_episode(self) -> None:
        self.number += 1
        self.initial = self.first_initial
        if not self.cfg.same_initial_state and self.number > 1:
            self.initial = self.game.initial_state(derive_seed(self.spec.seed, self.number), self.spec.seat)
        if self.opponent is not None:
            self.opponent.reset(derive_seed(self.spec.seed, self.spec.index_in_group, self.number), self.past)
        self.episode: Episode = self.game.new_episode(self.initial, self.opponent)
        self.turns = 0
        self.phase = "play"
        if self.episode.is_terminal:  # the opponent ended it before the agent moved
            self._end_episode()

    def _end_episode(self) -> None:
        episode = self.episode
        truncated = not episode.is_terminal
        outcome = Outcome.LOSS if truncated else episode.outcome()
        episode_return = self.game.forfeit_return(episode) if truncated else episode.agent_return()
        for row in self.episode_rows:
            row.update(episode_return=episode_return, won=outcome == Outcome.WIN, draw=outcome == Outcome.DRAW, truncated=truncated)
        if self.episode_rows:
            self.episode_rows[-1]["step_reward"] = episode_return
            self.episode_rows[-1]["done"] = True
        self.rows += self.episode_rows
        self.episode_rows = []
        if self.opponent is not None:  # a two-player OpenSpiel game
            self.past.append(tuple(episode.state.history()))
        self.last = prompts.EpisodeRecord(self.number, episode.render_history(), episode.describe_end(), episode_return)
        if self.number >= self.cfg.episodes or (self.cfg.early_stop and outcome == Outcome.WIN):
            self.done = True
        elif self.cfg.reflects:
            self.phase = "reflect"
        else:
            self.finished.append(self.last)
            self._start_episode()

    # -- an opponent played by a model (a league snapshot) -----------------------------------
    @property
    def waiting(self) -> bool:
        """The episode waits for a model-played opponent's move (``ModelSeat``)."""
        return not self.done and self.phase == "play" and getattr(self.episode, "opponent_to_move", False)

    def opponent_request(self) -> tuple[GenerationRequest, Any]:
        """The opponent's call: the prompt of a first episode from its own view (its card or
        marks, the moves so far; never the agent's card, reflections or earlier episodes), as
        the snapshot saw first episodes when it trained (``episodes`` of them announced)."""
        view = self.episode.opponent_view()
        prompt = prompts.play_prompt(self.game, view.initial, [], view.render_state(), 1, self.cfg.episodes,
                                     self.cfg.context_mode)
        return GenerationRequest(prompt.text, "play", view), view

    def opponent_moved(self, view: Any, generation: Generation) -> bool:
        """Apply the opponent's reply (a uniformly drawn legal move if it is invalid); whether
        it was valid."""
        parsed = parse_action(generation.text, view.action_aliases(), self.game.moves_per_turn)
        self.opponent_calls += 1
        if parsed.valid:
            action = parsed.actions[0]
        else:
            legal = sorted(view.legal_actions().values())
            action = legal[int(self.opponent.rng.integers(len(legal)))]
        self.episode.apply_opponent_action(action)
        if self.episode.is_terminal:
            self._end_episode()
        return parsed.valid

    # -- calls -----------------------------------------------------------------------------
    @property
    def calls(self) -> int:
        """LLM calls answered so far."""
        return len(self.rows) + len(self.episode_rows)

    def request(self, count_tokens, max_tokens: int | None) -> tuple[GenerationRequest, prompts.Prompt]:
        common = dict(count_tokens=count_tokens, max_tokens=max_tokens, overflow=self.cfg.prompt_overflow)
        if self.phase == "reflect":
            prompt = prompts.reflect_prompt(
                self.game, self.initial, self.finished, self.last, self.cfg.episodes, self.cfg.context_mode, **common
            )
        else:
            prompt = prompts.play_prompt(
                self.game, self.initial, self.finished, self.episode.render_state(),
                self.number, self.cfg.episodes, self.cfg.context_mode, **common,
            )
        return GenerationRequest(prompt.text, self.phase, self.episode), prompt

    def consume(self, prompt: prompts.Prompt, generation: Generation) -> None:
        row = {
            **self.base,
            "group_id": self.spec.group_id,
            "meta_id": self.spec.meta_id,
            "game": self.game.name,
            "opponent": self.spec.entry.id,
            "seat": self.spec.seat,
            "seed": self.spec.seed,
            "initial_state": self.initial.to_json(),
            "prompt": prompt.text,
            "response": generation.text,
            "prompt_token_ids": generation.prompt_token_ids,
            "response_token_ids": generation.token_ids,
            "response_logprobs": generation.logprobs,
            "finish_reason": generation.finish_reason,
            "dropped_episodes": prompt.dropped_episodes,
            "step_reward": 0.0,
            "done": False,
        }
        if self.phase == "reflect":
            remark = parse_remark(generation.text)
            row.update(episode=self.number + 1, turn=0, phase="reflect", observation=self.episode.observation(),
                       action=None, valid=remark.valid, invalid_reason=remark.reason)
            self.finished.append(
                prompts.EpisodeRecord(self.last.number, self.last.history, self.last.result, self.last.episode_return, remark.text)
            )
            self._start_episode()
            self.episode_rows.append(row)  # it belongs to the episode it precedes
            return
        episode = self.episode
        legal = episode.legal_actions()
        parsed = parse_action(generation.text, episode.action_aliases(), self.game.moves_per_turn)
        names = {action: name for name, action in legal.items()}
        self.turns += 1
        row.update(episode=self.number, turn=self.turns, phase="play", observation=episode.observation(),
                   action=", ".join(names[a] for a in parsed.actions) if parsed.valid else None,
                   valid=parsed.valid, invalid_reason=parsed.reason)
        self.episode_rows.append(row)
        if parsed.valid:
            episode.apply_agent_actions(parsed.actions)
        if episode.is_terminal or self.turns >= self.game.turn_limit:
            self._end_episode()


@dataclass
class RolloutStats:
    """Where a rollout's time went (for the throughput benchmark and flow logs)."""

    meta_episodes: int = 0
    calls: int = 0
    backend_calls: int = 0
    generated_tokens: int = 0
    total_seconds: float = 0.0
    generation_seconds: float = 0.0
    #: the calls of opponents played by a model (league snapshots), and how many were invalid
    opponent_calls: int = 0
    opponent_invalid: int = 0

    @property
    def outside_generation_share(self) -> float:
        return 1.0 - self.generation_seconds / self.total_seconds if self.total_seconds else 0.0


class RolloutEngine:
    """Runs planned meta-episodes with a backend; see the module docstring."""

    def __init__(self, backend: Backend, cfg: RolloutSection, game_params: Mapping[str, Any] | None = None,
                 opponents: Mapping[str, Backend] | None = None) -> None:
        self.backend, self.cfg, self.game_params = backend, cfg, dict(game_params or {})
        #: the backends of opponents played by a model (``ModelSeat``), by population entry id
        self.opponents = dict(opponents or {})
        self.last_stats = RolloutStats()

    def _opponent_calls(self, live: Sequence[MetaEpisode],
                        sampling: SamplingSection) -> list[tuple[str, list[MetaEpisode], list[tuple[Any, Any]]]]:
        """The calls of every model-played opponent to move, per opponent: its id, the
        meta-episodes and their (request, view) pairs."""
        by_opponent: dict[str, list[MetaEpisode]] = {}
        for meta in live:
            if meta.waiting:
                by_opponent.setdefault(meta.spec.entry.id, []).append(meta)
        batches = []
        for name, metas in sorted(by_opponent.items()):
            if name not in self.opponents:
                raise ValueError(f"opponent {name} is played by a model, and the rollout has no backend for it")
            calls = [meta.opponent_request() for meta in metas]
            if sampling.seed is not None:  # its own seeds: the agent's calls draw what they drew without it
                for meta, (request, _) in zip(metas, calls):
                    request.seed = derive_seed(sampling.seed, meta.spec.meta_id, meta.opponent_calls, 1)
            batches.append((name, metas, calls))
        return batches

    @staticmethod
    def _opponents_moved(metas: Sequence[MetaEpisode], calls: Sequence[tuple[Any, Any]],
                         generations: Sequence[Generation], stats: RolloutStats) -> None:
        stats.opponent_calls += len(calls)
        for meta, (_, view), generation in zip(metas, calls, generations):
            stats.opponent_invalid += not meta.opponent_moved(view, generation)

    def _move_opponents(self, live: list[MetaEpisode], sampling: SamplingSection, step: int,
                        stats: RolloutStats) -> None:
        """Every model-played opponent whose turn it is moves: one batched call per opponent's
        backend, repeated while an opponent is to move (it may open the next episode)."""
        rounds = 0
        while batches := self._opponent_calls(live, sampling):
            for name, metas, calls in batches:
                step_sampling = sampling if sampling.seed is None else _reseeded(sampling, derive_seed(step, rounds, 1))
                started = time.perf_counter()
                generations = self.opponents[name].generate([request for request, _ in calls], step_sampling)
                stats.generation_seconds += time.perf_counter() - started
                stats.backend_calls += 1
                self._opponents_moved(metas, calls, generations, stats)
            rounds += 1

    def _generate_with_opponents(self, live: Sequence[MetaEpisode], requests: list[GenerationRequest],
                                 sampling: SamplingSection, step_sampling: SamplingSection,
                                 stats: RolloutStats) -> list[Generation]:
        """The agent's ``requests`` and the calls of every model-played opponent to move in
        ``live`` as one batch of the agent's backend (:meth:`Backend.generate_joint`, at the
        step's ``step_sampling``; the opponents' seeds come from the rollout's ``sampling``, as
        without it); the opponents' replies are applied, the agent's returned."""
        batches = self._opponent_calls(live, sampling)
        answered = self.backend.generate_joint(
            [(self.backend, requests), *((self.opponents[name], [r for r, _ in calls]) for name, _, calls in batches)],
            step_sampling)
        for (_, metas, calls), generations in zip(batches, answered[1:]):
            self._opponents_moved(metas, calls, generations, stats)
        return answered[0]

    def _count_tokens(self, text: str) -> int:
        return self.backend.count_prompt_tokens([text])[0]

    def _requests(self, live: Sequence[MetaEpisode], max_tokens: int | None) -> list:
        """Every live meta-episode's next call. Prompts are counted in one batch; only those
        over the limit are rebuilt under the overflow rule."""
        calls = [meta.request(self._count_tokens, None) for meta in live]
        if max_tokens is None:
            return calls
        counts = self.backend.count_prompt_tokens([request.prompt for request, _ in calls])
        return [
            meta.request(self._count_tokens, max_tokens) if count > max_tokens else call
            for meta, call, count in zip(live, calls, counts)
        ]

    def run(
        self,
        specs: Sequence[MetaEpisodeSpec],
        sampling: SamplingSection,
        run_id: str = "run",
        iteration: int = 0,
        progress: bool = True,
        policy_version: int = 0,
    ) -> pl.DataFrame:
        """Play every planned meta-episode; return their calls as a trajectory table, each row
        marked with ``policy_version`` (the updates the backend's weights had seen)."""
        stats = RolloutStats(meta_episodes=len(specs))
        started = time.perf_counter()
        base = {"run_id": run_id, "iteration": iteration, "policy_version": policy_version}
        games = {}
        pending = list(specs)
        live: list[MetaEpisode] = []
        finished: list[MetaEpisode] = []
        max_tokens = self.cfg.max_prompt_tokens
        context_room = self.backend.max_context_tokens - sampling.max_new_tokens
        max_tokens = context_room if max_tokens is None else min(max_tokens, context_room)
        limit = self.cfg.concurrency or len(specs)
        bar = tqdm(total=len(specs), unit="meta-episode", desc=f"rollout {run_id}/{iteration}", disable=not progress)
        shown = time.time()
        step = 0
        # League snapshots on views of the agent's vLLM engine are asked in the agent's batch
        # (each under its own LoRA adapter); elsewhere each opponent's backend is asked in turn, first.
        joint = bool(self.opponents) and self.backend.joins(list(self.opponents.values()))
        while pending or live:
            stopping.check()  # a stop signal reaches only the main thread; this may run on another
            while pending and len(live) < limit:
                spec = pending.pop(0)
                key = tuple(sorted(spec.entry.game_params.items()))
                if key not in games:
                    games[key] = spec.entry.make_game(self.game_params)
                meta = MetaEpisode(spec, games[key], self.cfg, base, self.game_params)
                (finished if meta.done else live).append(meta)
            if not joint and (self.opponents or any(meta.waiting for meta in live)):
                self._move_opponents(live, sampling, step, stats)
                ended = [meta for meta in live if meta.done]
                if ended:
                    live = [meta for meta in live if not meta.done]
                    finished += ended
                    bar.update(len(ended))
                if not live:
                    step += 1  # the next batch draws from seeds of its own
                    continue
            acting = [meta for meta in live if not meta.waiting]  # joint: the others' opponents move meanwhile
            calls = self._requests(acting, max_tokens)
            if sampling.seed is not None:
                # Each call its own seed, from the rollout's seed, the meta-episode and its call
                # number: the members of a group differ though they share a prompt, and the seed
                # does not depend on what else is in the batch (concurrency). The rollout's seed is
                # per (iteration, shard), so a different flow.rollout_shards draws other replies.
                for meta, (request, _) in zip(acting, calls):
                    request.seed = derive_seed(sampling.seed, meta.spec.meta_id, meta.calls)
            step_sampling = sampling if sampling.seed is None else _reseeded(sampling, step)
            t0 = time.perf_counter()
            requests = [request for request, _ in calls]
            generations = self._generate_with_opponents(live, requests, sampling, step_sampling, stats) if joint \
                else self.backend.generate(requests, step_sampling)
            stats.generation_seconds += time.perf_counter() - t0
            stats.backend_calls += 1
            stats.calls += len(calls)
            for meta, (_, prompt), generation in zip(acting, calls, generations):
                stats.generated_tokens += len(generation.token_ids)
                meta.consume(prompt, generation)
            done_now = [meta for meta in live if meta.done]
            live = [meta for meta in live if not meta.done]
            finished += done_now
            bar.set_postfix(calls=stats.calls, refresh=False)
            bar.update(len(done_now))
            # Meta-episodes advance in lockstep and end together, so the count alone stands still
            # for minutes; the calls so far show it moving, in a terminal or a log file.
            now = time.time()  # tqdm's clock: its own last line counts too
            if now - max(shown, getattr(bar, "last_print_t", 0.0)) >= PROGRESS_SECONDS:
                bar.refresh()
                shown = now
            step += 1
        bar.close()
        stats.total_seconds = time.perf_counter() - started
        self.last_stats = stats
        rows = [row for meta in sorted(finished, key=lambda m: m.spec.meta_id) for row in meta.rows]
        return from_rows(rows)


def _reseeded(sampling: SamplingSection, step: int) -> SamplingSection:
    return replace(sampling, seed=derive_seed(sampling.seed, step))
