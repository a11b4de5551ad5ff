"""Every typed section of ``params/``, in one place: the game, the population, the engine
and its sampling, the model and its LoRA and tiny build, the algorithm, the trainer, the
evaluation, the flows, the paths and the run.

Every section is a pydantic dataclass: types and ranges are checked on construction, fixed
choices are ``Literal``\\ s, and rules between the fields of one section raise in
``__post_init__`` (rules between sections: :mod:`mage.settings`). No field has a default
here: every default lives in ``params/``, and :func:`mage.settings.build` requires every key,
so a value cannot differ between the YAML and the code. (The keys of a population entry
are the exception: an entry without ``params`` has none.)

This module sits on the ground floor: the library's other modules import their settings
from here, and it imports only the games and the reply protocol.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
from collections.abc import Mapping
from typing import Annotated, Any, Literal, get_args

from pydantic import Field
from pydantic.dataclasses import dataclass as validated_dataclass

from mage.games import GAMES, Game, checked_game, is_openspiel_name, make_game
from mage.protocol import PHASE_STOP_STRINGS, STOP_STRINGS

PositiveInt = Annotated[int, Field(ge=1)]
NonNegativeInt = Annotated[int, Field(ge=0)]
NonNegative = Annotated[float, Field(ge=0)]
Share = Annotated[float, Field(ge=0, le=1)]
Discount = Annotated[float, Field(ge=0, le=1)]
AdamBeta = Annotated[float, Field(ge=0, lt=1)]

#: The two sets of opponents: trained against, and held out for evaluation.
SplitName = Literal["train", "held_out"]
SPLITS: tuple[str, ...] = get_args(SplitName)
#: What an evaluation plays: one split, or both (``all``).
Split = Literal[SplitName, "all"]
#: The name of a config group option (``params/game/<name>.yaml``), as ``eval.games`` lists it.
GAME_OPTION = re.compile(r"[A-Za-z0-9_]+")


def splits_of(split: str) -> tuple[str, ...]:
    """The splits an evaluation of ``split`` plays (``all``: both)."""
    if split not in get_args(Split):
        raise ValueError(f"split must be one of {list(get_args(Split))}, got {split!r}")
    return SPLITS if split == "all" else (split,)


# -- sampling -------------------------------------------------------------------------------
@validated_dataclass(frozen=True)
class SamplingSection:
    """How replies are sampled (``engine.sampling``, ``eval.sampling``); ``top_k`` 0 and
    ``top_p`` 1.0 switch those filters off.

    ``stop`` None ends each reply at its phase's closing tag (:data:`mage.protocol.PHASE_STOP_STRINGS`);
    a tuple replaces that for every phase (``()``: no stop string)."""

    temperature: Annotated[float, Field(ge=0, le=100)]  # softmax(logits / temperature); 0: greedy
    top_p: Annotated[float, Field(gt=0, le=1)]  # nucleus filter: the likeliest tokens up to this mass (1.0: off)
    top_k: NonNegativeInt  # only the k likeliest tokens (0: off)
    # the longest reply, in tokens; the length penalty starts at half of it (L_max, docs/method.md,
    # Rewards and returns); at most 131072, the longest context of a Qwen-class model
    max_new_tokens: Annotated[int, Field(ge=1, le=131072)]
    stop: tuple[str, ...] | None  # strings that end a reply (null: each phase's closing tag)
    seed: NonNegativeInt | None  # the sampling seed (null: derived from the run's or the evaluation's seed)

    def stop_for(self, phase: str) -> tuple[str, ...]:
        """The stop strings of a ``phase`` reply."""
        return PHASE_STOP_STRINGS.get(phase, STOP_STRINGS) if self.stop is None else self.stop


# -- the engine -----------------------------------------------------------------------------
ContextMode = Literal["reflection_only", "history_only", "history_and_reflection", "none"]
OverflowRule = Literal["error", "drop_oldest"]
CONTEXT_MODES: tuple[str, ...] = get_args(ContextMode)
OVERFLOW_RULES: tuple[str, ...] = get_args(OverflowRule)


@validated_dataclass(frozen=True)
class RolloutSection:
    """How meta-episodes are played: the engine's keys of ``params/engine`` (an
    :class:`EngineSection` is one), or a rollout of its own (the warm start's, an evaluation's)."""

    episodes: Annotated[int, Field(ge=1, le=100)]  # N episodes per meta-episode
    group_size: Annotated[int, Field(ge=1, le=1024)]  # meta-episodes per group (same seed, seat and opponent)
    early_stop: bool  # a won episode ends the meta-episode
    context_mode: ContextMode  # what later prompts show of a finished episode (docs/method.md, The meta-episode)
    same_initial_state: bool  # every episode of a meta-episode starts from its first one's initial state
    max_prompt_tokens: Annotated[int, Field(ge=1, le=1_048_576)] | None  # prompt limit (null: the model's context)
    prompt_overflow: OverflowRule  # a prompt over the limit: error, or drop the oldest finished episodes
    concurrency: PositiveInt | None  # live meta-episodes stepped together; None: all

    @property
    def reflects(self) -> bool:
        return self.context_mode != "history_only"


@validated_dataclass(frozen=True)
class HFSection:
    """``engine.hf``: the transformers backend."""

    batch_size: Annotated[int, Field(ge=1, le=65536)]  # micro-batch of one generate call
    share_prefill: bool  # compute shared prompt prefixes and duplicate prompts once
    regroup: bool  # rows still decoding go on as a smaller batch once the others have ended


@validated_dataclass(frozen=True)
class VLLMSection:
    """``engine.vllm``: the vLLM engine (mage/backends/vllm.py)."""

    gpu_memory_utilization: Annotated[float, Field(gt=0, le=1)]  # the engine's share of the GPU (weights, KV cache)
    kv_cache_memory_bytes: PositiveInt | None  # a fixed KV cache instead of the share (null: from the share)
    sleep_mode: bool  # the engine sleeps (frees its GPU memory) while the trainer updates
    max_model_len: PositiveInt | None  # the engine's context length (null: the model's)
    enforce_eager: bool  # no torch.compile or CUDA graphs: starts in seconds, generates slower
    # full fine-tuning, the trainer in the engine's process: memory pushes each update's weights
    # into the engine; disk has it load the checkpoint (mage/backends/vllm_sync.py)
    weight_sync: Literal["memory", "disk"]
    # largest log-prob gap (nats) between the engine and the trainer after a sync (null: by dtype)
    sync_tolerance: Annotated[float, Field(gt=0, le=10)] | None


@validated_dataclass(frozen=True)
class ScriptedSection:
    """``engine.scripted``: a rule-based player in the agent's seat (tests, warm-start data)."""

    rule: Annotated[str, Field(min_length=1)]  # an opponent name of the game, "solver" (Sokoban) or "random"
    invalid_rate: Share  # share of its replies made invalid on purpose


