"""Counting recomputed activations: with activation checkpointing, a backward runs every checkpointed block's forward
again. ``RecomputeCounter`` counts a module class's forwards that run inside an accelerator's backward (at a module
within the block, such as its MLP: hooks on the checkpointed module itself stay outside the checkpoint)."""


class RecomputeCounter:
    def __init__(self, monkeypatch, module_class):
        self.counts = {"backwards": 0, "recomputed": 0}
        self._monkeypatch, self._in_backward = monkeypatch, False
        forward = module_class.forward

        def counting_forward(module, *args, **kwargs):
            self.counts["recomputed"] += self._in_backward
            return forward(module, *args, **kwargs)

        monkeypatch.setattr(module_class, "forward", counting_forward)

    def watch(self, accelerator) -> None:
        """Count ``accelerator``'s backwards, and the forwards that run inside them."""
        backward = accelerator.backward

        def counting_backward(loss, **kwargs):
            self.counts["backwards"] += 1
            self._in_backward = True
            try:
                return backward(loss, **kwargs)
            finally:
                self._in_backward = False

        self._monkeypatch.setattr(accelerator, "backward", counting_backward)
