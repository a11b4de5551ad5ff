"""The typed sections of ``params/`` that no library module owns: the model preset and its
local build, the engine's backends, the game, the population, the flows, the paths and
the run. (Sampling, rollout, algorithm, training and evaluation settings live beside the
code that reads them.)

Every section is a pydantic dataclass: types and ranges are checked on construction, fixed
choices are ``Literal``s, and cross-field rules raise in ``__post_init__``. A value that
cannot be right never reaches the code that would use it.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import field
from functools import cached_property
from typing import Annotated, Any, Literal

from pydantic import Field
from pydantic.dataclasses import dataclass as validated_dataclass

from mage.backends.base import SamplingSettings
from mage.rollout.engine import RolloutConfig
from mage.train.config import LoraSettings

PositiveInt = Annotated[int, Field(ge=1)]
NonNegativeInt = Annotated[int, Field(ge=0)]
Share = Annotated[float, Field(ge=0, le=1)]


@validated_dataclass(frozen=True)
class TinyBuild:
    """How the local ``tiny`` preset is built (tokenizer, architecture, behaviour cloning).

    The behaviour-cloning settings are chosen per game (``params/model_game/tiny/<game>.yaml``)."""

    vocab_size: Annotated[int, Field(ge=512, le=1_000_000)] = 4096
    hidden_size: Annotated[int, Field(ge=8, le=16384)] = 128
    num_layers: Annotated[int, Field(ge=1, le=256)] = 4
    num_heads: PositiveInt = 4
    num_kv_heads: PositiveInt = 4
    intermediate_size: PositiveInt = 384
    max_position_embeddings: Annotated[int, Field(ge=64, le=1_048_576)] = 4096
    seed: NonNegativeInt = 0
    corpus_meta_episodes: PositiveInt = 256  # scripted meta-episodes per game for the tokenizer corpus
    # scripted players the warm start imitates: names or {rule: name, **params} (mage.backends.scripted)
    bc_rules: tuple[str | dict[str, Any], ...] = ("random",)
    bc_meta_episodes: PositiveInt = 512
    bc_short_steps: NonNegativeInt = 0  # first phase: prompts cut to their last bc_context_tokens tokens
    # of the short steps, the first this share: play calls only (a reflection's tokens outnumber a move's)
    bc_moves_only_share: Annotated[float, Field(ge=0, le=1)] = 0.0
    bc_short_batch_rows: PositiveInt = 64
    bc_context_tokens: PositiveInt = 64
    bc_steps: NonNegativeInt = 270  # second phase: whole prompts
    bc_batch_rows: PositiveInt = 32
    bc_batches_by_prompt: bool = False  # whole-prompt batches cut in prompt order (shared prefixes)
    # of every batch's calls: reflections, over-sampled; None: as they come
    bc_reflection_share: Annotated[float, Field(gt=0, lt=1)] | None = None
    bc_learning_rate: Annotated[float, Field(gt=0, le=1)] = 1e-3
    # of all steps, the first this share at bc_learning_rate; then a linear decay to a tenth
    bc_constant_lr_share: Annotated[float, Field(ge=0, le=1)] = 0.0
    # preset.json's description of the warm start: evaluation-style rollouts per opponent
    check_meta_episodes: PositiveInt = 64  # per split
    check_episodes: Annotated[int, Field(ge=1, le=100)] = 3
    check_seed: NonNegativeInt = 1234
    check_sampling: SamplingSettings = field(default_factory=lambda: SamplingSettings(0.7, 0.8, 20, 128))

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_heads:
            raise ValueError(f"num_heads must divide hidden_size ({self.hidden_size}), got {self.num_heads}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_kv_heads must divide num_heads ({self.num_heads}), got {self.num_kv_heads}")
        if not self.bc_rules:
            raise ValueError("bc_rules must name at least one scripted player")


DEVICE = re.compile(r"auto|cpu|mps|cuda(:\d+)?")


@validated_dataclass(frozen=True)
class ModelConfig:
    """A model preset (``params/model``): where the weights come from and how they train."""

    name: Annotated[str, Field(min_length=1)]
    path: Annotated[str, Field(min_length=1)]  # a hub id or a local directory (the tiny preset: where it is built)
    build: Literal["tiny"] | None = None  # tiny: built locally by mage.models.tiny; None: loaded as is
    local_dir: str | None = None  # a hub model is fetched here (DVC versions it); None: the hub cache
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    device: str = "auto"  # auto | cpu | mps | cuda | cuda:N
    chat: bool = True
    enable_thinking: bool | None = None
    lora: LoraSettings | None = None
    tiny: TinyBuild | None = None

    def __post_init__(self) -> None:
        if not DEVICE.fullmatch(self.device):
            raise ValueError(f"device must be auto, cpu, mps, cuda or cuda:N, got {self.device!r}")
        if self.build == "tiny" and self.tiny is None:
            raise ValueError("build: tiny needs a `tiny` section (how to build it)")


@validated_dataclass(frozen=True)
class HFOptions:
    """``engine.hf``: the transformers backend."""

    batch_size: Annotated[int, Field(ge=1, le=65536)] = 64  # micro-batch of one generate call
    share_prefill: bool = True  # compute shared prompt prefixes and duplicate prompts once
    regroup: bool = True  # rows still decoding go on as a smaller batch once the others have ended


@validated_dataclass(frozen=True)
class VLLMOptions:
    """``engine.vllm``: the vLLM engine (mage/backends/vllm.py)."""

    gpu_memory_utilization: Annotated[float, Field(gt=0, le=1)] = 0.85
    kv_cache_memory_bytes: PositiveInt | None = None
    sleep_mode: bool = False
    max_model_len: PositiveInt | None = None
    enforce_eager: bool = False


@validated_dataclass(frozen=True)
class ScriptedOptions:
    """``engine.scripted``: a rule-based player in the agent's seat (tests, warm-start data)."""

    rule: Annotated[str, Field(min_length=1)] = "random"
    invalid_rate: Share = 0.0


