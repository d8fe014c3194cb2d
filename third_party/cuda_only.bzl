"""Targets that exist only where the CUDA toolkit does (see cuda_configure.bzl)."""

load("@cuda//:defs.bzl", "CUDA_AVAILABLE")

def if_cuda(with_cuda, without_cuda = []):
    """`with_cuda` in a build with the CUDA toolkit, else `without_cuda`."""
    return with_cuda if CUDA_AVAILABLE else without_cuda

def cuda_only(rule, **kwargs):
    """Defines the target with `rule` only in a build with the CUDA toolkit."""
    if CUDA_AVAILABLE:
        rule(**kwargs)
