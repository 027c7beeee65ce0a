"""What PyTorch names mean: the one place that knows the library's vocabulary.

Qualified names are resolved by :mod:`torchlint.model.names`; this module maps
them (and, when nothing better is known, variable names) to *roles*.
"""
from __future__ import annotations

import functools
import re
from typing import Optional

# ---------------------------------------------------------------- roles
MODEL = "model"
OPTIMIZER = "optimizer"
SCHEDULER = "scheduler"
LOSS = "loss_fn"
LOADER = "loader"
DEVICE = "device"
SCALER = "scaler"
ACCELERATOR = "accelerator"
DATASET = "dataset"

# ------------------------------------------------------- loss kinds
CE = "cross_entropy"
NLL = "nll"
BCE = "bce"
BCE_LOGITS = "bce_with_logits"
OTHER_LOSS = "other"

LOSS_CLASSES = {
    "torch.nn.CrossEntropyLoss": CE,
    "torch.nn.NLLLoss": NLL,
    "torch.nn.BCELoss": BCE,
    "torch.nn.BCEWithLogitsLoss": BCE_LOGITS,
}
FUNCTIONAL_LOSSES = {
    "torch.nn.functional.cross_entropy": CE,
    "torch.nn.functional.nll_loss": NLL,
    "torch.nn.functional.binary_cross_entropy": BCE,
    "torch.nn.functional.binary_cross_entropy_with_logits": BCE_LOGITS,
}

OPTIMIZER_PREFIXES = ("torch.optim.", "apex.optimizers.", "bitsandbytes.optim.", "timm.optim.")
OPTIMIZER_FACTORIES = {
    "torch.distributed.optim.DistributedOptimizer",
    "torch.distributed.optim.ZeroRedundancyOptimizer",
    "timm.optim.create_optimizer_v2",
    "timm.optim.create_optimizer",
    "transformers.AdamW",
    "transformers.optimization.AdamW",
}
SCHEDULER_PREFIXES = ("torch.optim.lr_scheduler.",)
SCHEDULER_FACTORIES = {
    "transformers.get_scheduler",
    "transformers.get_linear_schedule_with_warmup",
    "transformers.get_cosine_schedule_with_warmup",
    "transformers.optimization.get_linear_schedule_with_warmup",
    "timm.scheduler.create_scheduler",
    "timm.scheduler.create_scheduler_v2",
}
LOADER_NAMES = {"torch.utils.data.DataLoader", "torch.utils.data.dataloader.DataLoader"}
# library subclasses of torch's DataLoader (shuffle defaults to False, as in torch), with the
# position of ``shuffle`` and ``batch_size`` among their positional parameters (None: keyword
# only, their signature differs from torch's); where their batches land is not known (MONAI
# transforms may put them on the device), so only the loader's construction is read
LIBRARY_LOADERS = {
    "monai.data.DataLoader": (None, None),  # (dataset, num_workers=0, **kwargs)
    "monai.data.dataloader.DataLoader": (None, None),
    "monai.data.ThreadDataLoader": (None, None),  # (dataset, buffer_size=1, ..., **kwargs)
    "monai.data.thread_buffer.ThreadDataLoader": (None, None),
    "torch_geometric.loader.DataLoader": (2, 1),  # (dataset, batch_size=1, shuffle=False, ...)
    "torch_geometric.loader.dataloader.DataLoader": (2, 1),
    "torch_geometric.data.DataLoader": (2, 1),  # the older home of the same class
    "dgl.dataloading.GraphDataLoader": (None, None),  # (dataset, collate_fn=None, use_ddp=False, ...)
}
# loaders of graph libraries whose batches are collated on the CPU whatever their dataset holds
# (PyG's ``Batch``/``Data`` objects, DGL's batched graphs): a loop over them must move each batch
# (``data = data.to(device)``) unless the dataset itself was put on the device (TL601)
# Graph datasets that hold one graph (node-level tasks: the whole graph is the one item, so a
# loader over them yields the same single batch every epoch, in the only order there is).
SINGLE_GRAPH_DATASETS = {
    "torch_geometric.datasets." + n for n in (
        "Planetoid", "CitationFull", "CoraFull", "Coauthor", "Amazon", "WikiCS", "Flickr", "Reddit",
        "Reddit2", "Yelp", "AmazonProducts", "Actor", "WebKB", "WikipediaNetwork",
        "FacebookPagePage", "LastFMAsia", "DeezerEurope", "GitHub", "Airports", "KarateClub",
        "AttributedGraphDataset", "HeterophilousGraphDataset")
} | {"ogb.nodeproppred.PygNodePropPredDataset", "ogb.nodeproppred.DglNodePropPredDataset",
     "ogb.nodeproppred.NodePropPredDataset"}

