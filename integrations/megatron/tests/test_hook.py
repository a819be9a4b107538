"""The hook in one process: Megatron's own parser accepts ``--moe-flex-dispatcher-backend uccl``
and the ``--uccl-*`` flags, bad combinations fail with errors that name the flag, the version
pin is enforced, and uninstall restores Megatron exactly."""

from __future__ import annotations

import sys

import pytest

from uccl_ep.errors import InvalidArgument, Unsupported

FLEX_UCCL = ["--moe-token-dispatcher-type", "flex", "--moe-flex-dispatcher-backend", "uccl"]


def parse(argv):
    from megatron.training import arguments

    saved = sys.argv
    sys.argv = ["pretrain_gpt.py", *argv]
    try:
        return arguments.parse_args()
    finally:
        sys.argv = saved


def backend_choices():
    import argparse

    from megatron.training import arguments

    parser = arguments.add_megatron_arguments(argparse.ArgumentParser())
    action = next(a for a in parser._actions if a.dest == "moe_flex_dispatcher_backend")
    return tuple(action.choices), parser


def test_choices_before_and_after_install_and_uninstall(hook, capsys):
    choices, parser = backend_choices()
    assert choices[-1] == "uccl" and {"deepep", "hybridep", "ncclep"} <= set(choices)
    assert any(a.dest == "uccl_timeout_s" for a in parser._actions)
    # NOTES: parser.format_help() itself raises in megatron-core 0.19.2 (a '%' in the help of
    # --moe-paged-stash-buffer-size-factor-cuda), so the help text of our own group is checked.
    group = next(g for g in parser._action_groups if g.title == "uccl-ep")
    assert {a.dest for a in group._group_actions} >= {"uccl_backend", "uccl_timeout_s", "uccl_num_sms"}
    for action in group._group_actions:
        parser._get_formatter()._expand_help(action)
    hook.uninstall()
    choices, parser = backend_choices()
    assert "uccl" not in choices and not any(a.dest.startswith("uccl_") for a in parser._actions)
    with pytest.raises(SystemExit):
        parse(FLEX_UCCL)
    assert "invalid choice: 'uccl'" in capsys.readouterr().err
    hook.install()
    assert parse(FLEX_UCCL).moe_flex_dispatcher_backend == "uccl"


def test_real_argv_reaches_settings(hook):
    args = parse(FLEX_UCCL + ["--uccl-backend", "reference", "--uccl-timeout-s", "12.5", "--uccl-gpu-timeout-s", "7",
                              "--uccl-ranks-per-node", "1", "--uccl-num-sms", "24"])
    assert args.moe_token_dispatcher_type == "flex" and args.moe_flex_dispatcher_backend == "uccl"
    assert args.moe_flex_dispatcher_num_sms == 24
    assert hook.current().buffer_kwargs() == {"backend": "reference", "timeout_s": 12.5, "gpu_timeout_s": 7.0,
                                              "ranks_per_node": 1}


def test_overlap_flag_accepted_and_uninstall_restores_the_schedule(hook):
    from megatron.core.models.common import fine_grained_callables as common_callables
    from megatron.core.models.common import utils as common_utils
    from megatron.core.models.gpt import fine_grained_callables as gpt_callables

    assert parse(FLEX_UCCL + ["--overlap-moe-expert-parallel-comm"]).overlap_moe_expert_parallel_comm is True
    wrapped = (gpt_callables.build_transformer_layer_callables, common_utils.should_free_input)
    hook.uninstall()
    originals = (gpt_callables.build_transformer_layer_callables, common_utils.should_free_input)
    assert all(w.__wrapped__ is o for w, o in zip(wrapped, originals))
    assert common_callables.build_transformer_layer_callables is originals[0]
    hook.install()


def test_default_backend_untouched(hook):
    args = parse(["--moe-token-dispatcher-type", "alltoall"])
    assert args.moe_flex_dispatcher_backend == "deepep"
    assert hook.current().buffer_kwargs() == {}


