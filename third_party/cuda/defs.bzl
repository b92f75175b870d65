"""Marks targets that exist only in the CUDA configuration (--config=cuda).

Such a target is incompatible elsewhere: a wildcard build (`//...`) leaves
it out and `bazel test` lists it as SKIPPED by name, instead of it being
tagged manual and never seen.
"""

def cuda_only():
    return select({
        "//third_party/cuda:enabled": [],
        "//conditions:default": ["//third_party/cuda:incompatible"],
    })
