"""The warm pool, as the daemon reports it in /metrics (it has no JSON endpoint of its own)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Dict, List

_SAMPLE = re.compile(r'^(crucible_pool_[a-z_]+)(?:\{shape="((?:[^"\\]|\\.)*)"\})? ([0-9.eE+-]+)$')


@dataclass
class PoolShape:
    #: The shape, as the daemon names it: `default,memory=512,vcpus=1,backend=namespace`.
    shape: str
    ready: int = 0
    size: int = 0


@dataclass
class PoolStatus:
    """Empty shapes and zero counters when the daemon keeps no pool."""

    shapes: List[PoolShape] = field(default_factory=list)
    #: Creates served from a pool.
    hits: int = 0
    #: Creates of a pooled shape that found none ready.
    misses: int = 0
    #: Creates no pool could serve.
    unpooled: int = 0
    #: Ready sandboxes that died while waiting.
    died: int = 0

    @property
    def hit_rate(self) -> float:
        total = self.hits + self.misses
        return self.hits / total if total else 0.0


def parse_pool(metrics: str) -> PoolStatus:
    status = PoolStatus()
    shapes: Dict[str, PoolShape] = {}
    for line in metrics.splitlines():
        m = _SAMPLE.match(line.strip())
        if not m:
            continue
        name, shape, value = m.group(1), m.group(2), int(float(m.group(3)))
        if shape is not None and name in ("crucible_pool_ready", "crucible_pool_size"):
            entry = shapes.setdefault(shape, PoolShape(shape))
            if name == "crucible_pool_ready":
                entry.ready = value
            else:
                entry.size = value
        elif name == "crucible_pool_hits_total":
            status.hits = value
        elif name == "crucible_pool_misses_total":
            status.misses = value
        elif name == "crucible_pool_unpooled_total":
            status.unpooled = value
        elif name == "crucible_pool_died_total":
            status.died = value
    status.shapes = [shapes[k] for k in sorted(shapes)]
    return status
