"""`ddplab kernels` argument parsing and the `check` self-test."""

import argparse

from ddplab.kernels import available_impls
from ddplab.kernels.cli import add_parser, cmd_bench, cmd_check, main


def test_add_parser_hooks_into_any_subparsers():
    parser = argparse.ArgumentParser(prog="ddplab")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["kernels", "bench", "--quick", "--repeats", "4", "--device", "cpu"])
    assert args.func is cmd_bench and args.quick and args.repeats == 4 and args.device == "cpu"
    assert parser.parse_args(["kernels", "check"]).func is cmd_check


def test_check_reports_every_implementation(capsys):
    assert main(["check", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    for name in (
        "rgb_to_gray[python_loop]",
        "rgb_to_gray[torch]",
        "rgb_to_gray[triton]",
        "rgb_to_gray[cuda]",
        "conv_relu[reference]",
        "conv_relu[triton]",
        "fuse_conv_relu",
    ):
        assert name in out
    assert "FAILED" not in out and "0 failed" in out


def test_available_impls_names_reasons():
    status = available_impls("cpu")
    assert status["rgb_to_gray"]["torch"] is None and status["conv_relu"]["reference"] is None
    assert "CUDA" in status["rgb_to_gray"]["cuda"]