BackendName = Literal["hf", "vllm", "scripted"]


@validated_dataclass(frozen=True)
class EngineSection(RolloutSection):
    """``params/engine``: how meta-episodes are played (the :class:`RolloutSection` keys), how
    many an iteration plays, which backend generates, and the training sampling."""

    # 65536 groups of 8 are half a million meta-episodes in one iteration's table: beyond that
    # a value is a typo, and it would exhaust memory before failing
    groups: Annotated[int, Field(ge=1, le=65536)]
    backend: BackendName
    hf: HFSection
    vllm: VLLMSection
    scripted: ScriptedSection
    sampling: SamplingSection

    @property
    def backend_options(self) -> dict[str, Any]:
        """The chosen backend's options, as ``make_backend`` keyword arguments."""
        return dataclasses.asdict(getattr(self, self.backend))


# -- the model ------------------------------------------------------------------------------
@validated_dataclass(frozen=True)
class LoraSection:
    """``model.lora`` (peft); the reference policy is the base model with the adapter disabled."""

    r: Annotated[int, Field(ge=1, le=1024)]  # the adapters' rank
    alpha: Annotated[float, Field(gt=0)]  # scaling: the adapters' update is multiplied by alpha / r
    dropout: Annotated[float, Field(ge=0, lt=1)]  # dropout on the adapters' input
    target_modules: tuple[str, ...] | str  # the modules that get adapters (peft's target_modules)