# dataset constructors whose length is the length of one argument (position, keyword): the
# samples they are given (MONAI's datasets over a list of dicts), the indices a Subset keeps
SIZED_BY_ARGUMENT = {
    **{f"monai.data.{n}": (0, "data") for n in (
        "Dataset", "CacheDataset", "PersistentDataset", "SmartCacheDataset", "LMDBDataset",
        "CacheNTransDataset")},
    "monai.data.ArrayDataset": (0, "img"),
    "torch.utils.data.Subset": (1, "indices"),
    "torch.utils.data.dataset.Subset": (1, "indices"),
}
# tensor constructors whose first positional argument (an int) is the number of rows
SIZED_FACTORIES = {"torch.zeros", "torch.ones", "torch.randn", "torch.rand", "torch.empty",
                   "torch.Tensor", "torch.FloatTensor", "torch.LongTensor"}
# tensor constructors taking nested data: as many rows as the outer list has items
DATA_FACTORIES = {"torch.tensor", "torch.Tensor", "torch.FloatTensor", "torch.LongTensor",
                  "torch.as_tensor", "numpy.array", "numpy.asarray", "torch.autograd.Variable",
                  "torch.from_numpy", "list", "tuple"}
# random tensor factories: every value drawn independently
RANDOM_FACTORIES = {"torch.randn", "torch.rand", "torch.randint", "torch.normal", "torch.randn_like",
                    "torch.rand_like", "numpy.random.randn", "numpy.random.rand", "numpy.random.normal",
                    "numpy.random.uniform", "numpy.random.randint", "torch.bernoulli"}

HOST_BATCH_LOADERS = {
    "torch_geometric.loader.DataLoader",
    "torch_geometric.loader.dataloader.DataLoader",
    "torch_geometric.data.DataLoader",
    "torch_geometric.loader.ClusterLoader",
    "torch_geometric.data.ClusterLoader",
    "torch_geometric.loader.GraphSAINTRandomWalkSampler",
    "torch_geometric.data.GraphSAINTRandomWalkSampler",
    "torch_geometric.loader.GraphSAINTNodeSampler",
    "torch_geometric.data.GraphSAINTNodeSampler",
    "torch_geometric.loader.GraphSAINTEdgeSampler",
    "torch_geometric.data.GraphSAINTEdgeSampler",
    "torch_geometric.loader.NeighborLoader",
    "torch_geometric.loader.LinkNeighborLoader",
    "dgl.dataloading.GraphDataLoader",
}
SCALER_NAMES = {
    "torch.cuda.amp.GradScaler",
    "torch.amp.GradScaler",
    "torch.cpu.amp.GradScaler",
    "torch.GradScaler",
}
ACCELERATOR_NAMES = {"accelerate.Accelerator"}
DEVICE_NAMES = {"torch.device"}
MODULE_BASES = {
    "torch.nn.Module",
    "torch.nn.modules.module.Module",
    "pytorch_lightning.LightningModule",
    "lightning.LightningModule",
    "lightning.pytorch.LightningModule",
    "torch.nn.Sequential",
    "torch.nn.ModuleList",
    "transformers.PreTrainedModel",
}
LIGHTNING_BASES = {
    "pytorch_lightning.LightningModule",
    "lightning.LightningModule",
    "lightning.pytorch.LightningModule",
    "pytorch_lightning.core.LightningModule",
    "pytorch_lightning.core.lightning.LightningModule",
    "pytorch_lightning.core.module.LightningModule",
    "lightning.pytorch.core.LightningModule",
    "lightning.pytorch.core.module.LightningModule",
}
LIGHTNING_CALLBACK_BASES = {
    "pytorch_lightning.Callback", "pytorch_lightning.callbacks.Callback",
    "pytorch_lightning.callbacks.base.Callback", "lightning.Callback", "lightning.pytorch.Callback",
    "lightning.pytorch.callbacks.Callback", "lightning.pytorch.callbacks.callback.Callback",
}
# Lightning runs its evaluation loops (steps and every hook around them, of the module and of
# callbacks) inside ``torch.no_grad()``/``inference_mode()``
LIGHTNING_EVAL_HOOKS = frozenset({"validation_step", "test_step", "predict_step", "validation_step_end",
                                  "test_step_end", "validation_epoch_end", "test_epoch_end"})
