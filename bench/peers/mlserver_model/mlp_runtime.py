"""MLServer custom runtime: MLP 256->1024->1024->256 (fp32, ReLU); same seed/weights as pytriton_server.py."""

import torch
from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.types import InferenceRequest, InferenceResponse


class MLPRuntime(MLModel):
    async def load(self) -> bool:
        torch.manual_seed(0)
        torch.set_num_threads(1)
        self.mlp = torch.nn.Sequential(
            torch.nn.Linear(256, 1024),
            torch.nn.ReLU(),
            torch.nn.Linear(1024, 1024),
            torch.nn.ReLU(),
            torch.nn.Linear(1024, 256),
        ).eval()
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        x = NumpyCodec.decode_input(payload.inputs[0])  # adaptive batching has already concatenated requests on dim 0
        with torch.inference_mode():
            y = self.mlp(torch.from_numpy(x)).numpy()
        return InferenceResponse(
            model_name=self.name, model_version=self.version, outputs=[NumpyCodec.encode_output("OUTPUT0", y)]
        )
