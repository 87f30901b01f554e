"""Export failures as :class:`ExportError` naming the layer where they arose: the innermost
submodule whose code appears in the exception's stack (or in the frame Dynamo names in its
message)."""
from __future__ import annotations

import re
import traceback
from typing import Optional

import torch

from ..passes.canonical import module_label
from ..passes.report import one_line


class ExportError(RuntimeError):
    """A model (or one of its layers) that cannot be exported; the message names the layer."""


def _layer_index(model: torch.nn.Module):
    """filename -> [(first line, last line, layer name)] of every method of every submodule."""
    idx = {}
    for name, mod in model.named_modules():
        label = module_label(name, type(mod).__name__)
        for klass in type(mod).__mro__:
            if klass in (torch.nn.Module, object):
                break
            for v in vars(klass).values():
                fn = getattr(v, "__func__", v)
                code = getattr(fn, "__code__", None)
                if code is None:
                    continue
                lines = [ln for _, _, ln in code.co_lines() if ln is not None]
                idx.setdefault(code.co_filename, []).append(
                    (min(lines, default=code.co_firstlineno), max(lines, default=code.co_firstlineno), label))
    return idx


def _frames(exc: BaseException):
    frames = []
    seen = set()
    e: Optional[BaseException] = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        frames += [(f.filename, f.lineno) for f in traceback.extract_tb(e.__traceback__)]
        for attr in ("real_stack", "user_stack"):
            st = getattr(e, attr, None)
            if st:
                frames += [(f.filename, f.lineno) for f in st]
        e = e.__cause__ or e.__context__
    return frames


def _layer_of_exception(model: torch.nn.Module, exc: BaseException) -> Optional[str]:
    """The innermost layer whose code appears in the exception's (user) stack."""
    idx = _layer_index(model)
    found = None
    for filename, lineno in _frames(exc):
        labels = sorted({lab for lo, hi, lab in idx.get(filename, ()) if lineno and lo <= lineno <= hi})
        if labels:
            cand = " / ".join(labels)
            if found is None or not cand.startswith("<model>"):
                found = cand
    if found is None:
        # dynamo reports the user frame in its message ("... test.py:136 in forward")
        text = " ".join(str(e) for e in chain(exc))
        for m in re.finditer(r"(\S+\.py):(\d+) in \w+", text):
            fname, line = m.group(1), int(m.group(2))
            for filename, entries in idx.items():
                if filename.endswith(fname.lstrip(".")) or fname.endswith(filename[-40:]):
                    labels = sorted({lab for lo, hi, lab in entries if lo <= line <= hi})
                    if labels:
                        found = " / ".join(labels)
    return found


def chain(exc: BaseException):
    seen = set()
    e: Optional[BaseException] = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        yield e
        e = e.__cause__ or e.__context__


def fail(model, stage: str, exc: BaseException) -> ExportError:
    """The ExportError for ``exc``, raised while ``stage`` ran on ``model``."""
    layer = _layer_of_exception(model, exc) or module_label("", type(model).__name__)
    return ExportError(f"gnncompile.export: cannot export layer {layer}: {stage} failed: "
                       f"{type(exc).__name__}: {one_line(exc, 600)}")


__all__ = ["ExportError", "fail", "chain"]