LIGHTNING_EVAL_HOOK_PREFIXES = ("on_validation_", "on_test_", "on_predict_")
# torchvision detection models: their mode picks what the forward returns (a dict of losses in
# train mode, where targets are required; detections in eval mode), so a wrong mode fails
# loudly rather than computing other numbers (their batch norm is frozen: FrozenBatchNorm2d),
# and a validation loss computed in train mode under no_grad is deliberate
TORCHVISION_DETECTION = re.compile(r"^torchvision\.models\.detection\.(.+\.)?(fasterrcnn_|maskrcnn_|keypointrcnn_|"
                                   r"retinanet_|ssd|ssdlite|fcos_|FasterRCNN$|MaskRCNN$|KeypointRCNN$|RetinaNet$|"
                                   r"SSD$|SSDLite$|FCOS$)")
MODEL_FACTORY_PREFIXES = ("torchvision.models.", "timm.", "transformers.")
MODEL_FACTORY_SUFFIXES = (".from_pretrained",)

# torch.nn classes that are not modules we train (containers and layers are modules)
NN_NON_MODULES = {"torch.nn.Parameter", "torch.nn.ParameterList", "torch.nn.ParameterDict"}
PARAMETER_CLASSES = ("torch.nn.Parameter", "torch.nn.parameter.Parameter")

# Model wrappers: ``wrapper(model, ...)`` is the model (its modes, its outputs, its device).
# Data parallelism: the wrapper scatters its inputs to the model's devices.
DATA_PARALLEL = frozenset({
    "torch.nn.DataParallel", "torch.nn.parallel.DataParallel", "torch.nn.DistributedDataParallel",
    "torch.nn.parallel.DistributedDataParallel", "torch.nn.parallel.distributed.DistributedDataParallel"})
MODEL_WRAPPERS = DATA_PARALLEL | {"torch.compile", "torch.jit.script", "torch.nn.SyncBatchNorm.convert_sync_batchnorm"}
# methods of a module that return the module itself
MODULE_SELF_METHODS = frozenset({"to", "cuda", "cpu", "train", "eval", "half", "float", "double", "bfloat16",
                                 "requires_grad_", "to_empty", "share_memory"})

GRAD_OFF_CONTEXTS = {"torch.no_grad", "torch.inference_mode", "torch.autograd.no_grad",
                     "torch.autograd.grad_mode.no_grad", "torch.autograd.inference_mode"}
GRAD_ON_CONTEXTS = {"torch.enable_grad", "torch.autograd.enable_grad"}
# library context managers that switch the models given to them to a mode and the grad mode
# with it, for their body, and restore both at exit: MONAI's ``eval_mode(*nets)`` (eval,
# under ``torch.no_grad()``) and ``train_mode(*nets)`` (train, ``set_grad_enabled(True)``)
MODE_CONTEXTS = {"monai.networks.utils.eval_mode": "eval", "monai.networks.eval_mode": "eval",
                 "monai.networks.utils.train_mode": "train", "monai.networks.train_mode": "train"}
GRAD_OFF_CONTEXTS |= {q for q, m in MODE_CONTEXTS.items() if m == "eval"}
GRAD_ON_CONTEXTS |= {q for q, m in MODE_CONTEXTS.items() if m == "train"}
SET_GRAD_ENABLED = {"torch.set_grad_enabled", "torch.autograd.set_grad_enabled"}
# library explainers built around a model whose call runs the model and a backward through it
# in the caller's grad mode (they do not turn gradients on themselves): under ``no_grad`` they
# raise. By package, the classes (found in any of its submodules) that differentiate: MONAI's
# gradient-based saliency (not ``CAM``, ``OcclusionSensitivity``), pytorch-grad-cam's gradient
# CAMs (not ``ScoreCAM``, ``AblationCAM``, ``EigenCAM``).
GRAD_EXPLAINERS = {
    "monai.visualize": frozenset({"GradCAM", "GradCAMpp", "VanillaGrad", "SmoothGrad", "GuidedBackpropGrad",
                                  "GuidedBackpropSmoothGrad"}),
    "pytorch_grad_cam": frozenset({"GradCAM", "GradCAMPlusPlus", "XGradCAM", "EigenGradCAM", "LayerCAM",
                                   "HiResCAM", "GradCAMElementWise", "FullGrad", "GuidedBackpropReLUModel"}),
}


