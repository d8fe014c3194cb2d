"""A fuzz harness NAME.cpp as a binary: libFuzzer's main under --config=fuzz, else the corpus driver."""

def loom_fuzzer(name, deps = []):
    native.cc_binary(
        name = name,
        testonly = True,
        srcs = [name + ".cpp"],
        linkopts = select({
            "//fuzz:libfuzzer": ["-fsanitize=fuzzer"],
            "//conditions:default": [],
        }),
        deps = ["//fuzz:fuzz_support"] + deps + select({
            "//fuzz:libfuzzer": [],
            "//conditions:default": ["//fuzz:corpus_driver"],
        }),
    )
