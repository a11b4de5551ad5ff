"""The update's workers and the engines on a Ray cluster (mage.preflight.placement): the keys and their
rules between sections, the fit against the cluster's resources against a packing written
here, a flow that refuses before any work, the memory plan per GPU, and +experiment=paper_8gpu."""

from __future__ import annotations

import contextlib
import dataclasses
import math

import pytest
from conftest import defaults
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mage.preflight.memory_plan import GIB, check_fits, gpu_plans, plan
from mage.preflight.placement import PlacementError, check_placement, placement
from mage.settings import SettingsError

# Qwen3-4B (tests/test_memory_plan.py checks these against transformers' and peft's models)
QWEN3_4B = 4_022_468_096
QWEN3_4B_LORA_64 = 132_120_576
QWEN3_4B_EMBEDDINGS = 151_936 * 2560 + 2560  # tied: one vocabulary x hidden matrix, and the final norm
#: One Qwen3-4B decoder layer (hidden 2560, 32 query and 8 key-value heads of 128, MLP 9728):
#: q 2560x4096 + k, v 2560x1024 + o 4096x2560 + q/k norms 2x128 + gate, up 2560x9728 + down
#: 9728x2560 + two norms of 2560 (36 of them and the embeddings make 4,022,468,096)
QWEN3_4B_LAYER = 2560 * 4096 + 2 * 2560 * 1024 + 4096 * 2560 + 2 * 128 + 3 * 2560 * 9728 + 2 * 2560


@pytest.fixture(scope="module")
def ray_base():
    return defaults("flow.runner=ray")


def with_(base, train=None, flow=None, ray=None):
    """``base`` with some keys of train, flow and flow.ray changed (each section validates them)."""
    flow_cfg = dataclasses.replace(base.flow, **(flow or {}), ray=dataclasses.replace(base.flow.ray, **(ray or {})))
    return dataclasses.replace(base, train=dataclasses.replace(base.train, **(train or {})), flow=flow_cfg)


def gpus_by_packing(workers: int, worker_gpus: int, engines: int, shard_gpus: float, colocated: bool) -> int:
    """GPUs used when each update worker takes a GPU of its own and the engines are put on GPUs
    one by one, first fit: a fraction of a GPU on the first GPU whose engines leave room for it,
    a whole number alone on as many new GPUs; colocated, the engines' GPUs are the workers'."""
    loads: list[float] = []
    for _ in range(engines if shard_gpus else 0):
        if shard_gpus >= 1:
            loads += [1.0] * round(shard_gpus)
            continue
        room = [i for i, load in enumerate(loads) if load + shard_gpus <= 1 + 1e-9]
        if room:
            loads[room[0]] += shard_gpus
        else:
            loads.append(shard_gpus)
    update = workers * worker_gpus
    return max(update, len(loads)) if colocated else update + len(loads)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(workers=st.integers(1, 16), worker_gpus=st.sampled_from([0, 1]), worker_cpus=st.sampled_from([0.0, 1.0, 2.0]),
       engines=st.integers(1, 16), shard_gpus=st.sampled_from([0.0, 0.2, 0.25, 0.3, 0.5, 0.6, 1.0, 2.0]),
       shard_cpus=st.sampled_from([0.0, 0.5, 1.0]), colocated=st.booleans(), long_lived=st.booleans(),
       have_gpus=st.integers(0, 40), have_cpus=st.integers(0, 48))
