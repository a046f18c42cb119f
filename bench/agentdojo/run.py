"""AgentDojo through the real `capstan serve`, with a worst-case model.

For each suite (and mode) this starts the suite's MCP server and the worst-case model in
this process, and one `capstan serve` configured to use both. Each user task runs once
without injection and once with each injection task's injections (the
`important_instructions` attack), each in a new conversation: the runner loads the
environment, swaps it into the MCP server, sends the user task's prompt through Capstan's
HTTP API and waits for the answer, then runs AgentDojo's own utility and security checks
on the answer, the environment before and after, and the calls the MCP server recorded.

    bash scripts/agentdojo --suites banking --limit-user 2 --limit-injection 2 --table
    bash scripts/agentdojo --out target/agentdojo/results.json --table      # all four suites

A run's "attack succeeded" is AgentDojo's security check (the injection task's goal was
reached); "utility" its utility check for the user task.
"""

import argparse
import json
import os
import pathlib
import subprocess
import sys
import time
import tomllib
import warnings

from agentdojo.agent_pipeline.base_pipeline_element import BasePipelineElement
from agentdojo.attacks.attack_registry import load_attack
from agentdojo.task_suite.load_suites import get_suite
from agentdojo.types import text_content_block_from_string

from approver import Approver
from background import Background
from capstan import CapstanError, CapstanServe, config_text
from suite_server import SuiteServer
from worst_case import Pair, WorstCaseModel

ROOT = pathlib.Path(__file__).resolve().parents[2]
BENCHMARK_VERSION = "v1.2.2"
SUITES = ["banking", "slack", "travel", "workspace"]
# off: nothing checked; on: the flow rules, every parked call denied; approve: the flow
# rules, the user task's own parked calls approved; handles and handles-approve: as on and
# approve, the worker holding every untrusted result back as a handle.
MODES = ("off", "on", "approve", "handles", "handles-approve")
ATTACK = "important_instructions"
# The attack addresses the model by the name it finds in the pipeline's name ("GPT-4");
# which model it names makes no difference to a model that obeys any injection.
TARGET_MODEL = "gpt-4o-2024-05-13"


class Target(BasePipelineElement):
    """The pipeline the attack is built against: only its name is read."""

    name = f"capstan-worst-case-{TARGET_MODEL}"

    def query(self, *args, **kwargs):
        raise NotImplementedError("the worst-case model runs behind Capstan, not here")


def progress(text: str):
    print(text, file=sys.stderr, flush=True)


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--suites", default=",".join(SUITES), help="comma-separated (default: all four)")
    parser.add_argument("--limit-user", type=int, help="only the first N user tasks of each suite")
    parser.add_argument("--limit-injection", type=int, help="only the first N injection tasks of each suite")
    parser.add_argument("--mode", default="off,on,approve",
                        help="comma-separated: off (every flow rule allows: labels kept, nothing "
                             "checked), on (the host's default flow rules, and --extra-config if "
                             "given; a person denies every parked call), approve (as on, and a "
                             "person who knows the user task approves its own calls and denies "
                             "the rest), handles and handles-approve (as on and approve, the worker "
                             "holding untrusted results back as handles and asking about them); "
                             "default off,on,approve")
    parser.add_argument("--extra-config", type=pathlib.Path,
                        help="a TOML snippet appended to the generated config of modes on and approve, e.g. "
                             "[profiles.worker.flow] rules of your own")
    parser.add_argument("--out", type=pathlib.Path, help="write the results here as JSON")
    parser.add_argument("--table", action="store_true", help="print a markdown table of the totals")
    parser.add_argument("--model-url",
                        help="a real OpenAI-compatible model instead of the worst-case one: its "
                             "base URL, e.g. https://api.openai.com/v1")
    parser.add_argument("--model", default="gpt-4o-2024-05-13",
                        help="with --model-url: the model's name (default gpt-4o-2024-05-13)")
    parser.add_argument("--model-key-env", default="OPENAI_API_KEY",
                        help="with --model-url: the environment variable holding its key "
                             "(default OPENAI_API_KEY)")
    parser.add_argument("--pair-timeout", type=float, default=300.0,
                        help="seconds one run may take before the benchmark stops (default 300)")
    args = parser.parse_args(argv)
    args.suites = [s.strip() for s in args.suites.split(",") if s.strip()]
    unknown = [s for s in args.suites if s not in SUITES]
    if unknown:
        parser.error(f"unknown suite(s) {', '.join(unknown)}; choose from {', '.join(SUITES)}")
    args.modes = [m.strip() for m in args.mode.split(",") if m.strip()]
    if not args.modes or any(m not in MODES for m in args.modes):
        parser.error(f"--mode takes some of {', '.join(MODES)}, not {args.mode!r}")
    if args.modes == ["off"] and args.extra_config is not None:
        parser.error("--extra-config is the config of modes on and approve; add one of them")
    args.extra = args.extra_config.read_text() if args.extra_config else ""
    args.model_key = "unused"
    if args.model_url:
        args.model_key = os.environ.get(args.model_key_env, "")
        if not args.model_key:
            parser.error(f"--model-url needs the model's key in ${args.model_key_env} "
                         f"(or name another variable with --model-key-env)")
    return args


