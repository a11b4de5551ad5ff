"""The league: snapshots of the agent among its training opponents, their ratings and the
draw of opponents (docs/method.md, "The league").

Every ``population.league.snapshot_every`` iterations the agent's checkpoint joins the training
population as an opponent played by the model (``snapshot-<iteration>``, a ``ModelSeat``), up to
``max_size``; beyond it the oldest or the lowest-rated leaves. The scripted training opponents
stay, sharing ``1 - share`` of the groups by their own shares; the snapshots share ``share``
by PFSP weights. Held-out opponents never change.

Every training outcome, an episode's win, draw or loss against one opponent, updates the
agent's rating and that opponent's (openskill's Plackett-Luce model), in the order of the
table: the same table gives the same ratings. Opponents are drawn by prioritized fictitious
self-play (PFSP): an opponent's weight is ``(1 - p) ** power``, where ``p`` is the agent's
predicted probability of beating it, so opponents the agent beats get fewer groups, and the
groups are dealt by largest remainder, as the population's shares are.

Ratings are plain ``(mu, sigma)`` pairs, so the league's state is JSON: a resumed run reads
back exactly what it wrote.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import polars as pl
from openskill.models import PlackettLuce

from mage.config.sections import LeagueSection, PopulationEntry
from mage.opponents import MODEL_OPPONENT

#: The agent's entry in the ratings.
AGENT = "agent"
#: A result as the agent scores it: 1 a win, 0.5 a draw, 0 a loss.
WIN, DRAW, LOSS = 1.0, 0.5, 0.0

Ratings = dict[str, tuple[float, float]]


def _model() -> PlackettLuce:
    return PlackettLuce()


def initial(ids: Iterable[str]) -> Ratings:
    """Everyone, the agent included, at openskill's prior (mu 25, sigma 25/3)."""
    model = _model()
    prior = model.rating()
    return {name: (float(prior.mu), float(prior.sigma)) for name in (AGENT, *ids)}


def rated(ratings: Mapping[str, tuple[float, float]], outcomes: Iterable[tuple[str, float]]) -> Ratings:
    """``ratings`` after ``outcomes``, each ``(opponent id, the agent's result)``, in order. An
    opponent not rated yet starts at the prior."""
    model = _model()
    out = dict(ratings)
    prior = model.rating()
    for opponent, result in outcomes:
        if result not in (WIN, DRAW, LOSS):
            raise ValueError(f"an outcome is 1 (win), 0.5 (draw) or 0 (loss), got {result!r}")
        agent = model.rating(*out.get(AGENT, (prior.mu, prior.sigma)))
        other = model.rating(*out.get(opponent, (prior.mu, prior.sigma)))
        ranks = [0, 0] if result == DRAW else [0, 1] if result == WIN else [1, 0]
        [[agent], [other]] = model.rate([[agent], [other]], ranks=ranks)
        out[AGENT], out[opponent] = (float(agent.mu), float(agent.sigma)), (float(other.mu), float(other.sigma))
    return out


def win_probability(ratings: Mapping[str, tuple[float, float]], opponent: str) -> float:
    """The agent's predicted probability of beating ``opponent`` (openskill's ``predict_win``)."""
    model = _model()
    agent, other = model.rating(*ratings[AGENT]), model.rating(*ratings[opponent])
    return float(model.predict_win([[agent], [other]])[0])


def pfsp_weights(ratings: Mapping[str, tuple[float, float]], opponents: Iterable[str], power: float) -> dict[str, float]:
    """Each opponent's PFSP weight ``(1 - p) ** power``, normalised to sum to 1 (equal weights
    where every opponent is beaten for sure)."""
    raw = {name: (1.0 - win_probability(ratings, name)) ** power for name in opponents}
    total = sum(raw.values())
    if not raw:
        return {}
    if total <= 0:
        return {name: 1.0 / len(raw) for name in raw}
    return {name: weight / total for name, weight in raw.items()}


# -- the league's members and state ---------------------------------------------------------------
def member_id(iteration: int) -> str:
    return f"snapshot-{iteration}"


@dataclass(frozen=True)
class Member:
    """A snapshot in the league: the agent's checkpoint after ``iteration``."""

    id: str
    iteration: int
    checkpoint: str  # its folder, relative to the run's (``checkpoints/ckpt-00005``)


