"""Inductor: its compiler entry points, custom-pass hook, FX graph cache key and
collective bucketing.

Read in the sources of torch 2.11 to 2.15 (``_inductor/custom_graph_pass.py``,
``config.py``, ``codecache.py``, ``compile_fx.py``, ``fx_passes/bucketing.py``,
``torch/distributed/config.py``, ``torch/compiler/config.py``). What moves:

- ``config.post_grad_custom_post_pass``: 2.13 and later take one pass or a list
  (read with ``custom_graph_pass.get_custom_graph_passes``); 2.11 and 2.12 take one
  pass (a ``CustomGraphPass`` or a callable; 2.12 calls a
  ``CustomInferenceAwareGraphPass`` with ``is_inference=``), and have no
  ``get_custom_graph_passes``. :func:`post_grad_passes_with` puts a pass after the
  user's on either: before 2.13 as one :class:`_Chain` pass whose ``uuid()`` covers
  both (None, which keeps the compile out of the FX graph cache as those releases do
  for any pass without one, when the user's pass has none).
- ``bucketing.reduce_scatter_merge_fn_to_trace``: 2.11 and 2.12 take ``(rs_ins,
  group_size, group_name, ...)``, 2.13 and later ``(rs_ins, group_name, group_size, ...)``;
  :func:`reduce_scatter_merge_fn` takes the later order and reads the installed
  one off the signature (and raises on any other). ``all_reduce_merge_fn_to_trace``
  and the first six parameters of ``process_collective_bucket`` are the same in all
  three (2.13 adds ``extra_graph_inps``, 2.15 ``input_transform``; unused).
- ``compile_on_one_rank``: ``torch.distributed.config`` up to 2.13; 2.14 and 2.15 keep
  it in ``torch.compiler.config`` (the distributed name is then a deprecated alias
  that warns on every read). :func:`compile_on_one_rank` reads where the installed
  release keeps it.
- The compile caches, workers and recompile limits :func:`separate_compiles` patches
  (``_inductor.config.fx_graph_cache`` and ``compile_threads``,
  ``_functorch.config.enable_autograd_cache``,
  ``_dynamo.config.recompile_limit`` and ``accumulated_recompile_limit``) are the same
  names in all of them.
- ``codecache.FxGraphCachePickler`` keys ``FakeScriptObject`` inputs (an opaque
  DeviceMesh) through its ``dispatch_table`` in all of them.

Inductor's compiler modules load lazily (``import redist_opt`` does not import
``compile_fx``): names from them resolve at first use, loudly.
"""

from __future__ import annotations

import contextlib
import inspect

from redist_opt.torch_api.version import PrivateName, TorchAPIError, private, resolve_declared

__all__ = [
    "PRIVATE_NAMES",
    "CustomGraphPass",
    "compile_fx",
    "compile_fx_inner",
    "post_grad_custom_post_pass",
    "post_grad_passes_with",
    "compile_on_one_rank",
    "compile_on_one_rank_config",
    "fx_graph_key_pickler",
    "opaque_input_reducer",
    "reduce_scatter_merge_fn",
    "all_reduce_merge_fn",
    "process_collective_bucket",
    "separate_compiles",
]

_PASS = "torch._inductor.custom_graph_pass"
_BUCKETING = "torch._inductor.fx_passes.bucketing"
_COMPILE_FX = "torch._inductor.compile_fx"

_GET_CUSTOM_GRAPH_PASSES = PrivateName(_PASS, "get_custom_graph_passes", since=(2, 13))
_INFERENCE_AWARE = PrivateName(_PASS, "CustomInferenceAwareGraphPass", since=(2, 12))
_COMPILER_CONFIG = PrivateName("torch.compiler.config", "compile_on_one_rank", since=(2, 14))
_DISTRIBUTED_CONFIG = PrivateName("torch.distributed.config", "compile_on_one_rank")
_COMPILE_FX_NAME = PrivateName(_COMPILE_FX, "compile_fx", lazy=True)
_COMPILE_FX_INNER = PrivateName(_COMPILE_FX, "compile_fx_inner", lazy=True)
_PICKLER = PrivateName("torch._inductor.codecache", "FxGraphCachePickler", lazy=True)
_FAKE_SCRIPT_OBJECT = PrivateName("torch._library.fake_class_registry", "FakeScriptObject")
_RS_MERGE = PrivateName(_BUCKETING, "reduce_scatter_merge_fn_to_trace", lazy=True)
_AR_MERGE = PrivateName(_BUCKETING, "all_reduce_merge_fn_to_trace", lazy=True)
_BUCKET = PrivateName(_BUCKETING, "process_collective_bucket", lazy=True)
_FX_GRAPH_CACHE = PrivateName("torch._inductor.config", "fx_graph_cache")
_COMPILE_THREADS = PrivateName("torch._inductor.config", "compile_threads")
_AUTOGRAD_CACHE = PrivateName("torch._functorch.config", "enable_autograd_cache")
_RECOMPILE_LIMIT = PrivateName("torch._dynamo.config", "recompile_limit")
_ACCUMULATED_RECOMPILE_LIMIT = PrivateName("torch._dynamo.config", "accumulated_recompile_limit")

