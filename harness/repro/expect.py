"""What a finding's script holds of the failing run: the constants every script has (``script_data``: the setting, the
shrunk workload, the CPU flags the finding needs, and the check), then its engine's own (``script``: its writer's
``data``). The check is taken from the harness's own judgement of the failing run on the shrunk workload: the passes
the check failed in and the requested lengths, then what the failing oracle's declaration says its script needs
(``Oracle.script``: the tie and logprob tolerances the oracles used, the cached tokens the engine's cache rule allows,
the accept-length bounds, the prompt tokens a PD decode side computes itself). Plain values: the script carries them
as they are."""
from __future__ import annotations

from harness import oracles
from harness.repro.finding import Reproducer, ReproError
from harness.run.judge import pass_views
from harness.sut.script.writer import NoScript, ScriptInputs, ScriptWriter

#: the passes a script serves (isolation passes and the requests alone are the harness's).
SCRIPT_PASSES = ("cold", "warm")


def check_spec(repro: Reproducer) -> dict:
    """``CHECK`` of ``repro``'s script (``harness.sut.script.checks``): the common keys, then what the failing
    check's oracle declares its script needs (``Oracle.script``)."""
    check, workload = repro.check, repro.shrunk.workload
    passes = [p for p in dict.fromkeys(f.get("pass") for f in check.findings(repro.failing)) if p in SCRIPT_PASSES]
    spec: dict = {"oracle": check.oracle, "check": check.check, "passes": passes or list(SCRIPT_PASSES),
                  "requested": {r.rid: r.max_new_tokens for r in workload.requests}}
    run = repro.failing.run
    if run is None:  # the run raised: the error check needs nothing more
        return spec
    declared = oracles.oracles().get(check.oracle)
    if declared is not None and declared.script is not None:
        spec.update(declared.script(pass_views(run, {}, repro.plan.tolerances), spec["passes"]))
    return spec


def script_data(repro: Reproducer) -> dict:
    """What every script's constants hold, as plain values: ``setting``, ``rounds`` (the shrunk workload), ``check``
    and the CPU flags the finding needs (``needs_cpu``); a writer adds its engine's own."""
    toggle = repro.toggle
    rounds = [[[r.rid, list(r.prompt), r.max_new_tokens, r.priority] for r in group]
              for group in repro.shrunk.workload.rounds()]
    return {"setting": f"{toggle.factor}={toggle.level}", "rounds": rounds, "check": check_spec(repro),
            "needs_cpu": repro.needs_cpu}


def script(repro: Reproducer, writer: ScriptWriter) -> dict:
    """A finding's script data: ``script_data``, then what ``writer`` takes of the finding for its engine (its
    ``data``, from plain inputs); ``ReproError`` with the writer's message where it cannot write the script."""
    inputs = ScriptInputs(repro.shrunk.workload, repro.plan.levels, repro.toggled_levels, repro.plan.engine_args,
                          repro.plan.faults, repro.device)
    try:
        return {**script_data(repro), **writer.data(inputs)}
    except NoScript as exc:
        raise ReproError(str(exc)) from None