@validated_dataclass(frozen=True)
class TinySection:
    """``model.tiny``: how the local ``tiny`` preset is built (tokenizer, architecture,
    behaviour cloning); the behaviour-cloning keys are chosen per game
    (``params/model_game/tiny/<game>.yaml``)."""

    vocab_size: Annotated[int, Field(ge=512, le=1_000_000)]  # the BPE tokenizer's vocabulary
    hidden_size: Annotated[int, Field(ge=8, le=16384)]  # width of the Qwen2-architecture model
    num_layers: Annotated[int, Field(ge=1, le=256)]  # decoder layers
    num_heads: PositiveInt  # attention heads (must divide hidden_size)
    num_kv_heads: PositiveInt  # key-value heads (must divide num_heads)
    intermediate_size: PositiveInt  # width of each layer's MLP
    max_position_embeddings: Annotated[int, Field(ge=64, le=1_048_576)]  # the longest context, in tokens
    seed: NonNegativeInt  # seeds the initial weights and the build's data
    corpus_meta_episodes: PositiveInt  # scripted meta-episodes per game for the tokenizer corpus
    # scripted players the warm start imitates: names or {rule: name, **params} (mage.backends.scripted)
    bc_rules: tuple[str | dict[str, Any], ...]
    bc_meta_episodes: PositiveInt  # scripted meta-episodes whose calls the warm start clones
    bc_short_steps: NonNegativeInt  # first phase: prompts cut to their last bc_context_tokens tokens
    # of the short steps, the first this share: play calls only (a reflection's tokens outnumber a move's)
    bc_moves_only_share: Share
    bc_short_batch_rows: PositiveInt  # calls per batch of the short steps
    bc_context_tokens: PositiveInt  # the short steps' prompt length, in tokens (the prompt's end)
    bc_steps: NonNegativeInt  # second phase: whole prompts
    bc_batch_rows: PositiveInt  # calls per batch of the whole-prompt steps
    bc_batches_by_prompt: bool  # whole-prompt batches cut in prompt order (shared prefixes)
    # of every batch's calls: reflections, over-sampled; None: as they come
    bc_reflection_share: Annotated[float, Field(gt=0, lt=1)] | None
    bc_learning_rate: Annotated[float, Field(gt=0, le=1)]  # behaviour cloning's peak learning rate (AdamW)
    # of all steps, the first this share at bc_learning_rate; then a linear decay to a tenth
    bc_constant_lr_share: Share
    # preset.json's description of the warm start: evaluation-style rollouts per opponent
    check_meta_episodes: PositiveInt  # per split
    check_episodes: Annotated[int, Field(ge=1, le=100)]  # N of those rollouts
    check_seed: NonNegativeInt  # their initial states
    check_sampling: SamplingSection  # their sampling (the evaluation's)

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_heads:
            raise ValueError(f"num_heads must divide hidden_size ({self.hidden_size}), got {self.num_heads}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_kv_heads must divide num_heads ({self.num_heads}), got {self.num_kv_heads}")
        if not self.bc_rules:
            raise ValueError("bc_rules must name at least one scripted player")


DEVICE = re.compile(r"auto|cpu|mps|cuda(:\d+)?")
Dtype = Literal["float32", "bfloat16", "float16"]


@validated_dataclass(frozen=True)
class ModelSection:
    """A model preset (``params/model``): where the weights come from and how they train."""

    name: Annotated[str, Field(min_length=1)]  # the preset's name, part of run.name
    path: Annotated[str, Field(min_length=1)]  # a hub id or a local directory (the tiny preset: where it is built)
    build: Literal["tiny"] | None  # tiny: built locally (mage.warmstart); None: loaded as is
    local_dir: str | None  # a hub model is fetched here (DVC versions it); None: the hub cache
    # the compute dtype of every forward pass; what is trained (full fine-tuning's weights,
    # LoRA's adapters) and its optimizer state are float32, frozen weights are held in this
    # dtype (mage.models.policy.Policy)
    dtype: Dtype
    device: str  # auto | cpu | mps | cuda | cuda:N
    chat: bool  # prompts go through the tokenizer's chat template as one user message
    enable_thinking: bool | None  # Qwen3's thinking, passed to the chat template (null: the template's default)
    lora: LoraSection | None  # LoRA adapters (null: full fine-tuning)
    tiny: TinySection | None  # how the model is built (build: tiny only)

    def __post_init__(self) -> None:
        if not DEVICE.fullmatch(self.device):
            raise ValueError(f"device must be auto, cpu, mps, cuda or cuda:N, got {self.device!r}")
        if self.build == "tiny" and self.tiny is None:
            raise ValueError("build: tiny needs a `tiny` section (how to build it)")