PRIVATE_NAMES = (
    PrivateName(_PASS, "CustomGraphPass"),
    _GET_CUSTOM_GRAPH_PASSES,
    _INFERENCE_AWARE,
    PrivateName("torch._inductor.config", "post_grad_custom_post_pass"),
    _COMPILER_CONFIG,
    _DISTRIBUTED_CONFIG,
    _COMPILE_FX_NAME,
    _COMPILE_FX_INNER,
    _PICKLER,
    _FAKE_SCRIPT_OBJECT,
    _RS_MERGE,
    _AR_MERGE,
    _BUCKET,
    _FX_GRAPH_CACHE,
    _COMPILE_THREADS,
    _AUTOGRAD_CACHE,
    _RECOMPILE_LIMIT,
    _ACCUMULATED_RECOMPILE_LIMIT,
)
resolve_declared(PRIVATE_NAMES)

CustomGraphPass = private(_PASS, "CustomGraphPass")
_inductor_config = private("torch._inductor.config")


def compile_fx(*args, **kwargs):
    """Inductor's whole-graph compiler (``torch._inductor.compile_fx.compile_fx``)."""
    return _COMPILE_FX_NAME.get()(*args, **kwargs)


def compile_fx_inner(*args, **kwargs):
    """Inductor's per-graph compiler, with aot_autograd's ``fw_compiler`` contract."""
    return _COMPILE_FX_INNER.get()(*args, **kwargs)


def post_grad_custom_post_pass():
    """What ``torch._inductor.config.post_grad_custom_post_pass`` holds now."""
    return _inductor_config.post_grad_custom_post_pass


class _Chain(CustomGraphPass):
    """torch 2.11 / 2.12's one post-grad custom pass standing for two: the user's, then ours."""

    def __init__(self, first, then) -> None:
        self.first, self.then = first, then

    def __call__(self, graph) -> None:
        self.first(graph)
        self.then(graph)

    def uuid(self):
        first = self.first.uuid() if isinstance(self.first, CustomGraphPass) else None
        if first is None:  # a pass without one: 2.11 leaves such compiles out of its cache
            return None
        return ("redist_opt.chain", first, self.then.uuid())


if _INFERENCE_AWARE.expected and not _GET_CUSTOM_GRAPH_PASSES.expected:

    class _InferenceAwareChain(_Chain, _INFERENCE_AWARE.get()):
        """2.12's chain when the user's pass is inference-aware: it gets ``is_inference``."""

        def __call__(self, graph, is_inference: bool) -> None:
            self.first(graph, is_inference=is_inference)
            self.then(graph)


def post_grad_passes_with(mark):
    """The value for ``post_grad_custom_post_pass`` that runs the passes the user set
    now, then ``mark`` (a ``CustomGraphPass``)."""
    user = post_grad_custom_post_pass()
    if _GET_CUSTOM_GRAPH_PASSES.expected:
        passes = _GET_CUSTOM_GRAPH_PASSES.get()(user)
        return [*passes, mark] if passes else mark
    if user is None:
        return mark
    if _INFERENCE_AWARE.expected and isinstance(user, _INFERENCE_AWARE.get()):
        return _InferenceAwareChain(user, mark)
    return _Chain(user, mark)


def _one_rank_name() -> PrivateName:
    return _COMPILER_CONFIG if _COMPILER_CONFIG.expected else _DISTRIBUTED_CONFIG


def compile_on_one_rank() -> bool:
    """Whether one rank's compile is to run on every rank (``compile_on_one_rank``),
    read where the installed torch keeps it."""
    return bool(_one_rank_name().get())