# Library functions and callables that run a model handed to them as an argument (a forward
# through a helper): MONAI's sliding-window inference and its ``Inferer`` objects
# (``inferer(inputs, model)``). Matched on the last part of the callee's name.
INFERENCE_HELPERS = re.compile(r"(?:^|_)(?:sliding_window_inference|inferer|\w*_inferer)$", re.I)
# the keywords those helpers take the model by
INFERENCE_MODEL_KEYWORDS = ("predictor", "network", "model", "net")


# packages every callable of which differentiates the model it is given: adversarial attacks
GRAD_PACKAGES = ("torchattacks", "foolbox.attacks", "art.attacks")


def is_grad_explainer(qualname: Optional[str]) -> bool:
    """``qualname`` (qualified through the imports) is a class of ``GRAD_EXPLAINERS`` or of
    ``GRAD_PACKAGES``."""
    if not qualname:
        return False
    if qualname.startswith(tuple(p + "." for p in GRAD_PACKAGES)):
        return True
    mod, _, name = qualname.rpartition(".")
    for pkg, names in GRAD_EXPLAINERS.items():
        if name in names and (mod == pkg or mod.startswith(pkg + ".")):
            return True
    return False

SOFTMAX_FUNCS = {"torch.softmax", "torch.nn.functional.softmax", "torch.Tensor.softmax",
                 "torch.special.softmax"}
LOG_SOFTMAX_FUNCS = {"torch.log_softmax", "torch.nn.functional.log_softmax",
                     "torch.special.log_softmax"}
SIGMOID_FUNCS = {"torch.sigmoid", "torch.nn.functional.sigmoid", "torch.special.expit"}

TENSOR_FACTORIES = {
    "torch.zeros", "torch.ones", "torch.arange", "torch.randn", "torch.rand", "torch.empty",
    "torch.full", "torch.eye", "torch.tensor", "torch.linspace", "torch.randint", "torch.randperm",
}
FRESH_FACTORIES = TENSOR_FACTORIES | {
    "torch.zeros_like", "torch.ones_like", "torch.empty_like", "torch.full_like",
    "torch.randn_like", "torch.rand_like", "torch.cat", "torch.stack",
}

# ignite engines: ``Engine(process_function)`` calls the function once per batch
ENGINE_CLASSES = {"ignite.engine.Engine", "ignite.engine.engine.Engine", "ignite.engine.DeterministicEngine",
                  "ignite.engine.deterministic.DeterministicEngine"}

# ------------------------------------------------------- other libraries
# deep-learning frameworks other than PyTorch: a module importing one of them and nothing of
# PyTorch's is not PyTorch code (an MXNet baseline, a TensorFlow port in the same tree)
OTHER_FRAMEWORKS = {"tensorflow", "keras", "tf_keras", "mxnet", "jax", "jaxlib", "flax", "haiku",
                    "optax", "paddle", "mindspore", "oneflow", "chainer", "cupy", "theano", "caffe",
                    "cntk", "dynet", "trax", "objax", "equinox"} | {
    # MicroPython's own modules: code for a microcontroller board, where PyTorch cannot run
    # (a plain-Python network exported for the board has a ``forward`` of its own)
    "pyb", "machine", "micropython", "utime", "uasyncio", "ustruct", "ujson", "umqtt"}
# packages whose objects are PyTorch's (a module importing one is PyTorch code)
TORCH_PACKAGES = {"torch", "torchvision", "torchaudio", "torchtext", "torchmetrics", "pytorch_lightning",
                  "lightning", "lightning_fabric", "timm", "accelerate", "ignite", "fairseq", "detectron2",
                  "mmcv", "mmdet", "mmseg", "mmengine", "segmentation_models_pytorch", "torch_geometric",
                  "dgl", "monai", "kornia", "apex", "deepspeed", "peft", "diffusers", "transformers",
                  "pytorch_metric_learning", "torchrl", "stable_baselines3", "bitsandbytes", "xformers"}
