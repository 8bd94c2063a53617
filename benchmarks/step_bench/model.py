"""torchtitan 0.3.0's llama3 debug model, shrunk, parallelized by torchtitan's own code.

Everything here runs inside a rank (after ``init_process_group``). torchtitan is
imported lazily: it is an optional dependency (the ``frameworks`` extra).
"""

from __future__ import annotations

import importlib.util
import sys
import types
from dataclasses import dataclass

import torch

# Modules torchtitan imports at module level that a CPU step never uses.
_STUBBED_IF_MISSING = ("triton", "datasets", "wandb")

DIM = 128
N_LAYERS = 2
N_HEADS = 8
VOCAB = 2048
SEQ = 64

_TORCHTITAN_MODULES = (
    "torchtitan.models.llama3",
    "torchtitan.models.llama3.parallelize",
    "torchtitan.components.loss",
    "torchtitan.distributed.utils",
    "torchtitan.experiments.graph_trainer.common_utils",
)


@dataclass(frozen=True)
class StepConfig:
    """One parallel layout: how torchtitan parallelizes the model, on which mesh."""

    name: str  # fsdp2_tp, simplefsdp_tp, full_dtensor, tp_classic
    dp_replicate: int
    dp_shard: int
    tp: int
    dim: int = DIM  # the model's hidden size (its FFN width follows from it)

    @property
    def mesh(self) -> str:
        return f"{self.dp_replicate}x{self.dp_shard}x{self.tp}"

    @property
    def world(self) -> int:
        return self.dp_replicate * self.dp_shard * self.tp

    @property
    def label(self) -> str:
        return f"{self.name} {self.mesh}" + (f" dim {self.dim}" if self.dim != DIM else "")


def import_torchtitan() -> list[str]:
    """Import the torchtitan modules the bench uses; returns the modules it had to stub.

    torchtitan imports triton, datasets and wandb at module level (triton for GPU
    kernels of expert parallelism). A missing one is replaced, for the import only,
    by a permissive stand-in in ``sys.modules``, and removed again afterwards: torch
    asks whether triton is installed and must keep getting "no". torch's compiler
    modules are imported first for the same reason.
    """
    import torch._dynamo  # noqa: F401 - decides "no triton" before any stand-in exists

    stubbed: list[str] = []
    try:
        while True:
            try:
                for name in _TORCHTITAN_MODULES:
                    importlib.import_module(name)
                _use_cpu()
                return sorted({s.split(".")[0] for s in stubbed})
            except ModuleNotFoundError as e:
                missing = e.name or ""
                if missing.split(".")[0] not in _STUBBED_IF_MISSING or missing in stubbed:
                    raise
                for mod in [m for m in sys.modules if m.split(".")[0] == "torchtitan"]:
                    del sys.modules[mod]
                sys.modules[missing] = _Anything(missing)
                stubbed.append(missing)
    finally:
        for name in stubbed:
            sys.modules.pop(name, None)


def _use_cpu() -> None:
    """torchtitan picks "cuda" when no accelerator is found; its meshes must be CPU meshes."""
    for name, mod in list(sys.modules.items()):
        if name.split(".")[0] == "torchtitan" and getattr(mod, "device_type", None) == "cuda":
            mod.device_type = "cpu"
            if hasattr(mod, "device_module"):
                mod.device_module = torch.cpu


class _Anything(types.ModuleType):
    """A module whose every attribute, call and decoration gives something usable."""

    def __init__(self, name: str):
        super().__init__(name)
        self.__path__ = []

    def __getattr__(self, attr: str):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Anything(f"{self.__name__}.{attr}")

    def __call__(self, *args, **kwargs):
        if len(args) == 1 and callable(args[0]) and not kwargs:
            return args[0]  # used as a decorator
        return _Anything(self.__name__ + "()")

    def __getitem__(self, item):
        return self

    def __mro_entries__(self, bases):
        return (object,)