Backend = Literal["hf", "vllm", "scripted"]


@validated_dataclass(frozen=True)
class EngineConfig:
    """``params/engine``: the rollout engine, its backend and the training sampling."""

    rollout: RolloutConfig
    # 65536 groups of 8 are half a million meta-episodes in one iteration's table: beyond that
    # a value is a typo, and it would exhaust memory before failing
    groups: Annotated[int, Field(ge=1, le=65536)]
    backend: Backend
    hf: HFOptions
    vllm: VLLMOptions
    scripted: ScriptedOptions
    sampling: SamplingSettings

    @property
    def backend_options(self) -> dict[str, Any]:
        """The chosen backend's options, as ``make_backend`` keyword arguments."""
        return dataclasses.asdict(getattr(self, self.backend))


GameName = Literal["kuhn_poker", "tic_tac_toe", "sokoban"]


@validated_dataclass(frozen=True)
class GameConfig:
    """``params/game``: the game, its constructor's parameters and its penalties."""

    name: GameName
    params: dict[str, Any]
    invalid_penalty: Annotated[float, Field(ge=0)]  # c_inv (MAGE-SPEC 3)
    length_penalty: Annotated[float, Field(ge=0)]  # c_len

    def __post_init__(self) -> None:
        from mage.games import checked_game

        checked_game(self.name, self.params, "params")

    @cached_property
    def num_players(self) -> int:
        from mage.games import make_game

        return int(make_game(self.name, **self.params).num_players)


@validated_dataclass(frozen=True)
class CeilingSettings:
    n_games: Annotated[int, Field(ge=1, le=1_000_000)]  # games per Monte-Carlo ceiling estimate
    seed: NonNegativeInt


@validated_dataclass(frozen=True)
class PopulationConfig:
    """``params/population``: the opponents, split into training and held-out entries.

    ``entries`` are the checked :class:`mage.population.PopulationEntry` objects (filled in by
    :class:`mage.settings.Settings`, which knows the game)."""

    seat_split: Share  # share of meta-episodes in which the agent sits second
    ceilings: CeilingSettings
    train: dict[str, dict[str, Any]]
    held_out: dict[str, dict[str, Any]]
    entries: tuple[Any, ...] = ()


PLAIN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+=-]{0,199}")


@validated_dataclass(frozen=True)
class RunConfig:
    # a directory name under paths.runs: never a path, never empty (".." would write elsewhere)
    name: str

    def __post_init__(self) -> None:
        if not PLAIN_NAME.fullmatch(self.name) or ".." in self.name:
            raise ValueError(f"name must be a plain name (letters, digits and . _ + = -, not starting with one of "
                             f"them, no '..', at most 200 characters), got {self.name!r}")


