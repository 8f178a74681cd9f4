"""ampcert's AMP engine for PyTorch, beside ``amp.jax``: autocast (its two engines, the
region state, the op families, the kernels at the dispatcher's Autocast keys, the tracing
clones and the marks torch.compile needs), the loss scaler (its front, the sync-free
step, the ranks, the trajectory), FP8 Linear layers, and which torch release can do what.

Importing this package imports nothing; :mod:`ampcert.amp.torch.support` is readable
without torch, every other module imports it. The public names are ``ampcert.amp``'s
(``autocast``, ``DynamicLossScaler``).
"""