def model_config(fuse_qkv: bool = True, dim: int = DIM):
    """llama3 'debugmodel' built by torchtitan's own helpers: dim 128 (or ``dim``), 2 layers,
    SDPA attention.

    ``fuse_qkv=False``: separate q, k, v projections (classic tensor parallelism shards each).
    """
    from torchtitan.models.common import ComplexRoPE, Embedding, Linear, RMSNorm, compute_ffn_hidden_dim
    from torchtitan.models.common.attention import ScaledDotProductAttention
    from torchtitan.models.llama3 import (
        _EMBEDDING_INIT,
        _NORM_INIT,
        Llama3Model,
        _build_llama3_layers,
        _output_linear_init,
    )

    layers = _build_llama3_layers(
        fuse_qkv=fuse_qkv,
        n_layers=N_LAYERS,
        dim=dim,
        n_heads=N_HEADS,
        hidden_dim=compute_ffn_hidden_dim(dim, multiple_of=256),
        rope=ComplexRoPE.Config(dim=dim // N_HEADS, max_seq_len=SEQ * 4, theta=500000, scaling="llama"),
        attn_backend="flex",  # swapped for SDPA below: flex attention has no CPU backward
    )
    for layer in layers:
        layer.attention.inner_attention = ScaledDotProductAttention.Config()
    return Llama3Model.Config(
        dim=dim,
        vocab_size=VOCAB,
        tok_embeddings=Embedding.Config(num_embeddings=VOCAB, embedding_dim=dim, param_init=_EMBEDDING_INIT),
        norm=RMSNorm.Config(normalized_shape=dim, param_init=_NORM_INIT),
        lm_head=Linear.Config(in_features=dim, out_features=VOCAB, param_init=_output_linear_init(dim)),
        layers=layers,
    )


SPMD_BACKEND = {
    "fsdp2_tp": "partial_dtensor",
    "simplefsdp_tp": "partial_dtensor",
    "full_dtensor": "full_dtensor",
    "tp_classic": "partial_dtensor",
}


_parallel_dims: dict = {}


def build(cfg: StepConfig, world: int, compile_backend=None):
    """(model, parallel_dims) on CPU, parallelized by torchtitan as its trainer does.

    ``compile_backend``: compile every TransformerBlock with it (torchtitan's
    per-block compile); activation checkpointing stays off (selective AC under
    compile fails inside torch).
    """
    from torchtitan.config import CompileConfig, ParallelismConfig, TrainingConfig
    from torchtitan.distributed import ParallelDims
    from torchtitan.distributed import utils as dist_utils

    spmd_backend = SPMD_BACKEND[cfg.name]
    parallelism = ParallelismConfig(
        data_parallel_replicate_degree=cfg.dp_replicate,
        data_parallel_shard_degree=cfg.dp_shard,
        tensor_parallel_degree=cfg.tp,
        spmd_backend=spmd_backend,
    )
    training = TrainingConfig(
        local_batch_size=1, seq_len=SEQ, mixed_precision_param="float32", mixed_precision_reduce="float32"
    )
    key = (cfg, world)
    dims = _parallel_dims.get(key)
    if dims is None:
        # One ParallelDims per process, shared by the modes, as in one job: torchtitan
        # keeps the first meshes it resolves (a second ParallelDims' params would sit
        # on other mesh objects than the ones fully_shard is given).
        dims = _parallel_dims[key] = ParallelDims.from_config(parallelism, world)
        dims.build_mesh()
    dist_utils.set_spmd_backend(spmd_backend)
    config = model_config(fuse_qkv=cfg.name != "tp_classic", dim=cfg.dim)
    config.update_from_config(config=types.SimpleNamespace(parallelism=parallelism, training=training))
    with torch.device("meta"):
        model = config.build()
    if cfg.name == "simplefsdp_tp":
        model = _parallelize_simple_fsdp(model, dims, training)
    elif cfg.name == "tp_classic":
        _parallelize_classic_tp(model, dims.get_mesh("tp"))
    else:
        from torchtitan.models.llama3.parallelize import parallelize_llama

        model = parallelize_llama(
            model,
            parallel_dims=dims,
            training=training,
            parallelism=parallelism,
            compile_config=CompileConfig(enable=False, components=[]),
            ac_config=None,
            dump_folder="/tmp",
        )
    model.to_empty(device="cpu")
    torch.manual_seed(0)
    with torch.no_grad():
        model.init_weights(buffer_device=None)
    model.train()
    if compile_backend is not None:
        for _, block in model.layers.named_children():
            block.compile(backend=compile_backend, fullgraph=False)
    return model, dims


def _parallelize_simple_fsdp(model, dims, training):
    """graph_trainer's llama3 parallelization without its own compile: TP, then SimpleFSDP."""
    from torchtitan.experiments.graph_trainer.common_utils import apply_simple_fsdp

    if dims.tp_enabled:
        model.parallelize(dims)
    return apply_simple_fsdp(model, parallel_dims=dims, training=training)


def _parallelize_classic_tp(model, tp_mesh) -> None:
    """Classic (Megatron) tensor parallelism with torch's ``parallelize_module``, no sequence
    parallelism: q, k, v, gate (w1) and up (w3) colwise, wo and down (w2) rowwise, every
    activation a local tensor (``use_local_output=True``), so the backward all_reduces each
    colwise projection's input grad on its own and autograd sums them afterwards. lm_head is
    colwise with replicated logits. Embedding and norms are replicated DTensors (torchtitan's
    Embedding reads ``weight.to_local()``; norms get their input as a replicated DTensor), so
    every gradient is a DTensor on the tp mesh, as ``clip_grad_norm_`` needs.
    """
    from torch.distributed.tensor import DTensor, Replicate, distribute_module
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    colwise = (
        "attention.qkv_linear.wq",
        "attention.qkv_linear.wk",
        "attention.qkv_linear.wv",
        "feed_forward.w1",
        "feed_forward.w3",
    )
    rowwise = ("attention.wo", "feed_forward.w2")
    plan: dict = {"lm_head": ColwiseParallel(output_layouts=Replicate())}
    for name, _ in model.layers.named_children():
        plan.update({f"layers.{name}.{m}": ColwiseParallel() for m in colwise})
        plan.update({f"layers.{name}.{m}": RowwiseParallel() for m in rowwise})
    parallelize_module(model, tp_mesh, plan)

    def replicated_input(_module, inputs, mesh):
        return tuple(DTensor.from_local(x, mesh, [Replicate()], run_check=False) for x in inputs)

    def local_output(_module, output, _mesh):
        return output.to_local()

    distribute_module(model.tok_embeddings, tp_mesh)
    for name, module in model.named_modules():
        if name == "norm" or name.endswith("_norm"):
            distribute_module(module, tp_mesh, input_fn=replicated_input, output_fn=local_output)