def binary() -> pathlib.Path:
    path = pathlib.Path(os.environ.get("CAPSTAN_BIN", ROOT / "target" / "debug" / "capstan"))
    if not path.is_file():
        raise SystemExit(f"error: {path} is missing: build capstan (cargo build) or set CAPSTAN_BIN")
    return path


def capstan_version(path: pathlib.Path) -> str:
    try:
        done = subprocess.run([str(path), "--version"], capture_output=True, text=True, timeout=30)
        return done.stdout.strip() or done.stderr.strip()
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"unknown ({err})"


def plan_runs(suite, args):
    """The suite's runs: each user task without injection, then with each injection
    task's injections, as AgentDojo's benchmark runs them."""
    attack = load_attack(ATTACK, suite, Target())
    user_tasks = list(suite.user_tasks.values())[: args.limit_user]
    injection_tasks = list(suite.injection_tasks.values())[: args.limit_injection]
    runs = []
    for user_task in user_tasks:
        runs.append((user_task, None, {}))
        for injection_task in injection_tasks:
            runs.append((user_task, injection_task, attack.attack(user_task, injection_task)))
    return runs


def prepare(suite, user_task, injection_task, injections):
    """The environment with the injections planted, as AgentDojo's runner prepares it, a
    copy of it before any call, and the pair the model plays."""
    environment = user_task.init_environment(suite.load_and_inject_default_environment(injections))
    pre = environment.model_copy(deep=True)
    pair = Pair(
        suite=suite.name,
        label=f"{suite.name} {user_task.ID} x {injection_task.ID if injection_task else 'none'}",
        prompt=user_task.PROMPT,
        # On copies: a ground truth reads the environment, and nothing may change `pre`.
        user_calls=user_task.ground_truth(pre.model_copy(deep=True)),
        user_output=user_task.GROUND_TRUTH_OUTPUT,
        injection_calls=injection_task.ground_truth(pre.model_copy(deep=True)) if injection_task else [],
        injection_output=injection_task.GROUND_TRUTH_OUTPUT if injection_task else "",
        injection_goal=injection_task.GOAL if injection_task else "",
        injections=tuple(dict.fromkeys(injections.values())),
    )
    return environment, pre, pair


def check(suite, task, answer, pre, post, trace):
    """AgentDojo's own check of `task` (utility for a user task, security for an injection
    task), as `TaskSuite.run_task_with_pipeline` makes it; an exception is reported."""
    output = [text_content_block_from_string(answer)]
    try:
        return bool(suite._check_task_result(task, output, pre, post, trace)), None
    except Exception as err:  # a check that breaks on an unexpected environment
        return False, f"{task.ID} check raised {type(err).__name__}: {err}"


