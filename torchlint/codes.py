"""Every rule code and its name: what the command line needs (selection, output) without
importing the rules, and with them libcst, on a run answered from the cache.

Generated from the rule classes by ``python -m torchlint.docs``; ``tests/test_docs.py`` checks
that it matches them.
"""

DOCS_URL = "https://github.com/torchlint/torchlint/blob/main/docs/rules/{code}.md"

CODES = {
    "TL000": "internal-error",
    "TL001": "syntax-error",
    "TL002": "unused-noqa",
    "TL003": "not-analysed",
    "TL101": "step-before-backward",
    "TL102": "zero-grad-between-backward-and-step",
    "TL103": "missing-zero-grad",
    "TL104": "backward-without-step",
    "TL105": "scheduler-before-optimizer-step",
    "TL106": "clip-before-unscale",
    "TL107": "step-bypasses-scaler",
    "TL108": "step-without-backward",
    "TL109": "step-between-retained-backwards",
    "TL201": "eval-without-eval-mode",
    "TL202": "train-after-eval",
    "TL203": "eval-without-no-grad",
    "TL204": "backward-under-no-grad",
    "TL205": "optimizer-misses-parameters",
    "TL206": "state-dict-snapshot-alias",
    "TL301": "inplace-on-saved-tensor",
    "TL302": "data-attribute",
    "TL303": "forward-called-directly",
    "TL304": "gradient-cut-in-forward",
    "TL401": "softmax-before-cross-entropy",
    "TL402": "sigmoid-before-bce-with-logits",
    "TL403": "nll-loss-without-log-softmax",
    "TL404": "cross-entropy-float-targets",
    "TL405": "log-of-softmax",
    "TL501": "loss-accumulated-with-graph",
    "TL502": "output-stored-with-graph",
    "TL601": "tensor-not-moved-to-device",
    "TL602": "tensor-created-without-device",
    "TL603": "tensor-attribute-not-buffer",
    "TL604": "loss-weight-on-wrong-device",
    "TL701": "train-loader-without-shuffle",
    "TL702": "argmax-without-dim",
    "TL703": "batchnorm-eps-positional",
    "TL801": "detect-anomaly-left-on",
}

# rules off by default (preview): selected only by their full code
PREVIEW = frozenset({"TL104", "TL107", "TL108", "TL109", "TL201", "TL202", "TL204", "TL205", "TL206", "TL303", "TL304", "TL405", "TL601", "TL603", "TL604"})
