# ruff: noqa
"""Written for eagle3-tui's tests in the shape of SGLang 0.4.x: one dataclass, flags via add_argument."""
import argparse
import dataclasses
from typing import List, Optional

LOAD_FORMATS = ["auto", "pt", "safetensors"]


@dataclasses.dataclass
class ServerArgs:
    model_path: str
    tp_size: int = 1
    host: str = "127.0.0.1"
    port: int = 30000
    attention_backend: Optional[str] = None
    cuda_graph_max_bs: Optional[int] = None
    cuda_graph_bs: Optional[List[int]] = None

    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser):
        parser.add_argument("--model-path", "--model", type=str, required=True)
        parser.add_argument("--tensor-parallel-size", "--tp-size", type=int, dest="tp_size")
        parser.add_argument("--host", type=str, default=ServerArgs.host)
        parser.add_argument("--port", type=int, default=ServerArgs.port)
        parser.add_argument("--load-format", type=str, choices=LOAD_FORMATS)
        parser.add_argument(
            "--attention-backend",
            type=str,
            choices=["flashinfer", "triton", "torch_native"],
        )
        parser.add_argument("--mem-fraction-static", type=float)
        parser.add_argument("--chunked-prefill-size", type=int)
        parser.add_argument("--disable-radix-cache", action="store_true")
        parser.add_argument("--disable-cuda-graph", action="store_true")
        parser.add_argument("--cuda-graph-max-bs", type=int)
        parser.add_argument("--cuda-graph-bs", type=int, nargs="+")
        parser.add_argument("--enable-torch-compile", action="store_true")
        parser.add_argument("--trust-remote-code", action="store_true")