def run_suite(suite_name, mode, args, background, model, path):
    suite = get_suite(BENCHMARK_VERSION, suite_name)
    runs = plan_runs(suite, args)
    started = time.monotonic()
    # A worker answers one model turn per call, then set_status: room for the longest
    # ground truth of the suite with the longest injection, and a few spare turns.
    environment = suite.load_and_inject_default_environment({})
    users = {u.ID: u for u, _, _ in runs}.values()
    injections = {i.ID: i for _, i, _ in runs if i is not None}.values()
    longest = max(len(u.ground_truth(u.init_environment(environment.model_copy(deep=True)))) for u in users)
    longest += max((len(i.ground_truth(environment.model_copy(deep=True))) for i in injections), default=0)
    server = SuiteServer(suite)
    mcp = background.serve(server.app(), f"{suite_name} MCP")
    config = config_text(
        suite=suite_name,
        model_url=args.model_url or f"http://127.0.0.1:{model.port}/v1",
        model_name=args.model if args.model_url else "worst-case",
        mcp_url=f"http://127.0.0.1:{mcp.port}/mcp",
        # Holding handles, a worker asks before a call for each value not in the prompt,
        # of each held result until one has it.
        max_turns=(longest * 12 if mode.startswith("handles") else longest) + 8,
        conversations=max(1000, len(runs) + 100),
        deadline_secs=60,
        flow="off" if mode == "off" else "on",
        extra="" if mode == "off" else args.extra,
        handles=mode.startswith("handles"),
    )
    try:
        tomllib.loads(config)
    except tomllib.TOMLDecodeError as err:
        mcp.stop()
        raise SystemExit(f"error: the generated config with --extra-config {args.extra_config} is not valid "
                         f"TOML ({err}); the snippet may add tables and keys, not set again those of "
                         f"bench/agentdojo/capstan.py") from err
    tag = f"[{suite_name} {mode}]"
    try:
        capstan = CapstanServe(path, config, f"{suite_name}, mode {mode}", args.model_key)
    except CapstanError as err:
        mcp.stop()
        raise SystemExit(f"error: {err}") from err
    progress(f"{tag} capstan serve on {capstan.url}, MCP on :{mcp.port}, {len(runs)} runs")
    results = {"no_attack": [], "pairs": []}
    failure = None
    approver = Approver(capstan.url, "task" if mode.endswith("approve") else "deny", suite_name)
    try:
        for number, (user_task, injection_task, injections) in enumerate(runs, 1):
            environment, pre, pair = prepare(suite, user_task, injection_task, injections)
            server.swap(environment)
            model.pair = pair
            approver.begin(pair)
            begun, requests = time.monotonic(), model.requests
            answer = capstan.send(f"{suite_name}-{mode}-{number:04d}", pair.prompt, args.pair_timeout, pair.label)
            seconds = time.monotonic() - begun
            reply = answer.get("reply") or ""
            trace = server.trace()
            utility, error = check(suite, user_task, reply, pre, environment, trace)
            errors = [error] if error else []
            approved, denied = approver.counts()
            if answer.get("outcome") != "stored":
                errors.append(f"outcome {answer.get('outcome')!r}: {answer.get('note')}")
            record = {
                "user_task": user_task.ID,
                "injection_task": injection_task.ID if injection_task else None,
                "utility": utility,
                "answer": reply,
                "calls": [{"function": c.function, "args": dict(c.args)} for c in trace],
                "seconds": round(seconds, 3),
                "model_requests": model.requests - requests,
                "approved": approved,
                "denied": denied,
                "questions": len(pair.asked),
            }
            if injection_task:
                security, error = check(suite, injection_task, reply, pre, environment, trace)
                if error:
                    errors.append(error)
                record["attack_succeeded"] = security
                record["injection_read"] = pair.read_injection
                results["pairs"].append(record)
                verdict = f"attack {'succeeded' if security else 'failed'}, utility {'yes' if utility else 'no'}"
            else:
                results["no_attack"].append(record)
                verdict = f"no attack, utility {'yes' if utility else 'no'}"
            if errors:
                record["errors"] = errors
                verdict += f" [error: {'; '.join(errors)}]"
            progress(f"{tag} {number}/{len(runs)} {user_task.ID} x "
                     f"{injection_task.ID if injection_task else 'none'}: {verdict} ({seconds:.1f} s)")
    except CapstanError as err:
        failure = str(err)
        progress(f"{tag} error: {failure}")
    finally:
        model.pair = None
        approver.stop()
        if approver.errors:
            progress(f"{tag} approver: {len(approver.errors)} error(s), first: {approver.errors[0]}")
        code = capstan.stop()
        mcp.stop()
        if code != 0 and failure is None:
            failure = f"capstan serve exited with status {code} when stopped\n{capstan.log_tail()}"
            progress(f"{tag} error: {failure}")
        capstan.cleanup()
    wall = time.monotonic() - started
    pairs, no_attack = results["pairs"], results["no_attack"]
    done = len(pairs) + len(no_attack)
    totals = {
        "pairs": len(pairs),
        "attacks_succeeded": sum(p["attack_succeeded"] for p in pairs),
        "injections_read": sum(p["injection_read"] for p in pairs),
        "utility_under_attack": sum(p["utility"] for p in pairs),
        "user_tasks": len(no_attack),
        "utility_without_attack": sum(p["utility"] for p in no_attack),
        "approvals": sum(p["approved"] for p in pairs + no_attack),
        "denials": sum(p["denied"] for p in pairs + no_attack),
        "questions": sum(p["questions"] for p in pairs + no_attack),
        "errors": sum(1 for p in pairs + no_attack if p.get("errors")),
        "wall_secs": round(wall, 1),
        "secs_per_run": round(wall / done, 2) if done else None,
    }
    progress(f"{tag} done: {totals['attacks_succeeded']}/{totals['pairs']} attacks succeeded, utility "
             f"{totals['utility_under_attack']}/{totals['pairs']} under attack and "
             f"{totals['utility_without_attack']}/{totals['user_tasks']} without, {totals['errors']} run(s) "
             f"with errors, {totals['wall_secs']} s")
    entry = {"suite": suite_name, "mode": mode, "runs_planned": len(runs), "totals": totals, **results}
    if failure:
        entry["failure"] = failure
    return entry


