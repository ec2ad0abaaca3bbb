"""decode_request's time a request (one row of 4 FP32), medians of `repeat` runs of `number` calls: a model of fixed
dims, one of a -1 dim whose range is held (Servable.dim_ranges, where the checkout has it), and, where a range holds
a step (export-warmup-2026-12-06), one of a -1 dim held to an even size (2 × Dim). Run alternately against two
checkouts (PYTHONPATH to a folder whose `wok` links to each one's server/) for before and after."""

import inspect
import statistics
import sys
import timeit

import numpy as np
import torch

from wok.codec import decode_request, encode_request, size_range
from wok.config import model_config_from_dict
from wok.servable import Servable


def config(dims: list[int]):
    tensor = {"datatype": "FP32", "dims": dims}
    return model_config_from_dict(
        {
            "name": "m",
            "platform": "python",
            "factory": "x:y",
            "inputs": [{"name": "X", **tensor}],
            "outputs": [{"name": "Y", **tensor}],
            "max_batch_size": 8,
        },
        "decode.py",
    )


def held(*ranges: tuple) -> Servable:
    return Servable(config([-1]), torch.nn.Identity(), dim_ranges={"X": ranges})


def main(number: int, repeat: int) -> None:
    request = encode_request("m", {"X": np.ones((1, 4), np.float32)})
    models = [("fixed [4]", Servable(config([4]), torch.nn.Identity()))]
    if "step" in inspect.signature(size_range).parameters:  # a range is (index, least, most, step)
        models += [("variable [-1], range held", held((1, 2, None, 1)))]
        models += [("variable [-1], even range held", held((1, 2, None, 2)))]
    else:
        try:
            models.append(("variable [-1], range held", held((1, 2, None))))
        except TypeError:  # a checkout before dim_ranges
            models.append(("variable [-1]", Servable(config([-1]), torch.nn.Identity())))
    for label, servable in models:
        runs = timeit.repeat(lambda s=servable: decode_request(request, s), number=number, repeat=repeat)
        times = [t / number * 1e9 for t in runs]
        print(f"{label}: median {statistics.median(times):.0f} ns, min {min(times):.0f} ns")


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
