"""Alpha-beta cost model of collectives over mesh groups.

Interface used by the passes (keep it stable):

    model = CostModel.default()            # NCCL-like profile
    model = CostModel.profile("gloo")      # measured-on-CPU-like profile
    model = CostModel.load(path)           # written by `redist-opt calibrate`
    model.save(path)                       # JSON; round-trips through load
    model.collective_time(kind, group, nbytes, mesh) -> seconds
        kind: "all_reduce" | "reduce_scatter" | "all_gather" | "all_to_all"
        group: MeshGroup; nbytes: bytes each rank feeds in; mesh: MeshSpec
    model.plan_time(plan) -> seconds       # sum over the plan's collectives
    model.group_creation_time(group, mesh) -> seconds (paid once under groups="create")
    model.fitted: ((kind, group size, link, up_to_nbytes, per_call_s, per_byte_s), ...)
        measured by `redist-opt calibrate`; a collective whose (kind, size, link) is
        listed costs per_call + per_byte * nbytes of the first row whose up_to_nbytes
        covers nbytes (the last row beyond), any other the alpha-beta formula
    model.slower_in_steps: pass names the default pipeline leaves out under this profile
        (their rewrites made measured training steps slower; the gloo profile lists one,
        which redist_opt.pipeline declares: declare_slower_in_steps)
    resolve(mesh) -> (model, source)       # what optimize() uses without cost=: the
        # file or name in $REDIST_OPT_COST_PROFILE, else the mesh's backend's profile
        # (gloo -> "gloo"; nccl, fake, unknown -> "nccl"), else the default
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import json
import math
import os

from redist_opt.ir import gloo_measured

__all__ = [
    "CostModel",
    "PROFILE_FORMAT",
    "PROFILE_ENV",
    "KINDS",
    "steps_and_bytes",
    "resolve",
    "backend_profile",
    "load_profile",
    "declare_slower_in_steps",
]

# The "format" tag of the JSON files ``save`` writes and ``load`` reads.
PROFILE_FORMAT = "redist_opt.ir.cost/1"

KINDS = ("all_reduce", "reduce_scatter", "all_gather", "all_to_all")
ALGORITHMS = ("ring", "tree")


def steps_and_bytes(kind: str, p: int, nbytes: float, algorithm: str) -> tuple[int, float]:
    """(latency steps, bytes moved per rank) of one ``kind`` collective over ``p`` ranks.

    ``nbytes`` is what each rank feeds in. Ring all_reduce is a reduce_scatter plus
    an all_gather: 2(p-1) steps moving 2(p-1)/p of the buffer; tree algorithms pay
    about log2(p) steps per phase for the same volume (bandwidth-optimal variants).
    all_to_all is p-1 pairwise exchanges under either algorithm.
    """
    if p <= 1:
        return 0, 0.0
    ring = algorithm == "ring"
    log_p = math.ceil(math.log2(p))
    if kind == "all_reduce":
        return (2 * (p - 1) if ring else 2 * log_p), 2 * nbytes * (p - 1) / p
    if kind == "reduce_scatter":
        return (p - 1 if ring else log_p), nbytes * (p - 1) / p
    if kind == "all_gather":
        return (p - 1 if ring else log_p), nbytes * (p - 1)
    if kind == "all_to_all":
        return p - 1, nbytes * (p - 1) / p
    raise ValueError(f"unknown collective kind {kind!r} (known: {', '.join(KINDS)})")


def _as_int(key: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value):
        raise ValueError(f"cost profile {key}={value!r} must be an integer")
    return int(value)


def _pass_names(value) -> tuple:
    """A ``slower_in_steps`` value (a list or tuple of pass names) as a tuple.

    Only their form is checked here: which passes exist is the pipeline's to say
    (``redist_opt.pipeline.check_pass_names``), above the IR."""
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) and v for v in value):
        raise ValueError(f"cost profile slower_in_steps={value!r} must be a list of pass names")
    return tuple(value)


def _fitted_rows(value) -> tuple:
    """The ``fitted`` field from JSON: rows [kind, p, link, up_to_nbytes, per_call_s, per_byte_s]."""
    shape = "[kind, p, link, up_to_nbytes, per_call_s, per_byte_s]"
    if not isinstance(value, (list, tuple)):
        raise ValueError(f"cost profile fitted={value!r} must be a list of {shape}")
    rows = []
    for row in value:
        if not isinstance(row, (list, tuple)) or len(row) != 6:
            raise ValueError(f"cost profile fitted row {row!r} must be {shape}")
        kind, p, link, up_to, a, b = row
        if kind not in KINDS:
            raise ValueError(f"cost profile fitted row {row!r}: unknown collective kind {kind!r}")
        if link not in ("intra", "inter"):
            raise ValueError(f"cost profile fitted row {row!r}: link {link!r} is not intra or inter")
        for x in (a, b):
            if isinstance(x, bool) or not isinstance(x, (int, float)) or not (x >= 0 and math.isfinite(x)):
                raise ValueError(f"cost profile fitted row {row!r}: terms must be finite numbers >= 0")
        rows.append(
            (
                kind,
                _as_int("fitted group size", p),
                link,
                _as_int("fitted up_to_nbytes", up_to),
                float(a),
                float(b),
            )
        )
    return tuple(rows)


@dataclasses.dataclass(frozen=True)
class CostModel:
    name: str = "nccl"
    # Per collective launch (kernel launch / op dispatch), seconds.
    launch: float = 10e-6
    # Per algorithm step latency, seconds, intra-host and inter-host.
    alpha_intra: float = 2e-6
    alpha_inter: float = 10e-6
    # Bandwidth per rank, bytes/second, intra-host and inter-host.
    bw_intra: float = 150e9
    bw_inter: float = 25e9
    # Ranks per host (consecutive rank indices share a host); None: all on one host.
    devices_per_host: int | None = None
    # "ring" pays 2(p-1) latency steps per all_reduce, "tree" about 2*log2(p).
    algorithm: str = "tree"
    # One-off cost of creating a communicator, and the reuse it is amortized over.
    create_group: float = 50e-3
    expected_reuse: int = 10_000  # e.g. one redistribution per step of a 10k-step run
    # The backend runs reduce_scatter as a full all_reduce plus a local slice (gloo's
    # CPU reduce_scatter measures as slow as all_reduce); `calibrate` fits this.
    reduce_scatter_as_all_reduce: bool = False
    # Measured terms per (kind, group size, link "intra" | "inter") and size range:
    # rows (kind, p, link, up_to_nbytes, per_call_s, per_byte_s), per byte each rank
    # feeds in. Where calibration measured a collective, its own piecewise line beats
    # the shared alpha-beta fit (gloo's all_gather and all_to_all do not scale like a
    # ring, and a scalar all_reduce leaves most of the ring idle).
    fitted: tuple = ()
    # Passes whose rewrites made whole training steps slower on this backend, measured
    # inside the steps (the step bench's ablation, docs/step_wall.md): the default
    # pipeline leaves them out under this profile, except with prefer="consistency"
    # (fewest collectives whatever the time). What a collective costs alone cannot show
    # this: the rewrite is cheaper alone and slower in the step.
    slower_in_steps: tuple = ()

    def __post_init__(self) -> None:
        # Checked at construction, however the model is built (from_dict, replace, a
        # caller's CostModel(...)): a bare string would otherwise read as one pass per letter.
        object.__setattr__(self, "slower_in_steps", _pass_names(self.slower_in_steps))

    @classmethod
    def default(cls) -> CostModel:
        return cls()

    @classmethod
    def profile(cls, name: str) -> CostModel:
        if name == "nccl":
            return cls()
        if name == "gloo":
            # Measured with `redist-opt calibrate` on 8 gloo ranks of this 2-core machine
            # (ir/gloo_measured.py): per-call + per-byte curves per collective and group
            # size, alpha-beta terms for the rest. The textbook ring model below
            # ("gloo-ring") split a loss all_reduce in two where one was measured faster.
            ab = gloo_measured.ALPHA_BETA
            return cls(
                name="gloo",
                launch=ab["launch"],
                alpha_intra=ab["alpha"],
                alpha_inter=ab["alpha"],
                bw_intra=ab["bw"],
                bw_inter=ab["bw"],
                devices_per_host=None,
                algorithm=ab["algorithm"],
                create_group=ab["create_group"],
                reduce_scatter_as_all_reduce=True,
                fitted=gloo_measured.FITTED,
                slower_in_steps=_declared_slower_in_steps("gloo"),
            )
        if name == "gloo-ring":
            # The previous gloo profile: ring algorithms, per-step latency above the
            # launch cost, memory-bound bandwidth (kept as a high-latency ring model).
            return cls(
                name="gloo-ring",
                launch=30e-6,
                alpha_intra=60e-6,
                alpha_inter=60e-6,
                bw_intra=1.5e9,
                bw_inter=1.5e9,
                devices_per_host=None,
                algorithm="ring",
                create_group=20e-3,
                reduce_scatter_as_all_reduce=True,
            )
        raise ValueError(f"unknown cost profile {name!r} (known: {', '.join(BUILTIN_PROFILES)})")

    @classmethod
    def from_dict(cls, data: dict) -> CostModel:
        """A model from ``to_dict()`` output, or from a profile file's parsed JSON."""
        if not isinstance(data, dict):
            raise ValueError(f"cost profile must be a JSON object, got {type(data).__name__}")
        if "model" in data:  # a whole profile file: {"format", "model", "calibration"}
            fmt = data.get("format", PROFILE_FORMAT)
            if fmt != PROFILE_FORMAT:
                raise ValueError(f"cost profile format {fmt!r} is not {PROFILE_FORMAT!r}")
            data = data["model"]
        fields = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - set(fields))
        if unknown:
            raise ValueError(f"cost profile has unknown field(s) {unknown} (known: {sorted(fields)})")
        kwargs = {}
        for key, value in data.items():
            default = fields[key].default
            if key == "fitted":
                kwargs[key] = _fitted_rows(value)
            elif key == "slower_in_steps":
                kwargs[key] = value  # checked by __post_init__
            elif key == "devices_per_host":
                kwargs[key] = None if value is None else _as_int(key, value)
            elif isinstance(default, bool):
                if not isinstance(value, bool):
                    raise ValueError(f"cost profile {key}={value!r} must be true or false")
                kwargs[key] = value
            elif isinstance(default, str):
                if not isinstance(value, str):
                    raise ValueError(f"cost profile {key}={value!r} must be a string")
                kwargs[key] = value
            elif isinstance(default, int):
                kwargs[key] = _as_int(key, value)
            else:
                if isinstance(value, bool) or not isinstance(value, (int, float)):
                    raise ValueError(f"cost profile {key}={value!r} must be a number")
                kwargs[key] = float(value)
        model = cls(**kwargs)
        model.validate()
        return model

    def to_dict(self) -> dict:
        data = dataclasses.asdict(self)
        data["fitted"] = [list(row) for row in self.fitted]
        data["slower_in_steps"] = list(self.slower_in_steps)
        return data

    def validate(self) -> None:
        if self.algorithm not in ALGORITHMS:
            raise ValueError(f"cost profile algorithm {self.algorithm!r} is not one of {ALGORITHMS}")
        for key in ("launch", "alpha_intra", "alpha_inter", "create_group"):
            value = getattr(self, key)
            if not (value >= 0 and math.isfinite(value)):
                raise ValueError(f"cost profile {key}={value!r} must be a finite number >= 0")
        for key in ("bw_intra", "bw_inter"):
            value = getattr(self, key)
            if not value > 0:
                raise ValueError(f"cost profile {key}={value!r} must be > 0 (bytes/second)")
        if self.devices_per_host is not None and self.devices_per_host < 1:
            raise ValueError(f"cost profile devices_per_host={self.devices_per_host} must be >= 1")
        if self.expected_reuse < 1:
            raise ValueError(f"cost profile expected_reuse={self.expected_reuse} must be >= 1")

    @classmethod
    def load(cls, path: str | os.PathLike) -> CostModel:
        """Read a profile written by :meth:`save` or ``redist-opt calibrate``."""
        with open(path) as f:
            try:
                data = json.load(f)
            except json.JSONDecodeError as e:
                raise ValueError(f"cost profile {os.fspath(path)!r} is not valid JSON: {e}") from None
        try:
            return cls.from_dict(data)
        except (TypeError, ValueError) as e:
            raise ValueError(f"cost profile {os.fspath(path)!r}: {e}") from None

    def save(self, path: str | os.PathLike, *, calibration: dict | None = None) -> None:
        """Write the model as JSON; ``calibration`` (measurements, fit) rides along unread."""
        data = {"format": PROFILE_FORMAT, "model": self.to_dict()}
        if calibration is not None:
            data["calibration"] = calibration
        tmp = f"{os.fspath(path)}.tmp{os.getpid()}"
        with open(tmp, "w") as f:
            json.dump(data, f, indent=1, sort_keys=False)
            f.write("\n")
        os.replace(tmp, path)

    def link(self, group, mesh=None) -> str:
        """ "intra" when the group stays within a host, else "inter"."""
        if self.devices_per_host is None or mesh is None:
            return "intra"
        # A group stays within a host when every mode of its layout tiles the
        # host's block of consecutive rank indices: size*stride divides it.
        if all(self.devices_per_host % (s * d) == 0 for s, d in zip(group.layout.shape, group.layout.stride)):
            return "intra"
        return "inter"

    def _fitted_time(self, kind: str, p: int, link: str, nbytes: float) -> float | None:
        """The measured curve's time; for a group size between (or past) the measured
        ones, linear in the group size between the two nearest; None when ``kind`` was
        not measured on ``link``."""
        index = self._fitted_index

        def at(size: int) -> float:
            segments = index[(kind, size, link)]
            _, a, b = next((seg for seg in segments if nbytes <= seg[0]), segments[-1])
            return a + b * nbytes

        if (kind, p, link) in index:
            return at(p)
        sizes = self._fitted_sizes.get((kind, link))
        if not sizes:
            return None
        if len(sizes) == 1:
            return at(sizes[0])
        # the two measured sizes around p, or the two nearest when p is past either end
        k = min(max(bisect.bisect_left(sizes, p), 1), len(sizes) - 1)
        lo, hi = sizes[k - 1], sizes[k]
        t_lo, t_hi = at(lo), at(hi)
        return max(0.0, t_lo + (t_hi - t_lo) * (p - lo) / (hi - lo))

    @functools.cached_property
    def _fitted_sizes(self) -> dict:
        """(kind, link) -> the measured group sizes, ascending."""
        sizes: dict = {}
        for k, p, link in self._fitted_index:
            sizes.setdefault((k, link), []).append(p)
        return {key: sorted(ps) for key, ps in sizes.items()}

    @functools.cached_property
    def _fitted_index(self) -> dict:
        """(kind, p, link) -> [(up_to_nbytes, per_call, per_byte), ...] by size."""
        index: dict = {}
        for k, p, link, up_to, a, b in self.fitted:
            index.setdefault((k, p, link), []).append((up_to, a, b))
        return {key: sorted(rows) for key, rows in index.items()}

    def collective_time(self, kind: str, group, nbytes: int, mesh=None) -> float:
        p = group.size
        if p <= 1:
            if kind not in KINDS:
                raise ValueError(f"unknown collective kind {kind!r} (known: {', '.join(KINDS)})")
            return 0.0
        return self.time_of(kind, p, self.link(group, mesh), nbytes)

    def time_of(self, kind: str, p: int, link: str, nbytes: float) -> float:
        """Seconds of one ``kind`` collective over ``p`` ranks on ``link`` ("intra" | "inter")."""
        if p <= 1:
            return 0.0
        if self.fitted:
            measured = self._fitted_time(kind, p, link, nbytes)
            if measured is not None:
                return measured
        alpha, bw = (
            (self.alpha_intra, self.bw_intra) if link == "intra" else (self.alpha_inter, self.bw_inter)
        )
        if kind == "reduce_scatter" and self.reduce_scatter_as_all_reduce:
            kind = "all_reduce"
        steps, moved = steps_and_bytes(kind, p, nbytes, self.algorithm)
        return self.launch + steps * alpha + moved / bw

    def group_creation_time(self, group, mesh=None) -> float:
        return self.create_group / max(1, self.expected_reuse)

    def plan_time(self, plan) -> float:
        return sum(self.collective_time(c.kind, c.group, c.bytes_in, plan.mesh) for c in plan.collectives())


