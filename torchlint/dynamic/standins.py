"""Stand-ins for third-party modules a program imports but this environment lacks (child side).

Only modules that a training run can do without are stood in, and only when the real one
cannot be imported: progress bars (``tqdm``: a pass-through iterator), experiment loggers
(``wandb``, ``tensorboardX``, ``torch.utils.tensorboard``: no-ops) and ``torchvision``
(datasets of random images of the real dataset's shape and class count, identity transforms,
small models with the real ones' ``num_classes`` and ``fc``, or VGG's ``classifier``).  Each use is recorded (a
``standin`` fact) and said in the evidence.  Anything else that is missing stays an
``ImportError``, which the verdict names.
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types

import torch
import torch.nn as nn

_PROBES = [None]
_ROOTS = ("tqdm", "wandb", "tensorboardX", "torchvision")
_TB = "torch.utils.tensorboard"


def _note(key, text):
    p = _PROBES[0]
    if p is not None:
        try:
            p.standin(key, text, p.sites())
        except Exception:
            pass


class _NoOp:
    """Accepts any call, attribute, item or context use and does nothing."""

    def __init__(self, *a, **k):
        pass

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _NoOp()

    def __call__(self, *a, **k):
        return _NoOp()

    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False

    def __iter__(self):
        return iter(())

    def __bool__(self):
        return False

    def __getitem__(self, k):
        return _NoOp()

    def __setitem__(self, k, v):
        pass


class _Tqdm:
    def __init__(self, iterable=None, *a, total=None, **k):
        self.iterable, self.total, self.n = iterable, total, 0

    def __iter__(self):
        for x in (self.iterable if self.iterable is not None else ()):
            self.n += 1
            yield x

    def __len__(self):
        try:
            return len(self.iterable)
        except TypeError:
            return int(self.total or 0)

    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False

    def update(self, n=1):
        self.n += n

    def _nothing(self, *a, **k):
        return None

    set_description = set_postfix = set_description_str = set_postfix_str = refresh = close = clear = \
        reset = display = _nothing

    @staticmethod
    def write(s, *a, **k):
        print(s)


def _tqdm_module(name):
    m = types.ModuleType(name)
    _note("tqdm", "tqdm is not installed: a pass-through iterator stood in for its progress bars")
    m.tqdm = _Tqdm
    m.trange = lambda *a, **k: _Tqdm(range(*a), **k)
    m.__path__ = []
    return m


def _logger_module(name):
    root = name.split(".")[0] if not name.startswith(_TB) else _TB
    _note(root, f"{root} is not installed: a no-op logger stood in for it")
    m = types.ModuleType(name)

    def getattr_(attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _NoOp()
    m.__getattr__ = getattr_
    m.SummaryWriter = _NoOp
    m.__path__ = []
    return m


# ----------------------------------------------------------------------- torchvision
_DATASETS = {  # name: (image shape, classes)
    "MNIST": ((1, 28, 28), 10), "FashionMNIST": ((1, 28, 28), 10), "KMNIST": ((1, 28, 28), 10),
    "EMNIST": ((1, 28, 28), 47), "QMNIST": ((1, 28, 28), 10), "CIFAR10": ((3, 32, 32), 10),
    "CIFAR100": ((3, 32, 32), 100), "SVHN": ((3, 32, 32), 10), "STL10": ((3, 96, 96), 10),
    "ImageFolder": ((3, 64, 64), 10), "DatasetFolder": ((3, 64, 64), 10), "ImageNet": ((3, 64, 64), 1000),
    "CelebA": ((3, 64, 64), 40), "Places365": ((3, 64, 64), 365), "Food101": ((3, 64, 64), 101),
    "Flowers102": ((3, 64, 64), 102), "OxfordIIITPet": ((3, 64, 64), 37),
}
_N = 256


class _Dataset(torch.utils.data.Dataset):
    def __init__(self, name, shape, classes, seg=False, transform=None, target_transform=None, size=_N,
                 attrs=False):
        g = torch.Generator().manual_seed(0)
        self.images = torch.rand((size,) + tuple(shape), generator=g)
        self.attrs = attrs
        if attrs:  # CelebA's target_type="attr": a 0/1 vector of `classes` attributes per image
            self.targets = torch.randint(0, 2, (size, classes), generator=g)
        elif seg:
            self.targets = torch.randint(0, classes, (size,) + tuple(shape[1:]), generator=g)
        else:
            self.targets = torch.randint(0, classes, (size,), generator=g)
        self.classes = [str(i) for i in range(classes)]
        self.transform, self.target_transform, self.seg = transform, target_transform, seg
        self.data = self.images
        self.pil = False

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        x = self.images[i]
        y = self.targets[i] if self.seg or self.attrs else int(self.targets[i])
        if self.pil:
            from torchvision.transforms.functional import to_pil_image

            x = to_pil_image(x)
            if self.seg:
                y = to_pil_image(y.to(torch.uint8))
        if callable(self.transform):
            x = self.transform(x)
        if callable(self.target_transform):
            y = self.target_transform(y)
        return x, y


def _dataset_class(name):
    seg = "Segmentation" in name
    shape, classes = ((3, 64, 64), 21) if seg else _DATASETS.get(name, ((3, 32, 32), 10))

    def make(*a, transform=None, target_transform=None, _real=False, **k):
        if name == "FakeData":
            size = int(k.get("size", a[0] if a else 1000))
            shp = tuple(k.get("image_size", (3, 224, 224)))
            ncls = int(k.get("num_classes", 10))
            ds = _Dataset(name, shp, ncls, False, transform, target_transform, size=min(size, _N))
            what = f"{min(size, _N)} random {list(shp)} images of {ncls} classes"
        elif name == "CelebA" and k.get("target_type", "attr") == "attr":
            ds = _Dataset(name, shape, classes, False, transform, target_transform, attrs=True)
            what = f"{_N} random {list(shape)} images with {classes} binary attributes each"
        else:
            ds = _Dataset(name, shape, classes, seg, transform, target_transform)
            what = (f"{_N} random {list(shape)} images with [{shape[1]}, {shape[2]}] masks of {classes} classes"
                    if seg else f"{_N} random {list(shape)} images of {classes} classes")
        _note(f"torchvision.datasets.{name}", ("" if _real else "torchvision is not installed: ")
              + f"datasets.{name} stood in by {what}")
        return ds
    make.__name__ = name
    return make


class _Identity:
    def __init__(self, *a, **k):
        self.fns = a[0] if a and isinstance(a[0], (list, tuple)) else None

    def __call__(self, x, *a, **k):
        if self.fns is not None:  # Compose
            for f in self.fns:
                x = f(x) if callable(f) else x
        return x


class _Classifier(nn.Module):
    """A small CNN with the `fc` head torchvision's classifiers have."""

    def __init__(self, num_classes=1000):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                                      nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.fc = nn.Linear(16, num_classes)

    def forward(self, x):
        return self.fc(self.features(x))