# what a call of these libraries returns is never a PyTorch model, optimizer, scheduler or
# loader, whatever the variable is called: an OpenCV/ONNX Runtime net has its own
# ``forward``, a gym environment its ``step``, a scikit-learn estimator its ``fit``
NON_TORCH_PACKAGES = OTHER_FRAMEWORKS | {
    "cv2", "onnxruntime", "onnx", "openvino", "tensorrt", "sklearn", "xgboost", "lightgbm",
    "catboost", "gym", "gymnasium", "numpy", "scipy", "pandas", "optuna", "ray", "dlib", "mediapipe",
    "insightface", "face_recognition", "PIL", "skimage", "tflite_runtime", "coremltools", "ncnn",
}
# diffusers' noise schedulers step the sampling, its pipelines run no_grad inference: neither is
# an LR scheduler or a model


def non_torch_object(qualname: str) -> bool:
    """What a call of ``qualname`` (an imported callable) returns is known not to be a PyTorch
    training object: another library's, or a diffusers noise scheduler / pipeline, a
    transformers ``pipeline``, or an Ultralytics model object (``YOLO(...)``)."""
    top = qualname.split(".", 1)[0]
    if top in NON_TORCH_PACKAGES:
        return True
    last = qualname.rsplit(".", 1)[-1]
    base = qualname.rsplit(".", 2)[-2] if qualname.count(".") >= 1 else ""
    if top == "diffusers" and ("Scheduler" in last or "Pipeline" in last or "Scheduler" in base
                               or "Pipeline" in base):
        return True
    if top == "ultralytics" and last[:1].isupper() and (qualname.count(".") == 1 or ".models." in qualname):
        # ``YOLO(weights)``, ``RTDETR``, ``SAM``: the high-level model object, whose call predicts
        # inside the predictor's own inference mode and whose ``train(data=...)`` runs a trainer
        return True
    return qualname in ("transformers.pipeline", "transformers.pipelines.pipeline")


# ------------------------------------------------------- name heuristics
_PATTERNS = [
    (SCHEDULER, re.compile(r"(^|_)(lr_)?sched(uler)?s?($|_)|^scheduler|_scheduler$|^lr_scheduler")),
    (OPTIMIZER, re.compile(r"^(opt|optim|optimizer|optimiser)s?(_\w+)?$|_(opt|optim|optimizer|optimiser)$|^optimizer")),
    (SCALER, re.compile(r"(^|_)(grad_)?scaler$|^loss_scaler$")),
    (ACCELERATOR, re.compile(r"^accelerator$")),
    (LOADER, re.compile(r"(^|_)(data_?)?loader(s)?($|_)|_dl$|^dl_|^dl$")),
    (LOSS, re.compile(r"^(criterion|loss_fn|loss_func|lossfn|loss_function|criterion_\w+|\w+_criterion)$")),
    (DEVICE, re.compile(r"^(device|dev)$|_device$")),
    (MODEL, re.compile(
        r"^(model|net|network|module|classifier|generator|discriminator|encoder|decoder|"
        r"netG|netD|netE|G|D|student|teacher|backbone|policy|critic|actor)$|_model$|^model_|_net$"
    )),
]


# names that say "this is about a model" (its function, path, name, config), not "this is a model"
_NOT_INSTANCE_SUFFIX = re.compile(
    r"_(fn|fns|func|funcs|function|functions|transform|transforms|name|names|path|paths|dir|file|"
    r"url|cfg|config|conf|args|kwargs|kw|type|types|cls|class|classes|builder|factory|ctor|params|"
    r"state|state_dict|dict|ckpt|checkpoint|weights|id|ids|str|kind|version|tag|prefix|suffix|"
    r"key|keys|list|map|registry|zoo|hub|spec|step|steps|wrapper|hook|hooks)$", re.I)

# names that say "this returns/does something with a model", not "this is a model"
_VERB_PREFIX = re.compile(
    r"^_*(get|create|build|make|load|init|initialize|setup|prepare|reparameterize|convert|wrap|"
    r"unwrap|export|save|freeze|unfreeze|run|compute|update|copy|apply|register|check|fuse|"
    r"compile|trace|instantiate|construct|extract|auto|from|to|load|dump|print|log|show|plot|"
    r"count|summarize|describe|inspect|validate|is|has)_", re.I)


