"""One process of tests/graph/test_graph_pass_cache_key.py's group-order case: an
8-rank fake world, a 2x2x2 mesh whose flattened meshes are created in the order given
on the command line ("a+b" "b+c"), and the graph pass's cache key on it, as JSON."""

from __future__ import annotations

import json
import sys

import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from redist_opt.graph.cache_key import graph_pass_key
from redist_opt.ir.options import PlanOptions


def main(order: list[str]) -> None:
    dist.init_process_group("fake", rank=0, world_size=8)
    mesh = init_device_mesh("cpu", (2, 2, 2), mesh_dim_names=("a", "b", "c"))
    names = {}
    for dims in order:
        flat = mesh[tuple(dims.split("+"))]._flatten(dims.replace("+", "_"))
        names[dims] = flat.get_group(0).group_name
    print(json.dumps({"key": graph_pass_key(PlanOptions(), [mesh]), "names": names}))


if __name__ == "__main__":
    main(sys.argv[1:])
