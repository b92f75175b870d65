"""Reads zerostep's exports with the reference safetensors package.

    safetensors_py_test.py DIR

DIR holds what engine/safetensors_py_test_writer.cc writes. Every value must
come back bit for bit: F32 through safe_open(framework="numpy"), BF16 (numpy
has no bfloat16) through safetensors.deserialize, the same Rust reader.
"""
import json
import sys

import numpy as np
import safetensors
from safetensors import safe_open


def main(folder):
    with open(f"{folder}/expected.json") as f:
        expected = json.load(f)
    names = [t["name"] for t in expected]

    with safe_open(f"{folder}/f32.safetensors", framework="numpy") as f:
        assert sorted(f.keys()) == sorted(names), (f.keys(), names)
        assert f.metadata() == {"format": "pt"}, f.metadata()
        for t in expected:
            got = f.get_tensor(t["name"])
            assert got.dtype == np.float32, (t["name"], got.dtype)
            assert list(got.shape) == t["shape"], (t["name"], got.shape)
            want = np.array(t["f32_bits"], dtype=np.uint32).reshape(t["shape"])
            assert np.array_equal(got.view(np.uint32), want), t["name"]

    with open(f"{folder}/bf16.safetensors", "rb") as f:
        loaded = dict(safetensors.deserialize(f.read()))
    assert sorted(loaded) == sorted(names), (sorted(loaded), names)
    for t in expected:
        got = loaded[t["name"]]
        assert got["dtype"] in ("BF16", "bfloat16"), (t["name"], got["dtype"])
        assert list(got["shape"]) == t["shape"], (t["name"], got["shape"])
        bits = np.frombuffer(bytes(got["data"]), dtype="<u2")
        assert np.array_equal(bits, np.array(t["bf16_bits"], np.uint16)), t["name"]

    count = sum(len(t["f32_bits"]) for t in expected)
    print(f"safetensors {safetensors.__version__}: {len(expected)} tensors, "
          f"{count} values bit for bit (F32 and BF16)")


if __name__ == "__main__":
    main(sys.argv[1])
