"""The CUDA toolkit as an optional repository: @cuda holds the toolkit's targets (cuda.BUILD)
when /usr/local/cuda/bin/nvcc exists (or $CUDA_PATH/bin/nvcc), and none otherwise; its
defs.bzl says which (CUDA_AVAILABLE), so that the CUDA backend, its tests and the GPU tools
are defined only where they can be built, and loom-rank is built with or without them."""

def _cuda_configure_impl(ctx):
    path = ctx.os.environ.get("CUDA_PATH", "/usr/local/cuda")
    available = ctx.path(path + "/bin/nvcc").exists
    if available:
        for entry in ["include", "lib64", "bin"]:
            ctx.symlink(path + "/" + entry, entry)
        ctx.template("BUILD", ctx.attr.build_file, {"@CUDA_PATH@": path}, executable = False)
    else:
        ctx.file("BUILD", "# No CUDA toolkit at %s when Bazel configured this repository: no targets.\n" % path)
    ctx.file("defs.bzl", "CUDA_AVAILABLE = %s\nCUDA_PATH = %r\n" % (available, path))

cuda_configure = repository_rule(
    implementation = _cuda_configure_impl,
    attrs = {"build_file": attr.label(allow_single_file = True)},
    environ = ["CUDA_PATH"],
    local = True,
)
