"""The parts of a lazily loaded model handle that the embedder and the reranker share: the repr,
``model_id``, ``device``, ``quantization`` and ``quality`` (each but the first loads the model)."""

from __future__ import annotations

from typing import Any

__all__ = ["LoadedModel"]


class LoadedModel:
    """A mixin for a class with ``load()``, ``config`` (``device``, ``quantize``) and the private
    fields ``_model``, ``_model_id``, ``_device``, ``_quantization``, ``_quality`` that ``load`` sets."""

    _kind = "Model"
    config: Any
    _model: Any
    _model_id: str
    _device: str | None
    _quantization: str | None
    _quality: Any

    def load(self) -> Any:  # pragma: no cover - provided by the class
        raise NotImplementedError

    def __repr__(self) -> str:
        state = "loaded" if self._model is not None else "not loaded"
        quantize = self._quantization if self._model is not None else self.config.quantize
        extra = f" quantize={quantize!r}" if quantize else ""
        return f"<{self._kind} {self._model_id!r} device={self._device or self.config.device!r}{extra} {state}>"

    @property
    def model_id(self) -> str:
        """The model's name (hub id or path) as configured; part of every cache key."""
        return self._model_id

    @property
    def device(self) -> str:
        """The resolved torch device (loads the model)."""
        self.load()
        assert self._device is not None
        return self._device

    @property
    def quantization(self) -> str | None:
        """``"int8"`` when the int8 forward pass serves, else None for full precision (also when
        ``quantize="auto"`` fell back). Loads the model."""
        self.load()
        return self._quantization

    @property
    def quality(self) -> Any:
        """The int8 quality guard's figures (None when no int8 model was asked for or built; kept
        also when ``quantize="auto"`` fell back because of them). Loads the model."""
        self.load()
        return self._quality