# -- the method -----------------------------------------------------------------------------
Anchor = Literal["global", "local"]
Norm = Literal["mean_norm", "mean_std_norm"]
NormScope = Literal["group", "opponent"]
EpisodeBaseline = Literal["pooled", "per_episode"]
Grouping = Literal["stationary", "mixed"]


#: The losses registered in mage.algo.losses.POLICY_LOSSES (a test keeps the two the same: the
#: settings load without torch, which the losses need)
PolicyLossName = Literal["ppo", "decoupled_ppo"]


@validated_dataclass(frozen=True)
class AlgoSection:
    """``params/algo``: returns, advantages and the PPO loss (docs/method.md: Rewards and returns,
    Advantages, The policy update). The
    objective and the estimator are names registered in :mod:`mage.algo` (checked when the
    settings load). The penalties are the game's (:class:`GameSection`)."""

    objective: Annotated[str, Field(min_length=1)]  # differential (MAGE) | cumulative (LaMer) | single_episode
    gamma_step: Discount  # discount inside an episode
    gamma_traj: Discount  # discount across an episode boundary
    estimator: Annotated[str, Field(min_length=1)]  # gigpo | grpo
    anchor: Anchor  # episode index part of the step anchor (local) or not (global)
    norm: Norm  # both terms centred (mean_norm) or also divided by their std (mean_std_norm)
    norm_scope: NormScope  # group: per (seed, seat, opponent); opponent: per opponent over the batch
    # pooled: the episode term's mean (and std) over every call of the scope (the paper's); per_episode:
    # over the scope's calls of the same episode number, a baseline that depends on the episode
    episode_baseline: EpisodeBaseline
    # stationary: a group's meta-episodes face one opponent; mixed: the paper's ablation, a group's
    # members face opponents drawn across the population (same initial state and seat)
    grouping: Grouping
    step_weight: NonNegative  # w in A = A_ep + w * A_step
    # Scales the negative advantages, after A = A_ep + w * A_step: 1 is the method's; below 1 the
    # update leans on the calls that did better than their baseline (mage/algo/advantages.py)
    negative_weight: Share
    epsilon: Annotated[float, Field(gt=0, le=1)]  # added to a std before dividing by it
    clip_ratio: Annotated[float, Field(gt=0, le=1)]  # PPO's clip: ratios outside [1 - eps, 1 + eps] are cut
    dual_clip: Annotated[float, Field(gt=1)]  # c: a negative advantage's loss is at most -A * c
    kl_coef: NonNegative  # beta: weight of the low_var_kl penalty to the reference policy
    entropy_coef: NonNegative  # alpha: weight of the entropy bonus
    # ppo, or decoupled_ppo: stale calls (train.max_staleness) weighted by the proximal over the
    # behaviour policy, truncated (mage/algo/losses.py); the same as ppo when no call is stale
    policy_loss: PolicyLossName
    behaviour_weight_cap: Annotated[float, Field(gt=1, le=100)]  # decoupled_ppo: the weight's truncation


Batching = Literal["bucketed", "padded"]
Sharding = Literal["fsdp", "ddp"]
BATCHINGS: tuple[str, ...] = get_args(Batching)
LrSchedule = Literal["constant", "linear"]


