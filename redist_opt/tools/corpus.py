"""The quality bench's corpus: real parallelism layouts (``corpus.json`` beside this
module, shipped as package data so the bench runs from an installed wheel).

A case names a mesh (with the flattened groups a job creates), source and target
placements, a global shape and dtype, the category of layout and where it comes
from. :func:`load_corpus` reads and validates the file.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
from collections import Counter
from importlib import resources

import torch

from redist_opt.ir.mesh import MeshSpec
from redist_opt.ir.placements import RedistributeError, normalize_placements, parse_placements
from redist_opt.tools.args import mesh_spec, parse_dtype

__all__ = ["CATEGORIES", "CorpusCase", "DEFAULT_CORPUS", "load_corpus"]

# The shipped corpus (a Traversable: read it with ``read_text()``, it may not be a file).
DEFAULT_CORPUS = resources.files(__package__).joinpath("corpus.json")

CATEGORIES = ("fsdp", "hsdp", "tp", "cp", "4d", "ep", "grad_norm", "loss", "jagged", "uneven")


@dataclasses.dataclass(frozen=True)
class CorpusCase:
    id: str
    category: str
    source: str
    why: str
    mesh: str
    flatten: tuple[str, ...]
    src: str
    dst: str
    shape: tuple[int, ...]
    dtype: str

    # Each raises a ValueError for a bad value (:func:`load_corpus` names the case).

    def spec(self) -> MeshSpec:
        """The rank-free MeshSpec, built as ``redist-opt explain`` builds it."""
        return mesh_spec(self.mesh, list(self.flatten))

    def torch_dtype(self) -> torch.dtype:
        return parse_dtype(self.dtype)

    def placements(self):
        """(src, dst) as normalized torch placements."""
        spec, out = self.spec(), []
        for text, role in ((self.src, "source"), (self.dst, "target")):
            ps = parse_placements(text)
            if len(ps) != spec.ndim:
                raise RedistributeError(
                    f"{role} placements {text!r} have {len(ps)} entries for a {spec.ndim}-D mesh"
                )
            # One mesh dim at a time: mixed reduce ops (P(avg) beside P) are valid
            # torch placements even where redist_opt refuses them.
            out.append(
                tuple(
                    normalize_placements([p], mesh_shape=(n,), tensor_ndim=len(self.shape), role=role)[0]
                    for p, n in zip(ps, spec.sizes)
                )
            )
        return tuple(out)


_FIELDS = tuple(f.name for f in dataclasses.fields(CorpusCase))


def _case_from_dict(raw: dict, where: str) -> CorpusCase:
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: a case must be a JSON object")
    where = f"{where} ({raw.get('id', '?')})"
    missing, unknown = sorted(set(_FIELDS) - set(raw)), sorted(set(raw) - set(_FIELDS))
    if missing or unknown:
        raise ValueError(f"{where}: missing field(s) {missing}, unknown field(s) {unknown}")
    for f in ("id", "category", "source", "why", "mesh", "src", "dst", "dtype"):
        if not isinstance(raw[f], str) or not raw[f].strip():
            raise ValueError(f"{where}: field {f!r} must be a non-empty string")
    if raw["category"] not in CATEGORIES:
        raise ValueError(f"{where}: category {raw['category']!r} is not one of {CATEGORIES}")
    if not isinstance(raw["flatten"], list) or not all(
        isinstance(g, str) and "+" in g for g in raw["flatten"]
    ):
        raise ValueError(f"{where}: flatten must be a list of dims joined by '+', e.g. [\"dp+cp\"]")
    shape = raw["shape"]
    if not isinstance(shape, list) or not all(
        isinstance(s, int) and not isinstance(s, bool) and s > 0 for s in shape
    ):
        raise ValueError(f"{where}: shape must be a list of positive integers")
    case = CorpusCase(**raw | dict(flatten=tuple(raw["flatten"]), shape=tuple(shape)))
    try:  # the mesh, flattened groups, placements (for this mesh and tensor rank) and dtype parse
        spec, _, _ = case.spec(), case.placements(), case.torch_dtype()
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None
    if any(len(spec.dims_of(g)) < 2 for g in case.flatten):
        raise ValueError(f"{where}: a flattened group of {list(case.flatten)} names fewer than 2 dims")
    return case


def load_corpus(path: str | os.PathLike | None = None) -> list[CorpusCase]:
    """Read and validate a corpus file (default: the shipped :data:`DEFAULT_CORPUS`)."""
    source = DEFAULT_CORPUS if path is None else pathlib.Path(path)
    name = source.name if path is None else os.fspath(path)
    try:
        data = json.loads(source.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"corpus {name!r} is not valid JSON: {e}") from None
    raw_cases = data.get("cases") if isinstance(data, dict) else None
    if not isinstance(raw_cases, list):
        raise ValueError(f"corpus {name!r}: expected an object with a 'cases' list")
    cases = [
        _case_from_dict(raw, f"corpus {os.path.basename(name)} case {i}") for i, raw in enumerate(raw_cases)
    ]
    dup = sorted(i for i, n in Counter(c.id for c in cases).items() if n > 1)
    if dup:
        raise ValueError(f"corpus {name!r}: duplicate case id(s) {dup}")
    return cases
