"""The `polar` command. Each subcommand lives with the package it drives; this file only routes."""

from __future__ import annotations

import argparse
import sys


def _proxy(argv: list[str]) -> int:
    from polar_env.proxy import serve

    parser = argparse.ArgumentParser(prog="polar proxy", description="The token-capturing proxy.")
    sub = parser.add_subparsers(dest="action", required=True)
    serve_parser = sub.add_parser(
        "serve", help="run the proxy standalone against any backend",
        description="Serve OpenAI Chat Completions, OpenAI Responses and Anthropic Messages at "
                    "/s/<session>/v1/... in front of an inference backend, recording every call token by "
                    "token. Create sessions with POST /admin/sessions (Bearer admin secret); each "
                    "harness then uses its session key as its API key.")
    serve.add_arguments(serve_parser)
    args = parser.parse_args(argv)
    return serve.serve_main(args)


def _check(argv: list[str]) -> int:
    from polar_env.trajectory.check_cli import check_main

    return check_main(argv)


def _doctor(argv: list[str]) -> int:
    from polar_env.harness_adapters.doctor import doctor_main

    return doctor_main(argv)


def _eval(argv: list[str]) -> int:
    from polar_env.rewards.eval_cli import eval_main

    return eval_main(argv)


def _rollout(argv: list[str]) -> int:
    from polar_env.rollout import rollout_main

    return rollout_main(argv)


def _demo(argv: list[str]) -> int:
    from polar_env.demo import demo_main

    return demo_main(argv)


def _view(argv: list[str]) -> int:
    from polar_env.viewer.view_cli import view_main

    return view_main(argv)


COMMANDS = {
    "demo": (_demo, "the whole pipeline on the embedded default: harness, sandbox, proxy, model, grading"),
    "proxy": (_proxy, "run the token-capturing proxy (polar proxy serve --help)"),
    "check": (_check, "check trajectories / NeMo-RL results / GRPO batches (contract, groups, fidelity)"),
    "doctor": (_doctor, "report installed harnesses and sandboxes and how to fix what is missing"),
    "rollout": (_rollout, "K rollouts per task with a real harness in sandboxes, through the proxy, graded"),
    "eval": (_eval, "grade SWE-bench predictions on bundled, Verified or custom tasks"),
    "view": (_view, "write (or serve) the HTML page of trajectories: tokens by loss mask, logprobs, grading"),
    "bench": (lambda argv: __import__("polar_env.bench.bench_cli", fromlist=["x"]).bench_main(argv),
              "measure the proxy against direct and LiteLLM; write docs/benchmarks.md"),
    "policy-server": (lambda argv: __import__("polar_env.agent_server.policy_server", fromlist=["x"]).main(argv),
                      "a local stand-in policy server (vLLM /v1/completions wire) for NeMo Gym runs"),
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        print("usage: polar COMMAND [ARGS]\n\ncommands:")
        for name, (_, help_text) in COMMANDS.items():
            print(f"  {name:10s} {help_text}")
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    handler, _ = COMMANDS[argv[0]]
    return handler(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
