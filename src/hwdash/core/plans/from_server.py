"""``--from`` a serving engine's command line saved in a file (a ``.sh`` or ``.txt``): one
``vllm serve MODEL ...`` or ``python -m sglang.launch_server --model-path MODEL ...`` line, as
``hwdash plan --export vllm`` writes it (:mod:`hwdash.core.planning.serving_command`).

The flags read are the engines' own names for the serving plan's fields (vLLM's
``vllm/engine/arg_utils.py``, SGLang's ``python/sglang/srt/server_args.py``); any other flag is
listed in the ``ignored`` warning, never refused. A line may be split with trailing backslashes,
start with environment assignments (``CUDA_VISIBLE_DEVICES=0,1 vllm serve ...``) or ``exec``, and
give values as ``--flag value`` or ``--flag=value``.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from hwdash.core.plan import Engine, KvDtype, Method
from hwdash.core.planning.serving_command import VLLM_QUANTIZATION
from hwdash.core.plans.from_reader import FLAG, ImportedPlan
from hwdash.errors import UsageError

#: Each engine's flag -> the plan field it sets.
SERVER_FLAGS: dict[str, dict[str, str]] = {
    "vllm": {
        "--model": "model",
        "--tensor-parallel-size": "gpus",
        "-tp": "gpus",
        "--gpu-memory-utilization": "gpu_memory_utilization",
        "--max-model-len": "max_model_len",
        "--max-num-seqs": "max_num_seqs",
        "--max-num-batched-tokens": "max_num_batched_tokens",
        "--kv-cache-dtype": "kv_dtype",
        "--quantization": "quant",
        "-q": "quant",
    },
    "sglang": {
        "--model-path": "model",
        "--model": "model",
        "--tp-size": "gpus",
        "--tp": "gpus",
        "--mem-fraction-static": "gpu_memory_utilization",
        "--context-length": "max_model_len",
        "--max-running-requests": "max_num_seqs",
        "--chunked-prefill-size": "max_num_batched_tokens",
        "--kv-cache-dtype": "kv_dtype",
        "--quantization": "quant",
    },
}

#: ``--kv-cache-dtype`` values (both engines: ``auto`` or an fp8 variant) -> ``--kv-dtype``.
KV_CACHE_DTYPES = {
    "auto": KvDtype.AUTO,
    "fp8": KvDtype.FP8,
    "fp8_e4m3": KvDtype.FP8,
    "fp8_e5m2": KvDtype.FP8,
}

#: ``--quantization`` methods -> ``--quant`` (the inverse of the export's names).
QUANTIZATIONS = {name: quant for quant, name in VLLM_QUANTIZATION.items()}

_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


def server_words(text: str) -> list[list[str]]:
    """The words of each server command line in ``text`` (comments and backslash continuations
    read as a shell does; leading ``VAR=value`` words and ``exec`` dropped); ``[]`` when none."""
    joined = re.sub(r"\\\r?\n", " ", text)
    found = []
    for line in joined.splitlines():
        try:
            words = shlex.split(line, comments=True)
        except ValueError:
            continue  # an unbalanced quote: not a line of ours
        while words and (_ASSIGNMENT.match(words[0]) or words[0] == "exec"):
            words = words[1:]
        if _engine_of(words) is not None:
            found.append(words)
    return found


def _engine_of(words: list[str]) -> str | None:
    """``vllm`` or ``sglang`` for a server command's words, else None."""
    if len(words) >= 2 and Path(words[0]).name == "vllm" and words[1] == "serve":
        return "vllm"
    if (
        len(words) >= 3
        and re.fullmatch(r"python[0-9.]*", Path(words[0]).name)
        and words[1:3] == ["-m", "sglang.launch_server"]
    ):
        return "sglang"
    return None


def read_server_command(path: Path, words: list[str]) -> ImportedPlan:
    """The serving plan of one server command line's ``words`` (:func:`server_words`)."""
    engine = _engine_of(words)
    assert engine is not None
    out = ImportedPlan(kind=engine)
    out.updates["method"] = Method.INFERENCE
    out.updates["engine"] = Engine.VLLM if engine == "vllm" else Engine.SGLANG
    rest = words[2:] if engine == "vllm" else words[3:]
    if engine == "vllm" and rest and not rest[0].startswith("-"):
        out.updates["model"], rest = rest[0], rest[1:]  # vllm serve MODEL
    flags = SERVER_FLAGS[engine]
    unknown: list[str] = []
    index = 0
    while index < len(rest):
        word = rest[index]
        index += 1
        name, has_value, value = word.partition("=")
        if not name.startswith("-"):
            unknown.append(word)  # a stray word: said, not refused
            continue
        if not has_value and index < len(rest) and not rest[index].startswith("-"):
            value = rest[index]  # --flag value (a switch is followed by the next flag)
            index += 1
            has_value = "="
        field = flags.get(name)
        if field is None:
            unknown.append(name)
            continue
        if not has_value:
            raise UsageError(f"{path}: {name} needs a value", flag=FLAG)
        out.updates[field] = _value(path, name, field, value)
    out.ignored = unknown
    return out


def _value(path: Path, flag: str, field: str, value: str) -> object:
    """A server flag's value as the plan field's; a usage error names the file and the flag."""
    if field == "model":
        return value
    if field == "kv_dtype":
        if value not in KV_CACHE_DTYPES:
            raise UsageError(
                f"{path}: {flag} {value!r}: hwdash plans auto or fp8 "
                f"({', '.join(KV_CACHE_DTYPES)})",
                flag=FLAG,
            )
        return KV_CACHE_DTYPES[value]
    if field == "quant":
        if value not in QUANTIZATIONS:
            raise UsageError(
                f"{path}: {flag} {value!r}: hwdash plans {', '.join(QUANTIZATIONS)} "
                "(or leave it out: the checkpoint's own)",
                flag=FLAG,
            )
        return QUANTIZATIONS[value]
    try:
        number = float(value) if field == "gpu_memory_utilization" else int(value)
    except ValueError:
        wanted = "a number" if field == "gpu_memory_utilization" else "a whole number"
        raise UsageError(f"{path}: {flag} must be {wanted}, got {value!r}", flag=FLAG) from None
    return number