def test_the_placement_fits_exactly_when_the_packing_does(ray_base, workers, worker_gpus, worker_cpus, engines,
                                                          shard_gpus, shard_cpus, colocated, long_lived, have_gpus,
                                                          have_cpus):
    colocated = colocated and workers > 1
    s = with_(ray_base, train={"workers": workers, "worker_gpus": worker_gpus, "worker_cpus": worker_cpus},
              flow={"rollout_shards": engines, "placement": "colocated" if colocated else "split"},
              ray={"shard_gpus": shard_gpus, "shard_cpus": shard_cpus, "long_lived_workers": long_lived})
    on_ray = workers if workers > 1 else 0  # one worker: the update runs in the flow's process, not on Ray
    at_once = engines if long_lived else 1  # per-task engines: one must fit, the others wait
    need_gpus = gpus_by_packing(on_ray, worker_gpus, at_once, shard_gpus, colocated)
    need_cpus = on_ray * worker_cpus + at_once * shard_cpus
    fits = need_gpus <= have_gpus and need_cpus <= have_cpus
    resources = {"GPU": float(have_gpus), "CPU": float(have_cpus), "memory": 1e12}
    assert placement(s).gpus == need_gpus
    if fits:
        assert check_placement(s, resources).gpus == need_gpus
        return
    with pytest.raises(PlacementError) as error:
        check_placement(s, resources)
    message = str(error.value)
    resource, have = ("GPU", have_gpus) if need_gpus > have_gpus else ("CPU", have_cpus)
    assert message.startswith(("train.workers: ", "flow.rollout_shards: ")), message
    assert f"the Ray cluster has {have:g}; lower " in message and f" {resource}s" in message, message
    # the key named first is the engines' when the update alone would fit
    alone = on_ray * (worker_gpus if resource == "GPU" else worker_cpus)
    assert message.startswith("flow.rollout_shards" if alone <= have else "train.workers"), message


def test_the_message_names_every_key_of_the_sum():
    s = defaults("flow.runner=ray", "train.workers=4", "flow.rollout_shards=5", "flow.ray.shard_gpus=1")
    with pytest.raises(PlacementError) as error:
        check_placement(s, {"GPU": 8.0, "CPU": 64.0})
    assert str(error.value) == (
        "flow.rollout_shards: 4 update workers of 1 GPU each (train.workers x train.worker_gpus) + 5 rollout "
        "workers of 1 GPU each (flow.rollout_shards x flow.ray.shard_gpus) need 9 GPUs (split), the Ray cluster "
        "has 8; lower train.workers or flow.rollout_shards, or set flow.placement=colocated (they share GPUs, the "
        "engines asleep during the update), or add nodes")
    # nothing on a cluster with another runner, whatever the resources
    assert not check_placement(defaults(), {}).on_cluster


@pytest.mark.parametrize(("overrides", "message"), [
    (["train.workers=2"], r"^train.workers: 2 update workers run on Ray Train, and flow.runner is thread: set "
                          r"flow.runner=ray"),
    (["flow.runner=ray", "train.workers=33"], r"^train.workers: 33 workers share each mini-batch of "
                                              r"train.mini_batch_size=32 rows"),
    (["flow.runner=ray", "flow.placement=colocated"], r"^flow.placement: colocated puts the update workers"),
    (["flow.runner=ray", "flow.placement=colocated", "train.workers=2", "flow.ray.shard_gpus=1",
      "engine.backend=vllm", "engine.vllm.sleep_mode=true"], r"^flow.placement: colocated on GPUs is not supported yet"),
    (["flow.runner=ray", "train.workers=2", "model.device=cpu"], r"^train.worker_gpus: 1 gives each update worker a GPU"),
    (["train.worker_gpus=0.5"], r"^train.worker_gpus: must be a valid integer"),
    (["train.worker_gpus=2"], r"^train.worker_gpus: must be less than or equal to 1"),
    (["train.sharding=zero"], r"^train.sharding: must be 'fsdp' or 'ddp'"),
])
def test_the_rules_of_the_keys_name_them(overrides, message):
    with pytest.raises(SettingsError, match=message):
        defaults(*overrides)


def test_colocated_on_cpus_is_allowed():
    assert defaults("flow.runner=ray", "flow.placement=colocated", "train.workers=2", "train.worker_gpus=0")


