"""PyTriton reference server: MLP 256->1024->1024->256 (fp32, ReLU), dynamic batching.
Usage: python pytriton_server.py [GRPC_PORT] [HTTP_PORT] [METRICS_PORT]"""

import signal
import sys

import numpy as np
import torch
from pytriton.decorators import batch
from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig

grpc_port, http_port, metrics_port = (int(a) for a in (sys.argv[1:] + ["8001", "8000", "8002"][len(sys.argv) - 1 :]))
torch.manual_seed(0)
torch.set_num_threads(1)
mlp = torch.nn.Sequential(
    torch.nn.Linear(256, 1024),
    torch.nn.ReLU(),
    torch.nn.Linear(1024, 1024),
    torch.nn.ReLU(),
    torch.nn.Linear(1024, 256),
).eval()


@batch
def infer(INPUT0):
    with torch.inference_mode():
        return {"OUTPUT0": mlp(torch.from_numpy(INPUT0)).numpy()}


# SIGTERM/SIGINT -> SystemExit, so `with Triton` stops tritonserver + stub and deletes its workspace.
# (SIGINT must be re-armed: a shell's `cmd &` starts Python with SIGINT ignored.)
for sig in (signal.SIGTERM, signal.SIGINT):
    signal.signal(sig, lambda *_: sys.exit(0))
with Triton(config=TritonConfig(grpc_port=grpc_port, http_port=http_port, metrics_port=metrics_port)) as triton:
    triton.bind(
        model_name="mlp",
        infer_func=infer,
        inputs=[Tensor(name="INPUT0", dtype=np.float32, shape=(256,))],
        outputs=[Tensor(name="OUTPUT0", dtype=np.float32, shape=(256,))],
        config=ModelConfig(max_batch_size=32, batcher=DynamicBatcher(max_queue_delay_microseconds=5000)),
    )
    print("PYTRITON_READY", flush=True)
    triton.serve()