class _VGGLike(nn.Module):
    """A small CNN with the `features` and 7-layer `classifier` (4096 wide) of torchvision's VGG and AlexNet."""

    def __init__(self, num_classes=1000):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                                      nn.Flatten())
        self.classifier = nn.Sequential(nn.Linear(16, 4096), nn.ReLU(), nn.Dropout(), nn.Linear(4096, 4096),
                                        nn.ReLU(), nn.Dropout(), nn.Linear(4096, num_classes))

    def forward(self, x):
        return self.classifier(self.features(x))


class _Segmenter(nn.Module):
    def __init__(self, num_classes=21):
        super().__init__()
        self.backbone = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU())
        self.classifier = nn.Conv2d(16, num_classes, 1)

    def forward(self, x):
        return {"out": self.classifier(self.backbone(x))}


def _model_factory(name, seg):
    def make(*a, num_classes=None, **k):
        n = int(num_classes or (21 if seg else 1000))
        _note(f"torchvision.models.{name}", f"torchvision is not installed: models.{name} stood in by a small "
                                            f"{'segmentation ' if seg else ''}CNN with {n} classes")
        if seg:
            return _Segmenter(n)
        return _VGGLike(n) if name.startswith(("vgg", "alexnet")) else _Classifier(n)
    make.__name__ = name
    return make