# -- which profile a plan uses ----------------------------------------------------------

# Names a cost profile for every plan optimized without ``cost=``: a JSON file
# written by ``redist-opt calibrate`` (or ``CostModel.save``), or a built-in name.
PROFILE_ENV = "REDIST_OPT_COST_PROFILE"
BUILTIN_PROFILES = ("nccl", "gloo", "gloo-ring")


def backend_profile(backend: str | None) -> str:
    """The built-in profile for a process-group backend: ``gloo`` for gloo, else ``nccl``.

    ``backend`` is what ``MeshSpec.backend`` records (``torch.distributed.get_backend``
    of the mesh's groups for the mesh's device type): nccl, the ``fake`` test
    backend and anything unknown get the default (NCCL-like) profile.
    """
    return "gloo" if backend == "gloo" else "nccl"


@functools.lru_cache(maxsize=16)
def _load_cached(path: str, mtime_ns: int, size: int) -> CostModel:
    return CostModel.load(path)


def load_profile(value: str | os.PathLike) -> CostModel:
    """A built-in profile by name, else the profile file at ``value`` (read once per
    version of the file). Raises ``OSError`` (unreadable) or ``ValueError`` (not a profile)."""
    if isinstance(value, str) and value in BUILTIN_PROFILES and not os.path.exists(value):
        return _builtin(value)
    st = os.stat(value)
    return _load_cached(os.path.abspath(value), st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=len(BUILTIN_PROFILES))
