"""The bottom layer: facts about a model's RoPE, the RoPE mathematics, and declarative config validation.

Nothing here imports a model file, a method, an attention function or anything above; everything else may
import from here.
"""
