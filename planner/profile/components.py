"""Kinds of profile component that the fit, the file checks and the drift measures treat apart."""

# Components timed as a difference of two passes (pieces.time_lora: what LoRA adapters add to a forward pass;
# pieces.time_mixed_decode: what decode rows add to a pass over a prompt chunk): a small part of a step, as
# noisy as the passes, so a point's median and its repetitions may be negative.
DIFFERENCE_COMPONENTS = ("lora", "mixed_decode")