def _builtin(name: str) -> CostModel:
    return CostModel.profile(name)


# Built-in profile name -> the passes it leaves out (its ``slower_in_steps``). Which passes
# made measured steps slower is a decision about passes, and the IR does not know them:
# redist_opt.pipeline, which runs them, declares it when it is imported (``import
# redist_opt`` imports the pipeline before anything can build a profile).
_SLOWER_IN_STEPS: dict[str, tuple] = {}


def declare_slower_in_steps(name: str, passes) -> None:
    """Declare the passes the built-in profile ``name`` leaves out (``slower_in_steps``)."""
    if name not in BUILTIN_PROFILES:
        raise ValueError(f"unknown cost profile {name!r} (known: {', '.join(BUILTIN_PROFILES)})")
    _SLOWER_IN_STEPS[name] = _pass_names(passes)
    _builtin.cache_clear()


def _declared_slower_in_steps(name: str) -> tuple:
    """The declared ``slower_in_steps`` of the built-in profile ``name``; raises rather
    than build the profile without its decision."""
    try:
        return _SLOWER_IN_STEPS[name]
    except KeyError:
        raise RuntimeError(
            f"the built-in {name!r} profile's slower_in_steps was not declared: "
            "redist_opt.pipeline declares it when imported (import redist_opt)"
        ) from None