@validated_dataclass(frozen=True)
class TrainSection:
    """``params/train``: the policy update and the training loop (docs/method.md, The policy
    update). Ranges
    are checked on construction: torch takes a negative gradient clip or learning rate
    without complaint."""

    iterations: Annotated[int, Field(ge=0, le=1_000_000)]  # rollout-and-update iterations of a run
    learning_rate: Annotated[float, Field(gt=0, le=1)]  # AdamW's learning rate (the first iteration's)
    lr_schedule: LrSchedule  # linear: CleanRL's PPO annealing, lr/iterations at the last iteration
    weight_decay: Annotated[float, Field(ge=0, le=1)]  # AdamW's decoupled weight decay
    betas: tuple[AdamBeta, AdamBeta]  # AdamW's moment decays
    adam_eps: Annotated[float, Field(gt=0, le=1)]  # AdamW's epsilon
    grad_clip: Annotated[float, Field(gt=0)]  # the gradient's norm is clipped to this before each step
    ppo_epochs: Annotated[int, Field(ge=1, le=100)]  # passes over an iteration's calls
    mini_batch_size: PositiveInt  # rows (LLM calls) per optimizer step (paper: 64)
    batching: Batching  # micro-batches by padded tokens of length-sorted calls (bucketed), or by rows (padded)
    micro_batch_tokens: PositiveInt  # bucketed: padded tokens per micro-batch
    micro_batch_rows: PositiveInt  # padded: rows per micro-batch
    share_prefix: bool  # run a micro-batch's common prompt prefix once
    # response tokens whose full-vocabulary logits the update holds at once: the output layer
    # runs on the response positions in chunks of this many, each recomputed in the backward
    # pass (mage/trainer/logprobs.py); None: every position's logits at once (the tiny presets'
    # exact path, from before chunking)
    logits_chunk_tokens: PositiveInt | None
    # Recompute each decoder layer's activations in the backward pass instead of keeping them:
    # about a third more compute for one layer's activations instead of all of them (a 4B
    # model's PPO step on 16k-token micro-batches needs it on an 80 GB GPU: BENCHMARKS.md,
    # "Training step on a GPU"). The PPO pass then runs without the shared prefix (its KV cache
    # cannot be recomputed); the scoring passes keep it.
    gradient_checkpointing: bool
    # transformers' enable_full_determinism: deterministic CUDA kernels, so a GPU run (and a
    # resumed one) repeats bitwise; slower. CPU runs repeat without it.
    deterministic: bool
    seed: NonNegativeInt  # torch's seed in the trainer (a fresh LoRA adapter's weights)
    checkpoint_every: PositiveInt  # iterations; 1 loses no finished iteration on a crash
    keep_checkpoints: PositiveInt | None  # newest kept (None: all)
    # Write a checkpoint in a background thread while the next rollout plays, where nothing reads
    # it before the next update (mage.run.loop.writes_behind); the update waits for it
    write_behind: bool
    eval_every: NonNegativeInt  # iterations between evaluations during training (0: none)
    # How many updates behind the update's weights a rollout may sample from: 0, rollout and
    # update in turn; 1, the rollout of iteration k+1 plays while update k runs, from the weights
    # before it (docs/gpu.md, "Asynchronous rollouts"; the update corrects for it: algo.policy_loss)
    max_staleness: Annotated[int, Field(ge=0, le=1)]
    # Drift warnings: the invalid-reply rate rising this far over the run's first iteration
    # (a warm start may begin with many invalid replies: the Tic-Tac-Toe one does), or a KL
    # to the reference above drift_kl. They change no result.
    drift_invalid_rise: Annotated[float, Field(gt=0, le=1)]
    drift_kl: Annotated[float, Field(gt=0)]  # the KL to the reference above which a drift warning is logged
    # The update's data-parallel workers: 1 runs it in the flow's process on model.device; N > 1
    # runs N Ray Train workers on the cluster (flow.runner=ray), each on its share of every
    # mini-batch, placed by flow.placement (mage.preflight.placement).
    workers: Annotated[int, Field(ge=1, le=4096)]
    # GPUs of each update worker: 0 a CPU worker (gloo), 1 one GPU each (NCCL); a fraction is
    # not allowed (FSDP and DDP want a whole device per process)
    worker_gpus: Annotated[int, Field(ge=0, le=1, strict=True)]
    worker_cpus: Annotated[float, Field(ge=0, le=4096)]  # Ray CPUs of each update worker
    # How the workers split the model: fsdp shards the trained weights, their gradients and
    # AdamW's moments over the workers (FSDP2 fully_shard, one layer's weights gathered at a
    # time); ddp replicates them (sensible for LoRA). The memory plan shows each per GPU.
    sharding: Sharding

    def learning_rate_at(self, iteration: int) -> float:
        """The learning rate of (1-based) ``iteration``.

        ``linear``: lr_k = lr * (1 - (k - 1) / K) for iteration k of K, so the first
        iteration runs at the full rate and the last at lr / K. Late updates are small, so a
        policy that has found a good strategy keeps it instead of drifting away from it.
        """
        if self.lr_schedule == "constant" or self.iterations <= 0:
            return self.learning_rate
        fraction = 1.0 - (min(max(iteration, 1), self.iterations) - 1) / self.iterations
        return self.learning_rate * fraction