@dataclass(frozen=True)
class LeagueState:
    """The league after an iteration: its snapshots, oldest first, and everyone's ratings."""

    members: tuple[Member, ...] = ()
    ratings: Ratings = field(default_factory=dict)

    @classmethod
    def start(cls, population: Sequence[PopulationEntry]) -> LeagueState:
        """Before the first iteration: no snapshot; the agent and the scripted opponents at the prior."""
        return cls((), initial(e.id for e in population))

    def to_json(self) -> dict[str, Any]:
        return {"members": [{"id": m.id, "iteration": m.iteration, "checkpoint": m.checkpoint} for m in self.members],
                "ratings": {name: list(pair) for name, pair in sorted(self.ratings.items())}}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> LeagueState:
        return cls(tuple(Member(str(m["id"]), int(m["iteration"]), str(m["checkpoint"])) for m in data["members"]),
                   {name: (float(mu), float(sigma)) for name, (mu, sigma) in data["ratings"].items()})


def training_entries(population: Sequence[PopulationEntry], state: LeagueState, league: LeagueSection,
                     game: str) -> list[PopulationEntry]:
    """The opponents an iteration draws from: the scripted ones (``1 - share`` of the groups,
    by their shares) and the snapshots (``share``, by PFSP weights); the scripted ones alone
    while the league has no snapshot."""
    if not league.enabled or not state.members:
        return list(population)
    weights = pfsp_weights(state.ratings, [m.id for m in state.members], league.pfsp_power)
    scripted = [replace(e, share=e.share * (1 - league.share)) for e in population]
    return scripted + [PopulationEntry(id=m.id, game=game, opponent=MODEL_OPPONENT, split="train",
                                       share=league.share * weights[m.id], params={}, game_params={})
                       for m in state.members]


def outcomes(table: pl.DataFrame) -> list[tuple[str, float]]:
    """Every episode's result for the agent against its opponent, in the table's order (by
    meta-episode, then episode): 1 a win, 0.5 a draw, 0 a loss."""
    ends = table.filter((pl.col("phase") == "play") & pl.col("done")).sort("meta_id", "episode")
    return [(opponent, WIN if won else DRAW if draw else LOSS)
            for opponent, won, draw in ends.select("opponent", "won", "draw").iter_rows()]


def advanced(state: LeagueState, table: pl.DataFrame, iteration: int, checkpoint: str,
             league: LeagueSection) -> LeagueState:
    """The league after ``iteration``: ratings updated from its training ``table``; on a
    snapshot iteration, the agent's ``checkpoint`` joins (rated as the agent is now) and,
    beyond ``max_size``, the oldest or lowest-rated earlier snapshot leaves."""
    ratings = rated(state.ratings, outcomes(table))
    members = list(state.members)
    if iteration % league.snapshot_every == 0:
        joining = Member(member_id(iteration), iteration, checkpoint)
        ratings[joining.id] = ratings[AGENT]
        if len(members) >= league.max_size:
            leaving = min(members, key=(lambda m: m.iteration) if league.evict == "oldest"
                          else (lambda m: (ratings[m.id][0], m.iteration)))
            members.remove(leaving)
            del ratings[leaving.id]
        members.append(joining)
    return LeagueState(tuple(members), ratings)


def league_metrics(state: LeagueState, entries: Sequence[PopulationEntry]) -> dict[str, float]:
    """What ``metrics.jsonl`` (and dvclive) record of the league after an iteration: every
    rating's mu and sigma, the agent's predicted win probability against each opponent, the
    share of the iteration's groups each was given, and the league's size."""
    out: dict[str, float] = {"league/size": float(len(state.members))}
    for name, (mu, sigma) in sorted(state.ratings.items()):
        out[f"league/{name}/mu"], out[f"league/{name}/sigma"] = mu, sigma
        if name != AGENT:
            out[f"league/{name}/win_probability"] = win_probability(state.ratings, name)
    total = sum(e.share for e in entries)
    for entry in entries:
        out[f"league/{entry.id}/share"] = entry.share / total if total else 0.0
    return out


def rating_rows(history: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The league's ratings per iteration from ``metrics.jsonl`` records, one row per rated
    player: mu, sigma, the agent's predicted probability of beating it, and its share of that
    iteration's groups (None where it had none)."""
    rows = []
    for record in history:
        players = sorted({key.split("/")[1] for key in record if key.startswith("league/") and key.endswith("/mu")})
        rows += [{"iteration": record.get("iteration"), "player": player,
                  **{name: record.get(f"league/{player}/{name}") for name in ("mu", "sigma", "win_probability", "share")}}
                 for player in players]
    return rows
