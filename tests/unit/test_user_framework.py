"""A user catalog's [[framework]] entry is what the planner uses, everywhere it reads savers.

The catalog is extendable: an entry with the id of a packaged framework replaces it. Before, the
command line applied a user entry's precision and optimizer defaults while the estimate, the
make-it-fit search, the printed savers line and the exports read the packaged frameworks.toml.
The user entry below makes torchtune behave like plain Hugging Face for a LoRA plan (standard fp32
loss, fp32 adapters), so its estimate must equal the packaged ``hf`` one.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from hwdash.cli import main
from hwdash.core.catalog import Catalog, load_catalog
from hwdash.core.plan import Framework, Method, Plan
from hwdash.core.planning.fit import evaluate_plan
from hwdash.core.planning.fit_options import find_fit_options
from hwdash.core.plans.exports import export_text

USER_TORCHTUNE = """
[[framework]]
id = "torchtune"
name = "torchtune, our fork"
loss = "standard"
adapter_dtype = "fp32"
qlora_frozen_dtype = "fp32"
[framework.sources]
loss = "our fork's recipes: plain cross-entropy"
adapter_dtype = "our fork's recipes: fp32 adapters"
qlora_frozen_dtype = "our fork's recipes: fp32 extras"
"""

USER_HF_COMPILED = """
[[framework]]
id = "hf"
name = "Hugging Face, compiled"
compile = true
[framework.sources]
compile = "our training script sets torch_compile=True"
"""

#: LoRA on an 8B model that fits an L4 with torchtune's chunked loss and bf16 adapters, and is
#: tight (under 10% headroom) with the standard loss and fp32 adapters.
PLAN = Plan(
    model="llama-3.1-8b",
    method=Method.LORA,
    framework=Framework.TORCHTUNE,
    batch=1,
    seq=2048,
    grad_ckpt=True,
)


pytestmark = pytest.mark.usefixtures("isolated_home")


def _user_catalog(tmp_path: Path, text: str) -> tuple[Path, Catalog]:
    folder = tmp_path / "catalog"
    folder.mkdir()
    (folder / "frameworks.toml").write_text(text)
    return folder, load_catalog(include_user=False, extra_dirs=[folder])


@pytest.fixture(scope="module")
def packaged() -> Catalog:
    return load_catalog(include_user=False)


def test_the_estimate_and_the_flavor_verdicts_use_the_user_entry(
    tmp_path: Path, packaged: Catalog
) -> None:
    _folder, user = _user_catalog(tmp_path, USER_TORCHTUNE)
    ours = evaluate_plan(PLAN, user)
    theirs = evaluate_plan(PLAN, packaged)
    as_hf = evaluate_plan(PLAN.with_changes({"framework": Framework.HF}), packaged)
    assert ours.framework is user.frameworks["torchtune"]
    assert ours.estimate.per_gpu == as_hf.estimate.per_gpu
    assert ours.estimate.per_gpu.total > theirs.estimate.per_gpu.total
    verdicts = {fit.flavor.id: fit.verdict.value for fit in ours.flavors}
    assert verdicts["l4x1"] == "tight"
    assert {fit.flavor.id: fit.verdict.value for fit in theirs.flavors}["l4x1"] == "fits"


def test_make_it_fit_searches_from_the_user_entry(tmp_path: Path, packaged: Catalog) -> None:
    _folder, user = _user_catalog(tmp_path, USER_TORCHTUNE)
    flavor = user.flavors["l4x1"]
    model = user.models[PLAN.model]
    assert find_fit_options(PLAN, model, packaged, flavor.id, [flavor]).fits_already
    search = find_fit_options(PLAN, model, user, flavor.id, [flavor])
    assert not search.fits_already
    # the user's standard loss is a saver to turn (torchtune's packaged loss is chunked already)
    loss_changes = [
        change for option in search.options for change in option.changes if change.field == "loss"
    ]
    assert loss_changes and all(change.old is None for change in loss_changes)
    assert {change.new for change in loss_changes} <= {"chunked", "fused-linear"}


def test_the_suggested_command_keeps_the_catalog_and_fits(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder, _user = _user_catalog(tmp_path, USER_TORCHTUNE)
    argv = ["plan", "--model", "llama-3.1-8b", "--method", "lora", "--framework", "torchtune"]
    argv += ["--seq", "2048", "--grad-ckpt", "--catalog", str(folder)]
    assert main([*argv, "--fit", "l4x1"]) == 0
    (line,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith("try: ")]
    suggested = shlex.split(line)[2:]  # after "try: hwdash"
    assert suggested[-2:] == ["--catalog", str(folder)]
    assert main([*suggested, "--flavor", "l4x1", "--json"]) == 0
    (l4,) = json.loads(capsys.readouterr().out)["flavors"]
    assert (l4["id"], l4["fit"]) == ("l4x1", "fits")
    # --json: every option's args end with the same folder
    assert main([*argv, "--fit", "l4x1", "--json"]) == 0
    options = json.loads(capsys.readouterr().out)["fit"]["options"]
    assert options and all(o["args"][-2:] == ["--catalog", str(folder)] for o in options)


def test_the_printed_savers_line_names_the_user_entry_s_loss(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder, _user = _user_catalog(tmp_path, USER_TORCHTUNE)
    argv = ["plan", "--model", "llama-3.1-8b", "--method", "lora", "--framework", "torchtune"]
    assert main([*argv, "--catalog", str(folder)]) == 0
    assert "framework torchtune: loss standard" in capsys.readouterr().out
    assert main(argv) == 0
    assert "framework torchtune: loss chunked" in capsys.readouterr().out


def test_the_trainer_export_carries_the_user_entry_s_compile(
    tmp_path: Path, packaged: Catalog
) -> None:
    _folder, user = _user_catalog(tmp_path, USER_HF_COMPILED)
    plan = PLAN.with_changes({"framework": Framework.HF})
    snippet, _notes = export_text("trainer", evaluate_plan(plan, user), user)
    assert "torch_compile" in snippet
    plain, _notes = export_text("trainer", evaluate_plan(plan, packaged), packaged)
    assert "torch_compile" not in plain
