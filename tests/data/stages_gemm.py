"""plain_gemm.py with num_stages as a parameter: a WS schedule sets every pipeline's
depth, so candidates differing only in num_stages compile to one kernel."""

from plain_gemm import PROBLEM, flops, inputs, kernel, reference  # noqa: F401 - the contract, from the file beside this one

PARAMS = {"block_M": [128], "block_N": [128, 256], "block_K": [64], "num_stages": [2, 3]}