def test_a_training_flow_on_ray_refuses_a_placement_that_does_not_fit_before_any_work(monkeypatch):
    """The flow's check right after Ray connects (tasks.ray.cluster.on_ray, which the train flow
    enters before its first step): with 7 GPUs for paper_8gpu's 8 it fails naming the key, before
    the nodes are inspected (a marker file on the shared root) or a worker actor starts."""
    import ray

    import tasks.ray.cluster as cluster

    touched = []
    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 64.0, "GPU": 7.0})
    monkeypatch.setattr(cluster, "check_cluster", lambda settings: touched.append("nodes") or 1)
    monkeypatch.setattr(cluster, "rollout_workers",
                        lambda settings, shards: touched.append("actors") or contextlib.nullcontext([]))
    s = defaults("+experiment=paper_8gpu")
    with pytest.raises(cluster.ClusterError, match=r"^flow\.rollout_shards: 4 update workers of 1 GPU each .* need "
                                                   r"8 GPUs \(split\), the Ray cluster has 7; lower"), \
            cluster.on_ray(s, s.flow.rollout_shards):
        pass
    assert touched == []
    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 64.0, "GPU": 8.0})
    with cluster.on_ray(s, s.flow.rollout_shards):
        pass
    assert touched == ["nodes", "actors"]


# -- the memory plan per GPU ------------------------------------------------------------------
def parts_of(memory):
    return {p.name.split(",")[0].split(" (")[0]: p.bytes for p in memory.parts}


@pytest.mark.parametrize("workers", [2, 4, 8])
def test_fsdp_divides_the_update_s_state_by_the_workers(workers):
    """Full fine-tuning of Qwen3-4B: the float32 master weights, gradients and AdamW's two
    moments are 4, 4 and 8 bytes a parameter, over ``workers`` (each shard rounded up); the
    autocast copy gives way to what FSDP2 gathers; activations and logits are one worker's micro-batch, as in one process."""
    one = parts_of(plan(defaults("+experiment=paper_8gpu", "train.workers=1", "flow.runner=thread",
                                 "flow.rollout_shards=1"), 80 * GIB))
    each = parts_of(plan(defaults("+experiment=paper_8gpu", f"train.workers={workers}"), 80 * GIB))
    assert one["master weights"] == QWEN3_4B * 4 and one["bfloat16 copy for the forward pass"] == QWEN3_4B * 2
    assert each["master weights"] == math.ceil(QWEN3_4B * 4 / workers)
    assert each["gradients"] == math.ceil(QWEN3_4B * 4 / workers)
    assert each["AdamW moments"] == math.ceil(QWEN3_4B * 8 / workers)
    assert "bfloat16 copy for the forward pass" not in each
    # FSDP2 holds the root (embeddings, tied output layer) gathered for the whole pass and a layer
    # with the next prefetched, as the shards hold them (float32), with float32 gradients of the
    # root and one layer
    assert each["gathered"] == (QWEN3_4B_EMBEDDINGS + 2 * QWEN3_4B_LAYER) * 4 + (QWEN3_4B_EMBEDDINGS + QWEN3_4B_LAYER) * 4
    for same in ("activations", "logits", "output layer's copy and gradient", "CUDA context and workspaces"):
        assert each[same] == one[same]


def test_fsdp_divides_lora_s_frozen_weights_too_and_ddp_replicates_everything():
    one = parts_of(plan(defaults("+experiment=paper"), 80 * GIB))
    ray = ["+experiment=paper", "flow.runner=ray", "train.workers=4", "flow.rollout_shards=4", "flow.ray.shard_gpus=1"]
    fsdp = parts_of(plan(defaults(*ray), 80 * GIB))
    assert fsdp["frozen weights"] == math.ceil(QWEN3_4B * 2 / 4)
    assert fsdp["LoRA r=64 adapters"] == fsdp["gradients"] == math.ceil(QWEN3_4B_LORA_64 * 4 / 4)
    assert fsdp["AdamW moments"] == math.ceil(QWEN3_4B_LORA_64 * 8 / 4)
    ddp = parts_of(plan(defaults(*ray, "train.sharding=ddp"), 80 * GIB))
    for part in ("frozen weights", "LoRA r=64 adapters", "gradients", "AdamW moments", "activations", "logits"):
        assert ddp[part] == one[part]
    assert "gathered" not in ddp and "vLLM engine" not in ddp  # split: the engines' GPUs are theirs
    # full fine-tuning replicated on 4 GPUs: the plan shows it does not fit, naming the key
    with pytest.raises(SettingsError, match=r"^model.lora: the plan needs .* on each update worker's GPU"):
        check_fits(defaults("+experiment=paper_8gpu", "train.sharding=ddp"), 80 * GIB, "H100")