def _module_getattr(kind):
    def getattr_(attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        if (kind == "torchvision" and attr in ("datasets", "transforms", "models", "utils", "ops", "io")) or \
                (kind == "models" and attr in ("segmentation", "detection", "video", "quantization")) or \
                (kind == "transforms" and attr in ("functional", "v2")):
            import importlib

            parent = "torchvision" if kind == "torchvision" else f"torchvision.{kind}"
            return importlib.import_module(f"{parent}.{attr}")
        if kind == "datasets":
            return _dataset_class(attr)
        if kind == "transforms":
            return _Identity
        if kind in ("models", "segmentation"):
            if attr[:1].isupper():  # weights enums (ResNet18_Weights.DEFAULT), classes
                return _NoOp()
            return _model_factory(attr, kind == "segmentation")
        if kind == "utils":
            return lambda *a, **k: (a[0] if a else None)
        return _NoOp()
    return getattr_


def _torchvision_module(name):
    m = types.ModuleType(name)
    m.__path__ = []
    parts = name.split(".")
    kind = parts[-1] if len(parts) > 1 else "torchvision"
    if kind == "functional":
        kind = "transforms"
    m.__getattr__ = _module_getattr(kind)
    if name == "torchvision":
        m.__version__ = "0.0+standin"
    return m


def _fallback_datasets(module) -> None:
    """The real torchvision.datasets: a dataset whose files are absent (and cannot be downloaded)
    is stood in by random data of its shape instead of stopping the run."""
    for name in dir(module):
        cls = getattr(module, name, None)
        if not isinstance(cls, type) or not (name in _DATASETS or name.endswith("Segmentation")) or \
                "__torchlint_fallback__" in vars(cls):
            continue
        orig = cls.__init__

        def __init__(self, *a, _orig=orig, _name=name, **k):
            try:
                _orig(self, *a, **k)
            except (RuntimeError, OSError, ValueError) as exc:
                _note(f"torchvision.datasets.{_name}.files", f"datasets.{_name} could not load its files "
                                                              f"({type(exc).__name__}: {str(exc)[:80]})")
                ds = _dataset_class(_name)(transform=k.get("transform"), target_transform=k.get("target_transform"),
                                           _real=True)
                ds.pil = callable(k.get("transform"))  # the real transforms start from PIL images
                # a subclass of its own class serving the stand-in data (isinstance still holds)
                self.__class__ = type(type(self).__name__, (type(self),),
                                      {"__getitem__": _Dataset.__getitem__, "__len__": _Dataset.__len__})
                self.__dict__.update(ds.__dict__)
        cls.__init__ = __init__
        cls.__torchlint_fallback__ = True


def _fallback_weights(module) -> None:
    """The real torchvision.models: a model whose pretrained weights cannot be downloaded (no
    network, no cache) is built with random weights instead of stopping the run."""
    import functools
    import inspect

    for name in dir(module):
        fn = getattr(module, name, None)
        if not isinstance(fn, types.FunctionType) or getattr(fn, "__torchlint_fallback__", False) or \
                name.startswith("_"):
            continue
        try:
            if "weights" not in inspect.signature(fn).parameters:
                continue
        except (TypeError, ValueError):
            continue

        @functools.wraps(fn)
        def build(*a, _orig=fn, _name=name, **k):
            try:
                return _orig(*a, **k)
            except OSError as exc:  # urllib's URLError: the weights file could not be fetched
                if k.get("weights") is None:
                    raise
                _note(f"torchvision.models.{_name}.weights", f"models.{_name}: its pretrained weights could not be "
                                                              f"downloaded ({type(exc).__name__}: {str(exc)[:60]}), "
                                                              f"so it was built with random weights")
                k["weights"] = None
                return _orig(*a, **k)
        build.__torchlint_fallback__ = True
        setattr(module, name, build)


_READ_MODES = ("r", "c", "r+", "readonly", "copyonwrite", "readwrite")


def _fallback_memmap(np) -> None:
    """``np.memmap`` of a data file that is absent (nanoGPT's ``train.bin``) opened for reading:
    random values of its dtype (integers below 64, token ids of any vocabulary) stand in."""
    if getattr(np.memmap, "__torchlint_fallback__", False):
        return
    orig_new = np.memmap.__new__

    def __new__(subtype, filename, dtype=np.uint8, mode="r+", offset=0, shape=None, order="C"):
        try:
            return orig_new(subtype, filename, dtype, mode, offset, shape, order)
        except FileNotFoundError as exc:
            if mode not in _READ_MODES:
                raise
            dt = np.dtype(dtype)
            n = int(np.prod(shape)) if shape is not None else 200_000
            rng = np.random.default_rng(0)
            arr = (rng.integers(0, 64, n) if dt.kind in "iub" else rng.standard_normal(n)).astype(dt)
            if shape is not None:
                arr = arr.reshape(shape)
            _note(f"memmap:{filename}", f"np.memmap of the absent file {str(filename)[-80:]!r} ({exc.strerror}) "
                                        f"stood in by {n} random {dt} values")
            return arr.view(subtype)
    np.memmap.__new__ = staticmethod(__new__)
    np.memmap.__torchlint_fallback__ = True


_PATCHED = {"torchvision.datasets": _fallback_datasets, "numpy": _fallback_memmap,
            "torchvision.models": _fallback_weights, "torchvision.models.segmentation": _fallback_weights,
            "torchvision.models.detection": _fallback_weights}


class _Wrapped(importlib.abc.Loader):
    def __init__(self, loader, patch):
        self.loader, self.patch = loader, patch

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        self.loader.exec_module(module)
        try:
            self.patch(module)
        except Exception:
            pass


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, front):
        self.front = front

    def find_spec(self, fullname, path=None, target=None):
        root = fullname.split(".")[0]
        if self.front:
            if fullname in _PATCHED:
                spec = importlib.machinery.PathFinder.find_spec(fullname, path)
                if spec is not None and spec.loader is not None:
                    spec.loader = _Wrapped(spec.loader, _PATCHED[fullname])
                return spec
            if fullname != _TB and not fullname.startswith(_TB + "."):
                return None
            if importlib.util.find_spec("tensorboard") is not None:
                return None
        elif root not in _ROOTS:
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec):
        name = spec.name
        if name.startswith("tqdm"):
            m = _tqdm_module(name)
        elif name.startswith("torchvision"):
            m = _torchvision_module(name)
            if "." not in name:
                _note("torchvision", "torchvision is not installed: its datasets, transforms and models were "
                                     "stood in")
        else:
            m = _logger_module(name)
        m.__torchlint_standin__ = True
        return m

    def exec_module(self, module):
        parent, _, child = module.__name__.rpartition(".")
        if parent and parent in sys.modules:
            try:
                setattr(sys.modules[parent], child, module)
            except Exception:
                pass


def _own(module, name):
    try:
        return vars(module).get(name, False)
    except TypeError:
        return False


def install(probes) -> None:
    """Put the finders in place (the back one is asked only after every real finder failed);
    drop the stand-in modules of the previous run so each run records its own use of them."""
    _PROBES[0] = probes
    # read each module's own namespace: a module-level __getattr__ (the child's placeholder for
    # torch._dynamo, see lazydynamo) must not run for a name it does not have
    for name in [n for n, m in list(sys.modules.items()) if _own(m, "__torchlint_standin__")]:
        sys.modules.pop(name, None)
    for name, patch in _PATCHED.items():  # imported already (torch imports numpy; an earlier job torchvision)
        m = sys.modules.get(name)
        if m is not None and not _own(m, "__torchlint_standin__"):
            try:
                patch(m)
            except Exception:
                pass
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder(front=True))
        sys.meta_path.append(_Finder(front=False))