@pytest.mark.parametrize("argv,error,flag,words", [
    (["--moe-token-dispatcher-type", "alltoall", "--moe-flex-dispatcher-backend", "uccl"], InvalidArgument,
     "--moe-token-dispatcher-type", "'flex'"),
    (["--moe-token-dispatcher-type", "flex", "--uccl-timeout-s", "5"], InvalidArgument, "--uccl-timeout-s",
     "--moe-flex-dispatcher-backend deepep"),
    (FLEX_UCCL + ["--uccl-num-sms", "24", "--moe-flex-dispatcher-num-sms", "32"], InvalidArgument, "--uccl-num-sms",
     "(32)"),
    (FLEX_UCCL + ["--moe-flex-dispatcher-num-sms", "7"], InvalidArgument, "--moe-flex-dispatcher-num-sms", "even"),
    (FLEX_UCCL + ["--moe-enable-deepep"], InvalidArgument, "--moe-enable-deepep", "deepep backend"),
    (FLEX_UCCL + ["--moe-expert-capacity-factor", "1.0", "--moe-pad-expert-input-to-capacity"], Unsupported,
     "--moe-pad-expert-input-to-capacity", "not supported"),
])
def test_flag_combination_errors_name_the_flag(hook, argv, error, flag, words):
    with pytest.raises(error) as info:
        parse(argv)
    message = str(info.value)
    assert flag in message and words in message, message
    if error is InvalidArgument:
        assert info.value.argument == flag


@pytest.mark.parametrize("argv,words", [
    (["--uccl-num-sms", "3"], "even int >= 2"),
    (["--uccl-timeout-s", "-1"], "positive"),
    (["--uccl-timeout-s", "soon"], "positive number of seconds"),
    (["--uccl-backend", "nccl"], "invalid choice"),
    (["--uccl-ranks-per-node", "-2"], "int >= 0"),
])
def test_bad_flag_values_are_argparse_errors(hook, capsys, argv, words):
    with pytest.raises(SystemExit) as info:
        parse(FLEX_UCCL + argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert argv[0] in err and words in err, err


def test_transformer_config_checks_for_api_users(hook):
    from megatron.core.transformer.transformer_config import TransformerConfig

    base = dict(num_layers=1, hidden_size=16, num_attention_heads=4, num_moe_experts=4, moe_router_topk=2,
                use_cpu_initialization=True)
    cfg = TransformerConfig(**base, moe_token_dispatcher_type="flex", moe_flex_dispatcher_backend="uccl")
    assert cfg.moe_flex_dispatcher_backend == "uccl"
    with pytest.raises(InvalidArgument) as info:
        TransformerConfig(**base, moe_token_dispatcher_type="alltoall", moe_flex_dispatcher_backend="uccl")
    assert info.value.argument == "moe_token_dispatcher_type"
    with pytest.raises(InvalidArgument, match="moe_flex_dispatcher_num_sms"):
        TransformerConfig(**base, moe_token_dispatcher_type="flex", moe_flex_dispatcher_backend="uccl",
                          moe_flex_dispatcher_num_sms=5)


def test_settings_api_validates():
    from uccl_ep_megatron import settings

    try:
        assert settings.configure(timeout_s=3).timeout_s == 3
        with pytest.raises(InvalidArgument, match="timeout_s"):
            settings.configure(timeout_s=0)
        with pytest.raises(InvalidArgument, match="backend"):
            settings.configure(backend="gpu")
        with pytest.raises(InvalidArgument, match="retries"):
            settings.configure(retries=2)
    finally:
        settings.reset()


def test_version_window_warns_not_refuses(monkeypatch):
    import logging

    import uccl_ep_megatron
    from megatron.core import package_info
    from uccl_ep import log
    from uccl_ep_megatron.versions import check_megatron_core_version

    records = []
    handler = logging.Handler()
    handler.emit = lambda r: records.append(r.getMessage()) if r.levelno >= logging.WARNING else None
    logging.getLogger("uccl_ep.megatron").addHandler(handler)
    try:
        log.reset_warn_once()
        assert check_megatron_core_version() == (0, 19, 2) and records == []
        uccl_ep_megatron.uninstall()
        monkeypatch.setattr(package_info, "MINOR", 21)
        uccl_ep_megatron.install()  # outside the window: installs, with one warning
        assert uccl_ep_megatron.is_installed()
        assert len(records) == 1 and "0.21.2" in records[0] and "0.19.0..0.19.2" in records[0]
    finally:
        logging.getLogger("uccl_ep.megatron").removeHandler(handler)

