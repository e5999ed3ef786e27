"""The machinery of the custom-op flow, for any op declared in custom_ops.bzl (the examples, at the top level and in
ops/<name>/, are data to it):

    declarations   custom_ops.bzl for Python: the ops, how PyTorch learns each, its kernels, reference and example
    registration   makes declared ops known to PyTorch (their modules, the C++ AOT library, vmap rules, torch_compat)
    export         torch.export -> .pte (+ .pt2 beside it)             python -m flow.export --op NAME
    program        the one .pte reader: operators, inputs and outputs, planned memory, and the untrusted-program checks
    runtime        the ExecuTorch Python runtime: the kernel library, checked loading
    runtime_kernels  the kernels a program's runtime will have (ExecuTorch's and the declared ops'), so export and
                   selective build refuse a program dead on arrival      python -m flow.runtime_kernels
    runner         driving the C++ runner: raw tensor files in and out
    reference      the exported model in eager PyTorch with each custom op replaced by its declared ATen reference
    compare        what "bit for bit" means here (and the tolerance otherwise)
    verify         the verifier: runner and Python runtime against the reference    python -m flow.verify --pte X.pte
    profile        ETDump + ETRecord + Inspector, every op of every execution checked   python -m flow.profile
    model          the ops in a real model (examples/decoder.py): XNNPACK export, greedy decoding vs eager
                   python -m flow.model
    dtypes         the dtype table: ExecuTorch's scalar types and the elementwise kernels' dtypes
    torch_compat, vmap_rules   the ops' PyTorch side that the my_ops wheel carries too (they import only torch)

Importing this package imports nothing heavy; each module imports torch or executorch itself. It does quiet what
packages the flow does not use print when executorch imports them (below).
"""

import logging
import os
import warnings

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class _DropMessages(logging.Filter):
    def __init__(self, *fragments: str):
        super().__init__()
        self.fragments = fragments

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(fragment in message for fragment in self.fragments)


# executorch imports torchao, which tries to load its CUDA- and SM90-only extensions (_C_mxfp8, _C_cutlass_90a) and
# registers an Enum as a pytree constant, which torch 2.13 calls deprecated; torch's pytree pickling warns about
# LeafSpec. None of it concerns this project's ops, and on every step it buried the flow's own lines. Only those
# messages are dropped: the loggers and warnings stay on for anything else.
logging.getLogger("torchao").addFilter(_DropMessages("Failed to load"))
logging.getLogger("torch.utils._pytree").addFilter(_DropMessages("is an Enum subclass and is now natively supported"))
warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated", category=FutureWarning)