@validated_dataclass(frozen=True)
class PathsConfig:
    """``paths``: where every artifact of the lifecycle goes."""

    artifacts: str
    population_manifest: str
    runs: str
    evaluations: str
    start_evaluation: str
    nightly: str
    report: str
    results: str
    metrics: str
    live: str


Runner = Literal["thread", "process", "sequential", "ray"]
#: "auto", "host:port" (a cluster this machine belongs to) or "ray://host:port" (Ray Client)
RAY_ADDRESS = re.compile(r"auto|(ray://)?[A-Za-z0-9][A-Za-z0-9.-]*:[0-9]{1,5}")


@validated_dataclass(frozen=True)
class RayConfig:
    """``flow.ray``: where ``flow.runner=ray`` runs the shards, and what each one takes."""

    address: str | None = None  # None: a local Ray on this machine with num_cpus CPUs; else a cluster's address
    num_cpus: Annotated[int, Field(ge=1, le=4096)] = 2  # the local Ray's CPUs (address None only)
    shard_cpus: Annotated[float, Field(ge=0, le=4096)] = 1.0  # Ray resources of one rollout or evaluation shard
    shard_gpus: Annotated[float, Field(ge=0, le=64)] = 0.0  # fractions share a GPU (vllm: gpu_memory_utilization)
    long_lived_workers: bool = True  # one engine per shard in a Ray actor for the whole run
    worker_restarts: Annotated[int, Field(ge=0, le=100)] = 2  # a dead worker actor is started again this often
    connect_timeout_seconds: Annotated[float, Field(gt=0, le=3600)] = 30.0  # an address that does not answer fails

    def __post_init__(self) -> None:
        if self.shard_gpus > 1 and self.shard_gpus != int(self.shard_gpus):
            raise ValueError(f"ray.shard_gpus must be at most 1 or a whole number (Ray's rule), got {self.shard_gpus:g}")
        if self.address is not None and not RAY_ADDRESS.fullmatch(self.address):
            raise ValueError(f"ray.address must be null, 'auto', 'host:port' or 'ray://host:port', got {self.address!r}")


@validated_dataclass(frozen=True)
class FlowConfig:
    """``params/flow``: how the Prefect flows run (the library itself never reads this)."""

    runner: Runner = "thread"  # the task runner of rollout shards
    max_workers: Annotated[int, Field(ge=1, le=1024)] = 2
    rollout_shards: Annotated[int, Field(ge=1, le=4096)] = 1  # rollout tasks per iteration (whole groups each)
    retries: Annotated[int, Field(ge=0, le=100)] = 2  # retries after a transient failure (OSError, timeouts)
    retry_delay_seconds: Annotated[float, Field(ge=0, le=86400)] = 2.0  # first retry delay; doubles every retry
    nightly_cron: str = "0 2 * * *"  # the nightly evaluation's schedule
    timezone: str | None = None  # of the cron schedule; None: this machine's local zone
    nightly_run: str | None = None  # the run the nightly evaluation takes (None: run.name)
    # a Prefect API (PREFECT_API_URL) that does not answer within this fails the command clearly
    api_timeout_seconds: Annotated[float, Field(gt=0, le=3600)] = 30.0
    # without PREFECT_API_URL, the temporary server a command starts must answer within this
    server_start_timeout_seconds: Annotated[float, Field(gt=0, le=3600)] = 120.0
    ray: RayConfig = field(default_factory=RayConfig)  # flow.runner=ray only

    def __post_init__(self) -> None:
        if len(self.nightly_cron.split()) != 5:
            raise ValueError(f"nightly_cron must be a five-field cron expression, got {self.nightly_cron!r}")


Split = Literal["held_out", "train", "all"]


@validated_dataclass(frozen=True)
class EvalConfig:
    """``params/eval``; ranges are checked on construction."""

    split: Split = "held_out"
    episodes: Annotated[int, Field(ge=1, le=100)] = 3
    meta_episodes: Annotated[int, Field(ge=1, le=1_000_000)] = 384  # per split, shared equally by its opponents
    group_size: Annotated[int, Field(ge=1, le=1024)] = 1
    early_stop: bool = True
    seed: Annotated[int, Field(ge=0)] = 1234
    sampling: SamplingSettings = field(default_factory=lambda: SamplingSettings(temperature=0.7, top_p=0.8, top_k=20))

    def groups_per_opponent(self, opponents: int) -> int:
        """Whole groups per opponent so that ``opponents`` share at least ``meta_episodes``."""
        return max(1, -(-self.meta_episodes // (max(opponents, 1) * self.group_size)))
