"""The embedder of gpuprompt: :class:`Embedder` (sentence-transformers behind the one MicroBatcher,
with a device-resident cache), its :class:`EmbedderConfig`, and the int8 CPU backend's quality guard.

Importing this package loads no torch; the model loads on first use.
"""

from __future__ import annotations

from gpuprompt.embed._cache import EmbeddingCache
from gpuprompt.embed._config import QUANTIZE_CHOICES, EmbedderConfig, EmbedderStats, validate_texts
from gpuprompt.embed._embedder import Embedder
from gpuprompt.embed._guard import QualityReport, QualityThresholds

__all__ = [
    "QUANTIZE_CHOICES",
    "Embedder",
    "EmbedderConfig",
    "EmbedderStats",
    "EmbeddingCache",
    "QualityReport",
    "QualityThresholds",
    "validate_texts",
]
