"""Declares torchvision's two operators that its Python package registers fake kernels for unconditionally, so that
`import torchvision` works in .venv-sglang, where torchvision's compiled ops cannot load.

The package index's torchvision (0.28.0 for torch 2.13) is a CUDA build: its _C.so needs libtorch_cuda.so, which
the CPU torch in .venv-sglang lacks. torchvision then runs without its ops (extension._has_ops() is False, and every
other registration is guarded by it), except torchvision/_meta_registrations.py's
``@torch.library.register_fake("torchvision::nms")`` and ``("torchvision::qnms")``, which raise "operator
torchvision::nms does not exist". SGLang 0.5.23 imports torchvision.transforms at start-up through its multimodal
configs (srt/configs/nano_nemotron_vl.py -> srt/multimodal/internvl_utils.py), text-only models included.

Only the schemas are declared (copied from the strings of torchvision 0.28.0's _C.so), no kernel: a call to
torchvision.ops.nms still fails loudly ("Could not run 'torchvision::nms' with arguments from the 'CPU' backend").
Loaded from kvmatrix_torchvision_schemas.pth, which `make sglang-env` puts in .venv-sglang's site-packages.
"""
try:
    import torch
except ImportError:  # torch not installed yet (the venv is being built)
    torch = None

SCHEMAS = (
    "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
)

if torch is not None:
    _LIBRARY = torch.library.Library("torchvision", "FRAGMENT")
    for _schema in SCHEMAS:
        if not hasattr(torch.ops.torchvision, _schema.split("(")[0]):
            _LIBRARY.define(_schema)
