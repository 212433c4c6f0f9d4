"""Kinds of profile component that the fit, the file checks and the drift measures treat apart."""

# Components timed as a difference of two passes (pieces.time_lora: what LoRA adapters add to a forward pass):
# a few percent of a step, as noisy as the passes, so a point's median and its repetitions may be negative.
DIFFERENCE_COMPONENTS = ("lora",)
