"""The op machinery, for any op declared in custom_ops.bzl: declare, register, bind, select, build, export, run,
verify. The ops (custom_ops_*.py and ops/<name>/) are data to it; it names no op and no model. Above it, models/ puts
models on the ops and benchmark/ times both; nothing here imports either.

    declarations     custom_ops.bzl for Python: the ops, how PyTorch learns each, kernels, reference, example
    op_kinds         an op's kind (traits from its declaration and schema); the representatives of every kind
                                                                              python -m flow.op_kinds
    registration     makes declared ops known to PyTorch (their modules, the C++ AOT library, vmap rules, torch_compat)
    torch_compat, vmap_rules   the ops' PyTorch side that the my_ops wheel carries too (they import only torch)
    schema_types     each schema type's C++ type in both kernel modes
    argument_kinds   the kinds of value each operator's kernel unboxes: the table the pre-flights check calls against
    compiler_flags   the flags every kernel build passes (no floating-point contraction)
    dtypes           ExecuTorch's scalar types and the elementwise kernels' dtypes
    cpu              the vector code the kernels run on this CPU (the ISA rule, under CUSTOM_OPS_ISA's cap)
    runtime_kernels  the kernels a program's runtime will have, so export and selective build refuse a program dead on
                     arrival                                                  python -m flow.runtime_kernels
    export           torch.export -> .pte (+ .pt2 beside it)                  python -m flow.export --op NAME
    program          the one .pte reader: operators, inputs and outputs, planned memory, the untrusted-program checks
    xnnpack_layout, xnnpack_payload   XNNPACK's payload bytes described once, and checked before the backend reads them
    data_file        a named data file (.ptd, a program's weights outside it) checked before the runtime reads it
    lazy_exir        reading and running a program without importing the exporter
    runtime          the ExecuTorch Python runtime: the kernel library, checked loading (with program, data_file,
                     xnnpack_*, lazy_exir, dtypes, argument_kinds and runtime_kernels, which import each other
                     relatively, the my_ops wheel carries a copy: declarations.WHEEL_SHARED_MODULES)
    runner           driving the C++ runner: raw tensor files in and out
    reference        the exported model in eager PyTorch with each custom op replaced by its declared ATen reference
    compare          what "bit for bit" means here (and the tolerance otherwise)
    verify           the verifier: runner and Python runtime against the reference   python -m flow.verify --pte X.pte
    profile          ETDump + ETRecord + Inspector, every op of every execution checked   python -m flow.profile
    aoti             the same ops through AOTInductor, run from C++ beside ExecuTorch   python -m flow.aoti
    artifact_cache   slow artifacts (AOTInductor packages, programs) kept by a hash of what they are made from
    file_cache       files made once per key, whole or absent for a reader (artifact_cache's and my_ops.hf's)
    modes            test_custom_ops.sh's op modes (cmake, buck2, aarch64, profile NAME, wheel, doctor), each a
                     function over the modules above                         python -m flow.modes MODE
    forked_steps     a mode's Python steps forked from its process once it imported torch and the exporter

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