@validated_dataclass(frozen=True)
class EvalSection:
    """``params/eval``: the evaluation of a checkpoint and of the policy it started from."""

    split: Split  # the opponents played: training ones, held-out ones or all
    episodes: Annotated[int, Field(ge=1, le=100)]  # N at evaluation (may exceed training's)
    meta_episodes: Annotated[int, Field(ge=1, le=1_000_000)]  # per split, shared equally by its opponents
    group_size: Annotated[int, Field(ge=1, le=1024)]  # meta-episodes per initial state
    early_stop: bool  # a won episode ends the meta-episode
    seed: NonNegativeInt  # the evaluation's initial states: the same for every checkpoint
    sampling: SamplingSection  # the evaluation's sampling
    # games the checkpoint did not train on, played beside the run's own, each with its own game and
    # population files (params/game/<name>.yaml, params/population/<name>.yaml) and the run's model,
    # engine and evaluation settings (docs/report.md, "Games held out at evaluation")
    games: tuple[str, ...]

    def __post_init__(self) -> None:
        for name in self.games:
            if not GAME_OPTION.fullmatch(name):
                raise ValueError(f"games: {name!r} is not a game's name (the name of a file in params/game/, "
                                 "without .yaml: letters, digits and '_')")
        repeated = sorted({name for name in self.games if self.games.count(name) > 1})
        if repeated:
            raise ValueError(f"games: {repeated[0]} is listed more than once; list each held-out game once")

    def groups_per_opponent(self, opponents: int) -> int:
        """Whole groups per opponent so that ``opponents`` share at least ``meta_episodes``."""
        return max(1, -(-self.meta_episodes // (max(opponents, 1) * self.group_size)))


# -- the game and its population ------------------------------------------------------------
@validated_dataclass(frozen=True)
class GameSection:
    """``params/game``: the game, its constructor's parameters and its penalties, the one
    home of c_inv and c_len (docs/method.md, Rewards and returns; the returns read them from here)."""

    name: str  # the game (mage.games.GAMES, or OpenSpiel's name of a game played through the adapter)
    params: dict[str, Any]  # the game's constructor parameters (mage.games.make_game)
    invalid_penalty: NonNegative  # c_inv: the penalty of each invalid reply (docs/method.md, Rewards and returns)
    length_penalty: NonNegative  # c_len: the largest penalty of a reply longer than half the reply limit

    def __post_init__(self) -> None:
        if self.name not in GAMES and not is_openspiel_name(self.name):
            raise ValueError(f"name must be one of {sorted(GAMES)} or a two-player OpenSpiel game's name "
                             f"(pyspiel.registered_names()), got {self.name!r}")
        if is_openspiel_name(self.name):
            from mage.games.openspiel_game import unfit_name

            if (reason := unfit_name(self.name)) is not None:
                raise ValueError(f"name must be a game this project can play: OpenSpiel's {self.name} does not fit, "
                                 f"{reason}")
        checked_game(self.name, self.params, "params")

    @property
    def num_players(self) -> int:
        return _num_players(self.name, json.dumps(self.params, sort_keys=True))


@functools.lru_cache(maxsize=64)
def _num_players(name: str, params: str) -> int:
    return int(make_game(name, **json.loads(params)).num_players)


@validated_dataclass(frozen=True)
class CeilingsSection:
    """``population.ceilings``: how the population manifest's ceilings are estimated where they
    are not exact (docs/method.md, The metrics)."""

    n_games: Annotated[int, Field(ge=1, le=1_000_000)]  # games per Monte-Carlo ceiling estimate
    seed: NonNegativeInt  # seeds those games
    # the ceilings across episodes (known opponent, memoryless, adaptive) for k = 1..episodes
    episodes: Annotated[int, Field(ge=1, le=100)]


@validated_dataclass(frozen=True)
class LeagueSection:
    """``population.league``: frozen snapshots of the agent that join its training opponents
    (docs/method.md, "The league")."""

    enabled: bool  # off: the training population is the scripted one
    snapshot_every: PositiveInt  # every this many iterations a snapshot joins (a checkpoint is written then)
    max_size: Annotated[int, Field(ge=1, le=64)]  # snapshots at most; beyond it one leaves (evict)
    share: Annotated[float, Field(gt=0, lt=1)]  # share of the training groups that play snapshots, once there is one
    evict: Literal["oldest", "lowest_rated"]  # which snapshot leaves a full league
    pfsp_power: Annotated[float, Field(ge=0, le=16)]  # PFSP weight (1 - P(agent wins)) ** pfsp_power


@validated_dataclass(frozen=True)
class PopulationEntry:
    """One counterpart of a population: an opponent rule (or, for Sokoban, a level setting),
    read from ``population.<split>.<id>`` and checked against the game when the settings load
    (:func:`mage.settings.entries.population_entries`)."""

    id: Annotated[str, Field(min_length=1)]  # the entry's key in its split
    game: str  # game.name
    opponent: Annotated[str, Field(min_length=1)]  # the opponent's name (mage.opponents.make)
    split: SplitName  # the split the entry is listed under
    share: NonNegative  # training entries: the share of groups that face it (they sum to 1); held out: unused
    params: Mapping[str, Any]  # the opponent's parameters
    game_params: Mapping[str, Any]  # overrides of game.params for this entry (Sokoban's num_boxes, levels)

    def make_game(self, base_params: Mapping[str, Any] | None = None) -> Game:
        """The game with the population's base parameters and this entry's overrides."""
        return make_game(self.game, **{**(base_params or {}), **self.game_params})


@validated_dataclass(frozen=True)
class PopulationSection:
    """``params/population``: the opponents, split into training and held-out entries.

    ``train`` and ``held_out`` map ids to :class:`PopulationEntry` objects, read and checked
    against the game when the settings load (:func:`mage.settings.entries.population_entries`)."""

    seat_split: Share  # share of meta-episodes in which the agent sits second
    ceilings: CeilingsSection
    league: LeagueSection
    train: dict[str, PopulationEntry]  # the opponents trained against, by id
    held_out: dict[str, PopulationEntry]  # the opponents held out for evaluation, by id

    @property
    def entries(self) -> tuple[PopulationEntry, ...]:
        """Every entry, training first, in the order of the config."""
        return (*self.train.values(), *self.held_out.values())


# -- orchestration and files ----------------------------------------------------------------
PLAIN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+=-]{0,199}")


@validated_dataclass(frozen=True)
class RunSection:
    """``run``: the run's name, which keys its checkpoints, evaluations and report."""

    # a directory name under paths.runs: never a path, never empty (".." would write elsewhere)
    name: str

    def __post_init__(self) -> None:
        if not PLAIN_NAME.fullmatch(self.name) or ".." in self.name:
            raise ValueError(f"name must be a plain name (letters, digits and . _ + = -, not starting with one of "
                             f"them, no '..', at most 200 characters), got {self.name!r}")


@validated_dataclass(frozen=True)
class PathsSection:
    """``paths``: where every artifact of the lifecycle goes."""

    artifacts: str  # every artifact lives under here (DVC tracks it, git ignores it)
    population_manifest: str  # the population's manifest with its ceilings
    runs: str  # training runs: checkpoints, rollout tables, run.json
    evaluations: str  # evaluation tables, per run
    start_evaluation: str  # the starting policy's evaluation
    nightly: str  # the nightly evaluations
    report: str  # the generalisation report (metrics, Markdown, plots)
    results: str  # small metrics files that git tracks
    metrics: str  # the report's headline numbers
    live: str | None  # dvclive's per-iteration metrics and plots (None: none)


Runner = Literal["thread", "process", "sequential", "ray"]
#: Where the update workers and the engines run on a Ray cluster: on separate GPUs, or sharing them
Placement = Literal["split", "colocated"]
#: "auto", "host:port" (a cluster this machine belongs to) or "ray://host:port" (Ray Client)
RAY_ADDRESS = re.compile(r"auto|(ray://)?[A-Za-z0-9][A-Za-z0-9.-]*:[0-9]{1,5}")


@validated_dataclass(frozen=True)
class RaySection:
    """``flow.ray``: where ``flow.runner=ray`` runs the shards, and what each one takes."""

    address: str | None  # None: a local Ray on this machine with num_cpus CPUs; else a cluster's address
    num_cpus: Annotated[int, Field(ge=1, le=4096)]  # the local Ray's CPUs (address None only)
    shard_cpus: Annotated[float, Field(ge=0, le=4096)]  # Ray resources of one rollout or evaluation shard
    shard_gpus: Annotated[float, Field(ge=0, le=64)]  # fractions share a GPU (vllm: gpu_memory_utilization)
    long_lived_workers: bool  # one engine per shard in a Ray actor for the whole run
    worker_restarts: Annotated[int, Field(ge=0, le=100)]  # a dead worker actor is started again this often
    connect_timeout_seconds: Annotated[float, Field(gt=0, le=3600)]  # an address that does not answer fails

    def __post_init__(self) -> None:
        if self.shard_gpus > 1 and self.shard_gpus != int(self.shard_gpus):
            raise ValueError(f"shard_gpus must be at most 1 or a whole number (Ray's rule), got {self.shard_gpus:g}")
        if self.address is not None and not RAY_ADDRESS.fullmatch(self.address):
            raise ValueError(f"address must be null, 'auto', 'host:port' or 'ray://host:port', got {self.address!r}")


@validated_dataclass(frozen=True)
class FlowSection:
    """``params/flow``: how the Prefect flows run. The library reads only ``rollout_shards``
    (the shards set the rollouts' sampling seeds, so a run's results), ``runner``, to check it
    against ``train.checkpoint_every`` and ``train.workers``, and, for the placement check and
    the memory plan per GPU (:mod:`mage.preflight.placement`, :mod:`mage.preflight.memory_plan`), ``placement`` and ``ray``."""

    runner: Runner  # the task runner of rollout shards
    max_workers: Annotated[int, Field(ge=1, le=1024)]  # shards run at once by the thread and process runners
    rollout_shards: Annotated[int, Field(ge=1, le=4096)]  # rollout tasks per iteration (whole groups each)
    retries: Annotated[int, Field(ge=0, le=100)]  # retries after a transient failure (OSError, timeouts)
    retry_delay_seconds: Annotated[float, Field(ge=0, le=86400)]  # first retry delay; doubles every retry
    nightly_cron: str  # the nightly evaluation's schedule
    timezone: str | None  # of the cron schedule; None: this machine's local zone
    nightly_run: str | None  # the run the nightly evaluation takes (None: run.name)
    # a Prefect API (PREFECT_API_URL) that does not answer within this fails the command clearly
    api_timeout_seconds: Annotated[float, Field(gt=0, le=3600)]
    # without PREFECT_API_URL, the temporary server a command starts must answer within this
    server_start_timeout_seconds: Annotated[float, Field(gt=0, le=3600)]
    # train.workers > 1 on Ray: split puts the update workers and the engines on separate GPUs;
    # colocated lets them share GPUs, the engines asleep during the update (engine.vllm.sleep_mode)
    placement: Placement
    ray: RaySection  # flow.runner=ray only

    def __post_init__(self) -> None:
        if len(self.nightly_cron.split()) != 5:
            raise ValueError(f"nightly_cron must be a five-field cron expression, got {self.nightly_cron!r}")

    @property
    def remote_rollouts(self) -> bool:
        """Whether rollout shards run in other processes (which sample from checkpoints on disk)."""
        return self.runner in ("process", "ray")