def compile_on_one_rank_config():
    """The config module :func:`compile_on_one_rank` reads (``torch.compiler.config``
    from 2.14, ``torch.distributed.config`` before): what to ``patch(compile_on_one_rank=...)``
    without the deprecated alias's warning."""
    return private(_one_rank_name().module)


def fx_graph_key_pickler():
    """Inductor's FX graph cache key pickler class (``codecache.FxGraphCachePickler``)."""
    return _PICKLER.get()


def opaque_input_reducer(pickler):
    """(``FakeScriptObject``, the reducer ``pickler`` keys such opaque inputs with)."""
    fake_script_object = _FAKE_SCRIPT_OBJECT.get()
    try:
        return fake_script_object, pickler.dispatch_table[fake_script_object]
    except KeyError:
        raise TorchAPIError(
            f"redist_opt expects {_PICKLER.path} to key FakeScriptObject inputs through its "
            "dispatch_table (torch 2.11 to 2.15 do); this torch does not"
        ) from None


def _reduce_scatter_takes_size_first(fn) -> bool:
    parameters = list(inspect.signature(fn).parameters)[1:3]
    if parameters == ["group_size", "group_name"]:  # 2.11
        return True
    if parameters == ["group_name", "group_size"]:  # 2.13 and later
        return False
    raise TorchAPIError(f"{_RS_MERGE.path}: unknown parameters {parameters} (read in torch 2.11 to 2.15)")


def reduce_scatter_merge_fn(rs_ins, group_name, group_size, reduce_op, reduce_dtype, device):
    """Inductor's merged reduce_scatter, traced into a graph: one reduce_scatter of the
    inputs' rank-major concatenation, split back. Arguments in torch 2.13's order."""
    fn = _RS_MERGE.get()
    if _reduce_scatter_takes_size_first(fn):  # 2.11 / 2.12 ``view`` each input where 2.13 reshapes
        rs_ins = [x.contiguous() for x in rs_ins]
        return fn(rs_ins, group_size, group_name, reduce_op, reduce_dtype, device)
    return fn(rs_ins, group_name, group_size, reduce_op, reduce_dtype, device)


def all_reduce_merge_fn(ar_ins, group_name, reduce_op, reduce_dtype, device):
    """Inductor's merged all_reduce, traced into a graph: one all_reduce of the flattened inputs."""
    return _AR_MERGE.get()(ar_ins, group_name, reduce_op, reduce_dtype, device)


def process_collective_bucket(graph, bucket_nodes, fn_to_trace, trace_args_fn, *, insert_before, wait_at):
    """Inductor's rewrite of a bucket of collectives into ``fn_to_trace``, inserted before
    ``insert_before``, the waits moved before ``wait_at``."""
    return _BUCKET.get()(
        graph,
        bucket_nodes,
        fn_to_trace,
        trace_args_fn,
        insert_before=insert_before,
        wait_insertion_point=wait_at,
    )


@contextlib.contextmanager
def separate_compiles(recompile_limit: int = 64, *, compile_threads: int | None = None):
    """Within the block, every compile of one program is its own: Inductor's FX graph cache
    and AOTAutograd's cache are off (a later compile of the same code with other options
    is never served an earlier one's artifact, and each compile traces, so what it plans
    is seen), and Dynamo keeps up to ``recompile_limit`` compiled versions of one frame
    (one per backend compiled in the block) instead of falling back to eager.
    ``compile_threads``: Inductor's compile workers in the block (1: compile in this
    process, no worker pool; None: Inductor's own setting)."""
    names = (
        _FX_GRAPH_CACHE,
        _COMPILE_THREADS,
        _AUTOGRAD_CACHE,
        _RECOMPILE_LIMIT,
        _ACCUMULATED_RECOMPILE_LIMIT,
    )
    for name in names:
        name.get()  # a moved name raises here, naming it, before anything is patched
    dynamo_config = private(_RECOMPILE_LIMIT.module)
    accumulated = max(recompile_limit * 16, dynamo_config.accumulated_recompile_limit)
    threads = {} if compile_threads is None else {"compile_threads": compile_threads}
    with (
        private(_FX_GRAPH_CACHE.module).patch(fx_graph_cache=False, **threads),
        private(_AUTOGRAD_CACHE.module).patch(enable_autograd_cache=False),
        dynamo_config.patch(recompile_limit=recompile_limit, accumulated_recompile_limit=accumulated),
    ):
        yield
