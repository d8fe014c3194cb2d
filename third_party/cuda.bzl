"""nvcc through a genrule: CUDA sources compiled to objects for sm_80 and sm_90 plus PTX for
later GPUs, wrapped in a cc_library (Bazel 4 has no CUDA rules; see BUILD-NOTES.md)."""

load("@cuda//:defs.bzl", "CUDA_AVAILABLE", "CUDA_PATH")

GENCODE = " ".join([
    "-gencode arch=compute_80,code=sm_80",
    "-gencode arch=compute_90,code=sm_90",
    "-gencode arch=compute_90,code=compute_90",
])

def cuda_library(name, srcs, hdrs = [], deps = [], textual_hdrs = [], **kwargs):
    """Nothing in a build without the CUDA toolkit (cuda_configure.bzl)."""
    if not CUDA_AVAILABLE:
        return
    objs = []
    for src in srcs:
        obj = name + "_" + src.replace("/", "_").replace(".cu", ".o")
        native.genrule(
            name = obj + "_nvcc",
            srcs = [src] + hdrs + textual_hdrs,
            outs = [obj],
            cmd = CUDA_PATH + "/bin/nvcc -c -O3 -std=c++17 -Xcompiler -fPIC " + GENCODE +
                  " -I. -I" + CUDA_PATH + "/include $(location " + src + ") -o $@",
        )
        objs.append(obj)
    native.cc_library(
        name = name,
        srcs = objs,
        hdrs = hdrs,
        deps = deps + ["@cuda//:cudart"],
        **kwargs
    )