@functools.lru_cache(maxsize=8192)
def role_from_name(name: str) -> Optional[str]:
    """Guess a role from a variable name (last attribute); ``None`` if nothing fits.

    Names that read as actions (``create_model``, ``get_eval_model``) are not guessed to be
    the thing they act on.
    """
    last = name.rsplit(".", 1)[-1]
    if _VERB_PREFIX.search(last) or _NOT_INSTANCE_SUFFIX.search(last):
        return None
    for role, pat in _PATTERNS:
        if pat.search(last):
            return role
    return None


# BACKWARD info for torch.distributed.autograd.backward(context_id, ...): gradients are kept
# per autograd context, never accumulated in .grad, so nothing needs clearing
DIST_AUTOGRAD = "dist_autograd"

# callables that take an optimizer as first argument and step it
OPTIMIZER_STEP_FUNCS = {"torch_xla.core.xla_model.optimizer_step"}

# what a ``torch.optim.Optimizer`` has: a method outside this set called on an optimizer-like
# object means the object is a wrapper of the project's own (``ScheduledOptim``), whose
# methods may step the optimizer inside
OPTIMIZER_API = frozenset({
    "step", "zero_grad", "add_param_group", "state_dict", "load_state_dict", "param_groups",
    "state", "defaults", "register_step_pre_hook", "register_step_post_hook",
    "register_state_dict_pre_hook", "register_state_dict_post_hook",
    "register_load_state_dict_pre_hook", "register_load_state_dict_post_hook", "train", "eval",
})


ANNOTATION_ROLES = {
    "torch.nn.Module": MODEL,
    "torch.optim.Optimizer": OPTIMIZER,
    "torch.optim.optimizer.Optimizer": OPTIMIZER,
    "torch.optim.lr_scheduler.LRScheduler": SCHEDULER,
    "torch.optim.lr_scheduler._LRScheduler": SCHEDULER,
    "torch.utils.data.DataLoader": LOADER,
    "torch.device": DEVICE,
    "torch.cuda.amp.GradScaler": SCALER,
    "torch.amp.GradScaler": SCALER,
    "accelerate.Accelerator": ACCELERATOR,
}


def role_of_constructor(qualname: str) -> tuple[Optional[str], Optional[str]]:
    """Role (and loss kind) of the value a call to ``qualname`` returns."""
    if qualname in LOSS_CLASSES:
        return LOSS, LOSS_CLASSES[qualname]
    if qualname.startswith("torch.nn.") and qualname.endswith("Loss"):
        return LOSS, OTHER_LOSS
    if qualname in LOADER_NAMES or qualname in LIBRARY_LOADERS:
        return LOADER, None
    if qualname in SCALER_NAMES:
        return SCALER, None
    if qualname in ACCELERATOR_NAMES:
        return ACCELERATOR, None
    if qualname in DEVICE_NAMES:
        return DEVICE, None
    if qualname.startswith(SCHEDULER_PREFIXES) or qualname in SCHEDULER_FACTORIES:
        return SCHEDULER, None
    if qualname in OPTIMIZER_FACTORIES:
        return OPTIMIZER, None
    if qualname.startswith(OPTIMIZER_PREFIXES):
        last = qualname.rsplit(".", 1)[-1]
        if last[:1].isupper() and "lr_scheduler" not in qualname and last != "Optimizer":
            return OPTIMIZER, None
    if qualname.startswith("torch.nn.") and qualname not in NN_NON_MODULES:
        last = qualname.rsplit(".", 1)[-1]
        if last[:1].isupper() and not qualname.startswith("torch.nn.functional") \
                and not qualname.startswith("torch.nn.init") and not qualname.startswith("torch.nn.utils"):
            return MODEL, None
    if qualname.startswith("torchvision.models.") or qualname in {"timm.create_model"}:
        return MODEL, None
    if qualname.endswith(MODEL_FACTORY_SUFFIXES) and "Model" in qualname and "Tokenizer" not in qualname:
        return MODEL, None
    return None, None


def functional_loss_kind(qualname: str) -> Optional[str]:
    return FUNCTIONAL_LOSSES.get(qualname)