def resolve(mesh=None) -> tuple[CostModel, str]:
    """(model, where it came from) for a plan on ``mesh`` when the caller gave no ``cost=``.

    1. ``$REDIST_OPT_COST_PROFILE``: a profile file (or ``nccl`` / ``gloo``); a file
       that cannot be read or parsed raises ``ValueError`` naming the variable;
    2. else the profile of the mesh's backend (``MeshSpec.backend``): gloo -> ``gloo``;
    3. else the default (``nccl``).

    Every rank reads the same environment and backend, so every rank gets the same model.
    """
    value = os.environ.get(PROFILE_ENV, "").strip()
    if value:
        try:
            model = load_profile(value)
        except OSError as e:
            raise ValueError(
                f"{PROFILE_ENV}={value!r}: cannot read the cost profile: {e.strerror or e} "
                "(give a JSON file written by `redist-opt calibrate`, "
                f"or one of {', '.join(BUILTIN_PROFILES)})"
            ) from None
        except ValueError as e:
            raise ValueError(f"{PROFILE_ENV}={value!r}: {e}") from None
        return model, f"{PROFILE_ENV}={value}"
    backend = getattr(mesh, "backend", None)
    if backend is not None:
        return CostModel.profile(backend_profile(backend)), f"mesh backend {backend}"
    return CostModel.default(), "default: no backend known"


def clear_cache() -> None:
    """Forget the cost profiles read from files (``redist_opt.clear_caches``)."""
    _load_cached.cache_clear()