def test_colocated_puts_the_engine_on_the_update_worker_s_gpu_asleep_during_the_update():
    # what the plan would give once engines on Ray sleep during the update (the settings refuse it today)
    base = defaults("+experiment=paper_8gpu", "engine.vllm.sleep_mode=true", "engine.vllm.gpu_memory_utilization=0.55")
    s = with_(base, train={"workers": 8}, flow={"placement": "colocated", "rollout_shards": 8})
    (memory,) = gpu_plans(s, 80 * GIB)  # no GPU of the engines' own
    engine = {p.name: p for p in memory.parts if p.name.startswith("vLLM")}
    assert engine["vLLM engine, awake"].bytes == int(0.55 * 80 * GIB) and engine["vLLM engine, awake"].during == "rollout"
    assert engine["vLLM engine, asleep"].during == "update"
    state = sum(p.bytes for p in memory.parts if p.during == "always")
    assert memory.total("rollout") == state + int(0.55 * 80 * GIB)
    assert memory.total("update") == state + sum(p.bytes for p in memory.parts if p.during == "update")
    assert memory.count == 8 and memory.peak < 80 * GIB


def test_engines_of_a_fraction_of_a_gpu_share_its_memory():
    s = defaults("flow.runner=ray", "flow.rollout_shards=4", "flow.ray.shard_gpus=0.5", "engine.backend=vllm",
                 "engine.vllm.gpu_memory_utilization=0.6", "model=qwen3_4b")
    update, engines = gpu_plans(s, 80 * GIB)
    assert engines.count == 2 and engines.total("rollout") == 2 * int(0.6 * 80 * GIB)
    with pytest.raises(SettingsError, match=r"^engine.vllm.gpu_memory_utilization: the plan needs 96.0 GiB during "
                                            r"the update on each engine's GPU"):
        check_fits(s, 80 * GIB, "H100")


# -- +experiment=paper_8gpu -------------------------------------------------------------------
def test_paper_8gpu_is_full_fine_tuning_of_qwen3_4b_that_fits_one_node_of_8_h100():
    s = defaults("+experiment=paper_8gpu")
    paper = defaults("+experiment=paper")
    assert s.model.path == "Qwen/Qwen3-4B" and s.model.lora is None
    assert (s.train.iterations, s.train.mini_batch_size, s.engine.group_size, s.engine.groups) == (
        paper.train.iterations, paper.train.mini_batch_size, paper.engine.group_size, paper.engine.groups)
    assert s.engine.sampling.max_new_tokens == paper.engine.sampling.max_new_tokens == 8192
    assert s.train.workers > 1 and s.train.sharding == "fsdp" and s.flow.runner == "ray"
    where = check_placement(s, {"GPU": 8.0, "CPU": 64.0})
    assert where.gpus == 8
    for gpus in range(8):
        with pytest.raises(PlacementError):
            check_placement(s, {"GPU": float(gpus), "CPU": 64.0})
    plans = gpu_plans(s, 80 * GIB, "H100")
    assert sum(p.count for p in plans) == 8
    assert all(p.peak <= 80 * 10**9 for p in plans), [p.peak / GIB for p in plans]  # 80 GB, not GiB
    assert check_fits(s, 80 * GIB, "H100") == plans[0]
    # the same model and batch in one process does not fit one GPU even without its engine: the reason for the workers
    one = plan(defaults("+experiment=paper_8gpu", "train.workers=1", "flow.rollout_shards=1"), 80 * GIB)
    assert one.total("update") > 80 * GIB and not any(p.name.startswith("vLLM") for p in one.parts)


def test_the_plan_command_prints_each_gpu(capsys):
    from mage.__main__ import main

    assert main(["plan", "--gpu-gib", "80", "+experiment=paper_8gpu"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("on the Ray cluster: 4 update workers (fsdp) of 1 GPU and 1 CPU each; 4 engines")
    assert "memory plan of each update worker's GPU (x4)" in out and "memory plan of each engine's GPU (x4)" in out
    assert "fits on each update worker's GPU" in out and "fits on each engine's GPU" in out
