"""Building blocks of the locally built ``tiny`` model preset (no hub needed).

* :func:`train_tokenizer`: a byte-level BPE tokenizer trained with the ``tokenizers``
  library on the games' own text, with Qwen2's normalizer and pre-tokenizer, Qwen's ChatML
  chat template and special tokens (``<|im_start|>``, ``<|im_end|>`` as end of turn,
  ``<|endoftext|>`` as padding). The protocol tags are single tokens, which a small model
  finds easier to emit. Qwen2's pipeline is not a matter of taste: ``AutoTokenizer`` loads
  a ``qwen2`` model directory as ``Qwen2Tokenizer``, which rebuilds that pipeline around the
  saved vocabulary, so a tokenizer trained any other way would split text differently once
  loaded from disk (:func:`check_round_trip` guards against that).
* :func:`random_model`: a small Qwen2-architecture causal LM initialised from a seed.

Both are saved with ``save_pretrained`` as an ordinary model directory and loaded back
exactly as a hub model would be, with ``from_pretrained`` on the path.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import polars as pl
import torch
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM
from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX as QWEN2_PRETOKENIZE_REGEX

from mage.backends import make_backend
from mage.config.sections import RolloutSection, SamplingSection
from mage.games import make_game
from mage.rollout import RolloutEngine, plan_meta_episodes
from mage.settings import Settings

PAD, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
PROTOCOL_TOKENS = ["<action>", "</action>", "<remark>", "</remark>", "<think>", "</think>"]

# Qwen's ChatML layout; `enable_thinking` is accepted (and ignored) like Qwen2.5 templates do.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def train_tokenizer(
    corpus: Iterable[str], vocab_size: int = 2048, min_frequency: int = 2, whole: Sequence[str] = ()
) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE on ``corpus`` and wrap it as a transformers tokenizer; the
    strings of ``whole`` (the games' action codes: cells, directions) become single tokens
    wherever they appear, so a reply can copy a move from a list of legal moves token for
    token (the byte-level pre-tokenizer would give " A" + "1" in a list and "A" + "1" after
    ``<action>``)."""
    tokenizer = Tokenizer(models.BPE())
    # Qwen2's pipeline (transformers' Qwen2Tokenizer builds exactly this around a vocabulary).
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=[PAD, IM_START, IM_END],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus, trainer)
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token=IM_END,
        pad_token=PAD,
        additional_special_tokens=[IM_START],
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )
    wrapped.add_tokens(PROTOCOL_TOKENS)
    wrapped.add_tokens([name for name in whole if name not in PROTOCOL_TOKENS])
    wrapped.chat_template = CHAT_TEMPLATE
    return wrapped


class TokenizerRoundTripError(RuntimeError):
    """A saved tokenizer does not encode text as the one that was trained."""


def check_round_trip(tokenizer: PreTrainedTokenizerFast, directory: str, texts: Sequence[str]) -> None:
    """Load ``directory`` with ``AutoTokenizer`` (as any user would) and check that it encodes
    ``texts`` and the chat template exactly as ``tokenizer`` does."""
    loaded = AutoTokenizer.from_pretrained(directory)
    chat = [{"role": "user", "content": "x"}]
    if loaded.apply_chat_template(chat, tokenize=False, add_generation_prompt=True) != tokenizer.apply_chat_template(
        chat, tokenize=False, add_generation_prompt=True
    ):
        raise TokenizerRoundTripError(f"{directory}: the reloaded chat template differs")
    for text in texts:
        if loaded(text, add_special_tokens=False)["input_ids"] != tokenizer(text, add_special_tokens=False)["input_ids"]:
            raise TokenizerRoundTripError(
                f"{directory}: {type(loaded).__name__} loaded from disk encodes text differently from the trained "
                f"tokenizer (first case: {text[:80]!r})"
            )


def random_model(
    tokenizer: PreTrainedTokenizerFast,
    *,
    hidden_size: int = 128,
    num_layers: int = 4,
    num_heads: int = 4,
    num_kv_heads: int = 4,
    intermediate_size: int = 384,
    max_position_embeddings: int = 4096,
    seed: int = 0,
) -> Qwen2ForCausalLM:
    """A Qwen2-architecture model with weights drawn from ``seed`` (tied embeddings)."""
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


# -- building the preset -----------------------------------------------------------------
#: The meta-episodes the warm start is cloned and checked on: the method's defaults (N = 3,
#: reflections, early stop). Not the run's engine settings: every algorithm of a game, MAGE
#: and its single-episode baselines alike, starts from the same warm start.
WARM_START_ROLLOUT = RolloutSection(episodes=3, group_size=4, early_stop=True, context_mode="reflection_only",
                                   same_initial_state=True, max_prompt_tokens=None, prompt_overflow="error",
                                   concurrency=None)
#: The tokenizer's corpus: the same meta-episodes, prompts cut at 4096 tokens (oldest episodes
#: first), as every preset's tokenizer was trained.
SCRIPTED_ROLLOUT = replace(WARM_START_ROLLOUT, max_prompt_tokens=4096, prompt_overflow="drop_oldest")
#: A scripted player reads no sampling but its seed (the engine derives one per call).
SCRIPTED_SAMPLING = SamplingSection(temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=256, stop=None, seed=None)


def rule_name(spec: str | Mapping[str, Any]) -> str:
    """A scripted player's name, from its :func:`mage.backends.scripted.make_rule` spec."""
    return spec if isinstance(spec, str) else str(spec.get("rule", "rule"))


def scripted_tables(
    settings: Settings,
    rules: Sequence[str | Mapping[str, Any]],
    meta_episodes: int,
    seed: int,
    progress: bool = False,
    rollout: RolloutSection = SCRIPTED_ROLLOUT,
) -> pl.DataFrame:
    """Trajectory tables of scripted players (:func:`mage.backends.scripted.make_rule`
    specs) against the training population of ``settings`` (its game parameters, population
    and seating), ``meta_episodes`` per rule in groups of 4, played as ``rollout``.

    A fixed training set (the game's ``training_set_params``, Sokoban's ``levels``) is left out:
    the warm start stands in for a pretrained model, which has not seen the levels RL will train
    on, so it is cloned on the game's own level distribution and a gain on those levels is RL's.
    It is then the same warm start with and without the set."""
    training_set = make_game(settings.game.name).training_set_params

    def any_level(params: Mapping[str, Any]) -> dict[str, Any]:
        return {key: value for key, value in params.items() if key not in training_set}

    entries = [replace(e, game_params=any_level(e.game_params)) for e in settings.population.entries
               if e.split == "train"]
    seat_split, num_seats = settings.population.seat_split, settings.game.num_players
    rollout = replace(rollout, group_size=4, concurrency=None)
    tables = []
    for index, rule in enumerate(rules):
        engine = RolloutEngine(make_backend("scripted", rule=rule, seed=seed + index), rollout,
                               any_level(settings.game.params))
        specs = plan_meta_episodes(entries, max(1, meta_episodes // 4), 4, seed + index, seat_split, num_seats)
        tables.append(engine.run(specs, SCRIPTED_SAMPLING, run_id=f"bc-{rule_name(rule)}", progress=progress))
    return pl.concat(tables)