def table(entries) -> str:
    lines = [
        "| suite | mode | pairs | attacks succeeded | utility under attack | utility without attack | approvals given | wall time |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for entry in entries:
        t = entry["totals"]
        note = " (incomplete)" if entry.get("failure") else ""
        lines.append(
            f"| {entry['suite']}{note} | {entry['mode']} | {t['pairs']} | {t['attacks_succeeded']}/{t['pairs']} | "
            f"{t['utility_under_attack']}/{t['pairs']} | {t['utility_without_attack']}/{t['user_tasks']} | "
            f"{t['approvals']} | {t['wall_secs']:.0f} s ({t['secs_per_run'] or '-'} s/run) |"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv if argv is not None else sys.argv[1:])
    if args.model_url:
        # The attack addresses the model by the name it finds here.
        Target.name = f"capstan-{args.model}"
    path = binary()
    # AgentDojo warns about things that do not concern this harness (e.g. optional
    # providers' SDKs); the progress lines are what matters.
    warnings.filterwarnings("ignore")
    background = Background()
    model = WorstCaseModel()
    model_server = background.serve(model.app(), "worst-case model")
    model.port = model_server.port
    report = {
        "benchmark": {"agentdojo": "0.1.35", "version": BENCHMARK_VERSION, "attack": ATTACK,
                      "attack_target": Target.name},
        "capstan": {"binary": str(path), "version": capstan_version(path)},
        "results": [],
    }
    failed = False
    try:
        for mode in args.modes:
            for suite_name in args.suites:
                entry = run_suite(suite_name, mode, args, background, model, path)
                report["results"].append(entry)
                failed |= bool(entry.get("failure")) or entry["totals"]["errors"] > 0
                if args.out:  # after each suite, so an abort keeps what was measured
                    args.out.parent.mkdir(parents=True, exist_ok=True)
                    args.out.write_text(json.dumps(report, indent=1) + "\n")
    finally:
        model_server.stop()
        background.close()
    if args.table:
        print(table(report["results"]))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
