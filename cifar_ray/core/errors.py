"""The one base of every error a user can fix: bad input or an unusable environment, told in one line.

The CLI catches UserError, prints `cifar-ray: error: MESSAGE` (no traceback) and exits 2; anything else is a bug
and keeps its traceback. This module imports nothing, so every module (config.py included) may import it.
"""


class UserError(Exception):
    """A mistake the user can fix, told in one line that names what is wrong and what is allowed."""


class ClusterError(UserError):
    """The Ray cluster cannot be used: its address does not answer, Ray refuses the connection, or its nodes
    cannot run cifar_ray's code."""


class StorageError(UserError):
    """The run storage (--storage) cannot be used: a URI no filesystem opens, a folder or bucket that not
    every node of the cluster reaches, or a run file that cannot be read or parsed (after storage.TRIES)."""


class RunFolderError(UserError, FileNotFoundError):
    """A folder or URI given as RUN_DIR holds no run (no sweep.json)."""


class RunInUseError(UserError):
    """A live driver holds the run folder's lease (core/lease.py): a second driver would train the same trials."""


class UsageError(UserError):
    """A one-line usage error of the command line, printed as `PROG: error: MESSAGE`; `prog` names the
    (sub)command, None the command itself."""

    def __init__(self, message: str, prog: str | None = None) -> None:
        super().__init__(message)
        self.prog = prog


class ConfigError(UserError, ValueError):
    """A user-facing configuration error: its message is one line, fit to print as is."""


class YamlValueError(ConfigError):
    """YAML that strict_yaml.StrictLoader refuses: the message names the value or key; `line` (from 1) says where."""

    def __init__(self, message: str, line: int) -> None:
        super().__init__(message)
        self.line = line


class DataError(UserError, RuntimeError):
    """Data cannot be found or read: the message says where it was looked for and what to do."""


class ViewerError(UserError):
    """The export cannot run: a viewer's package is missing, or --out does not fit the viewer."""


# How the CUDA libraries say they ran out of GPU memory outside torch's caching allocator (which raises
# torch.OutOfMemoryError), in their own words (torch's ATen/cuda/Exceptions.h, NCCL's CUDACHECK): "CUDA error: out
# of memory", "CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`", "cuDNN error:
# CUDNN_STATUS_ALLOC_FAILED" (cuDNN 8) or "..._INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED" (cuDNN 9), and NCCL's
# "ncclUnhandledCudaError ... Last error: Cuda failure 2 'out of memory'" or "Failed to CUDA calloc 608 bytes".
# Read by training/memory.py (one final error type) and cluster/session.py (the oom status).
GPU_OOM_MARKS = (
    "out of memory",
    "_ALLOC_FAILED",
    "_ALLOCATION_FAILED",
    "Failed to CUDA calloc",
    "Failed to CUDA malloc",
)
