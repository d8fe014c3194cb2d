# lit configuration for Loom's IR, pass and tool tests. Run through `bazel test //tests/lit:lit`
# (run_lit.sh passes the tool and example directories as lit parameters).
import os

import lit.formats

config.name = "loom"
config.test_format = lit.formats.ShTest(execute_external=True)
config.suffixes = [".mlir", ".test"]
config.excludes = ["lit.cfg.py", "Inputs"]
config.test_source_root = os.path.dirname(os.path.abspath(__file__))
config.test_exec_root = os.environ.get("TEST_TMPDIR", "/tmp/loom-lit")

params = lit_config.params
tool_dirs = [params["loom_bin"], "/usr/lib/llvm-19/bin"]
config.environment["PATH"] = os.pathsep.join(tool_dirs + [config.environment.get("PATH", os.environ["PATH"])])
config.substitutions.append(("%examples", params["examples"]))
config.substitutions.append(("%bpe", "--vocab {0}/encoder.json --merges {0}/vocab.bpe".format(params["bpe"])))
